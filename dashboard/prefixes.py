"""Where the critical path spends its time, by task prefix, as a table."""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, DataTable, NumberFormatter, TableColumn

from crux_dask.dashboard.data import Component, GraphView, Source

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
                              height=300, columns=[
            TableColumn(field="prefix", title="prefix", width=200),
            TableColumn(field="seconds", title="on the path (s)",
                        formatter=NumberFormatter(format="0.000"), width=100),
            TableColumn(field="share", title="share",
                        formatter=NumberFormatter(format="0.0%"), width=60),
            TableColumn(field="steps", title="steps", width=50),
            TableColumn(field="dominant", title="mostly", width=90),
        ], **kwargs)
