"""The critical path's steps as a table."""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, DataTable

from crux_dask.dashboard.component import Component
from crux_dask.dashboard.data import GraphView, Source
from crux_dask.dashboard.datatables import table_columns
from crux_dask.dashboard.pieces import text

COLUMNS = ("step", "via", "kind", "key", "source", "destination", "busy", "io", "client",
           "report", "scheduler", "rescheduled", "dispatch", "worker", "scheduling", "queued",
           "wait", "scope")
TEXT = ("via", "kind", "key", "source", "destination")


def steps_columns(view: GraphView) -> dict[str, Any]:
    """The path's steps, as numpy arrays: numbers go to the browser in binary, text as
    one list (see :mod:`.pieces`), not one JSON value at a time."""
    steps = view.wcp().to_frame()
    scope = (steps["in_scope"].map({True: "this", False: "another"}) if "in_scope" in steps
             else [""] * len(steps))
    return {**{c: text(steps[c]) if c in TEXT else steps[c].to_numpy()
               for c in COLUMNS[:-1]}, "scope": text(scope)}


class StepsTable(Component):
    """One row per step of the critical path selected.

    On the path of one computation or span, ``scope`` says ``another`` for a
    step through a task of another one (data it persisted, a thread it held).
    """

    computer = staticmethod(steps_columns)

    def __init__(self, data: Source, **kwargs: Any) -> None:
        super().__init__(data)
        self.source = ColumnDataSource({c: [] for c in COLUMNS})
        self.root = DataTable(source=self.source, name="crux-steps", index_position=None,
                              height=300, columns=table_columns(
            ("step", "#", 30), ("via", "released by", 70), ("kind", "kind", 80),
            ("key", "key", 260), ("source", "from", 180), ("destination", "to", 180),
            ("busy", "busy (s)", 70, "0.000"), ("io", "io (s)", 60, "0.000"),
            ("client", "client (s)", 70, "0.000"), ("report", "report (s)", 70, "0.000"),
            ("scheduler", "scheduler (s)", 80, "0.000"),
            ("rescheduled", "rescheduled (s)", 85, "0.000"),
            ("dispatch", "dispatch (s)", 75, "0.000"), ("worker", "worker (s)", 70, "0.000"),
            ("scheduling", "scheduling (s)", 80, "0.000"),
            ("queued", "queued (s)", 70, "0.000"), ("wait", "wait (s)", 70, "0.000"),
            ("scope", "scope", 70)), **kwargs)
