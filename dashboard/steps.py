"""The critical path's steps as a table."""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, DataTable, NumberFormatter, TableColumn

from crux_dask.dashboard.data import Component, GraphView, Source
from crux_dask.dashboard.pieces import text

COLUMNS = ("step", "via", "kind", "key", "source", "destination", "busy", "io", "client",
           "scheduling", "rescheduled", "queued", "wait", "scope")
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
        seconds = NumberFormatter(format="0.000")
        self.root = DataTable(source=self.source, name="crux-steps", index_position=None,
                              height=300, columns=[
            TableColumn(field="step", title="#", width=30),
            TableColumn(field="via", title="released by", width=70),
            TableColumn(field="kind", title="kind", width=80),
            TableColumn(field="key", title="key", width=260),
            TableColumn(field="source", title="from", width=180),
            TableColumn(field="destination", title="to", width=180),
            TableColumn(field="busy", title="busy (s)", formatter=seconds, width=70),
            TableColumn(field="io", title="io (s)", formatter=seconds, width=60),
            TableColumn(field="client", title="client (s)", formatter=seconds, width=70),
            TableColumn(field="scheduling", title="scheduling (s)", formatter=seconds,
                        width=80),
            TableColumn(field="rescheduled", title="rescheduled (s)", formatter=seconds,
                        width=85),
            TableColumn(field="queued", title="queued (s)", formatter=seconds, width=70),
            TableColumn(field="wait", title="wait (s)", formatter=seconds, width=70),
            TableColumn(field="scope", title="scope", width=70),
        ], **kwargs)
