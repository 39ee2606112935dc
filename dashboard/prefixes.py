"""Where the critical path spends its time, by task prefix, as a table."""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, DataTable

from crux_dask.dashboard.component import Component
from crux_dask.dashboard.data import GraphView, Source
from crux_dask.dashboard.datatables import table_columns

COLUMNS = ("prefix", "seconds", "share", "steps", "dominant")


def prefix_columns(view: GraphView) -> dict[str, list]:
    """One row per task prefix on the path of ``view``, most seconds first."""
    table = view.wcp().by_prefix()
    return {c: table[c].tolist() for c in COLUMNS}


class PrefixTable(Component):
    """One row per task prefix on the observed critical path, most seconds first."""

    computer = staticmethod(prefix_columns)

    def __init__(self, data: Source, **kwargs: Any) -> None:
        super().__init__(data)
        self.source = ColumnDataSource({c: [] for c in COLUMNS})
        self.root = DataTable(source=self.source, name="crux-prefixes", index_position=None,
                              height=300, columns=table_columns(
            ("prefix", "prefix", 200), ("seconds", "on the path (s)", 100, "0.000"),
            ("share", "share", 60, "0.0%"), ("steps", "steps", 50),
            ("dominant", "mostly", 90)), **kwargs)
