"""Where the critical path spends its time, by task prefix, as a table, with the code
behind each prefix."""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, DataTable

from crux_dask.dashboard.component import Component
from crux_dask.dashboard.data import GraphView, Source
from crux_dask.dashboard.datatables import table_columns
from crux_dask.functions import FunctionLog

COLUMNS = ("prefix", "seconds", "share", "steps", "dominant", "stragglers")


def prefix_columns(view: GraphView) -> dict[str, list]:
    """One row per task prefix on the path of ``view``, most seconds first."""
    table = view.wcp().by_prefix()
    return {c: table[c].tolist() for c in COLUMNS}


def function_log(view: GraphView) -> FunctionLog | None:
    """The function table of the graph ``view`` shows, where known (see
    :attr:`GraphView.functions <crux_dask.dashboard.data.GraphView>`)."""
    return None if view.functions is None else view.functions()


class PrefixTable(Component):
    """One row per task prefix on the observed critical path, most seconds first.

    ``code`` is the code behind the prefix (see
    :meth:`~crux_dask.functions.FunctionLog.prefix_label`): ``file:line
    qualname`` of its first group of the user's code, else the qualified name
    of its library function.  It is read on the event loop from the view's
    function table: the scheduler's, or the one a recorded run was read with.
    """

    computer = staticmethod(prefix_columns)

    def __init__(self, data: Source, **kwargs: Any) -> None:
        super().__init__(data)
        self.source = ColumnDataSource({c: [] for c in (*COLUMNS, "code")})
        self.root = DataTable(source=self.source, name="crux-prefixes", index_position=None,
                              height=300, columns=table_columns(
            ("prefix", "prefix", 150), ("seconds", "on the path (s)", 100, "0.000"),
            ("share", "share", 60, "0.0%"), ("steps", "steps", 50),
            ("dominant", "mostly", 90), ("stragglers", "stragglers", 70),
            ("code", "code", 200)), **kwargs)

    def show(self, computed: dict[str, list]) -> None:
        log = function_log(self.data())
        codes = [log.prefix_label(prefix) if log is not None else ""
                 for prefix in computed["prefix"]]
        super().show({**computed, "code": codes})
