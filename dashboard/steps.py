"""The critical path's steps as a table; a step's text, hovered, shows the code behind
its task group."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, DataTable, HTMLTemplateFormatter, StringFormatter
from distributed.utils import key_split_group

from crux_dask.dashboard.component import Component
from crux_dask.dashboard.data import GraphView, Source
from crux_dask.dashboard.datatables import table_columns
from crux_dask.dashboard.pieces import text
from crux_dask.dashboard.prefixes import function_log

COLUMNS = ("step", "via", "kind", "key", "source", "destination", "busy", "io", "client",
           "report", "scheduler", "rescheduled", "dispatch", "worker", "scheduling", "queued",
           "wait", "scope", "key_group")
TEXT = ("via", "kind", "key", "source", "destination")


def steps_columns(view: GraphView) -> dict[str, Any]:
    """The path's steps, as numpy arrays: numbers go to the browser in binary, text as
    one list (see :mod:`.pieces`), not one JSON value at a time.  ``key_group`` is the
    task group of each step's key."""
    steps = view.wcp().to_frame()
    scope = (steps["in_scope"].map({True: "this", False: "another"}) if "in_scope" in steps
             else [""] * len(steps))
    keys, at = np.unique(steps["key"].to_numpy(dtype=str), return_inverse=True)
    groups = np.asarray([key_split_group(key) for key in keys.tolist()], dtype=str)
    return {**{c: text(steps[c]) if c in TEXT else steps[c].to_numpy()
               for c in COLUMNS[:-2]}, "scope": text(scope),
            "key_group": groups[at.reshape(-1)] if len(keys) else text([])}


def hover_template(codes: dict[str, str]) -> str:
    """The template of the steps' text cells: the cell's text, and as its title (shown
    when hovered) the code of its row's ``key_group`` in ``codes``."""
    table = json.dumps(codes).replace("%", "\\u0025")  # no "%>" ends the template's code
    return (f"<% var code = {table}[key_group] || ''; %>"
            "<span title=\"<%- code %>\"><%- value %></span>")


class StepsTable(Component):
    """One row per step of the critical path selected.

    On the path of one computation or span, ``scope`` says ``another`` for a
    step through a task of another one (data it persisted, a thread it held).
    A step's text, hovered, shows the code behind its key's task group
    (:meth:`~crux_dask.functions.FunctionLog.group_label`), where the view has a
    function table.
    """

    computer = staticmethod(steps_columns)

    def __init__(self, data: Source, **kwargs: Any) -> None:
        super().__init__(data)
        self.source = ColumnDataSource({c: [] for c in COLUMNS})
        columns = table_columns(
            ("step", "#", 30), ("via", "released by", 70), ("kind", "kind", 80),
            ("key", "key", 260), ("source", "from", 180), ("destination", "to", 180),
            ("busy", "busy (s)", 70, "0.000"), ("io", "io (s)", 60, "0.000"),
            ("client", "client (s)", 70, "0.000"), ("report", "report (s)", 70, "0.000"),
            ("scheduler", "scheduler (s)", 80, "0.000"),
            ("rescheduled", "rescheduled (s)", 85, "0.000"),
            ("dispatch", "dispatch (s)", 75, "0.000"), ("worker", "worker (s)", 70, "0.000"),
            ("scheduling", "scheduling (s)", 80, "0.000"),
            ("queued", "queued (s)", 70, "0.000"), ("wait", "wait (s)", 70, "0.000"),
            ("scope", "scope", 70))
        #: The formatter of every text column (one model, as the table's other formats).
        self.hover = HTMLTemplateFormatter(template=hover_template({}))
        for column in columns:
            if type(column.formatter) is StringFormatter:  # a NumberFormatter is one too
                column.formatter = self.hover
        self.root = DataTable(source=self.source, name="crux-steps", index_position=None,
                              height=300, columns=columns, **kwargs)

    def show(self, computed: dict[str, Any]) -> None:
        log = function_log(self.data())
        codes = {} if log is None else {
            group: label for group in np.unique(computed["key_group"]).tolist()
            if (label := log.group_label(group))}
        self.hover.template = hover_template(codes)
        super().show(computed)
