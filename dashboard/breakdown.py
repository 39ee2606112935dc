"""Where the critical path's time went: compute, transfer, spill, I/O, scheduling, waiting."""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure

from crux_dask.dashboard.component import Component
from crux_dask.dashboard.data import GraphView, Source
from crux_dask.wcp import CATEGORIES


def breakdown_columns(view: GraphView) -> dict[str, list]:
    """Seconds and share of the path of ``view`` in each category."""
    path = view.wcp()
    seconds = [path.breakdown.get(c, 0.0) for c in CATEGORIES]
    total = path.length or 1.0
    return {"category": list(CATEGORIES), "seconds": seconds,
            "share": [s / total for s in seconds]}


class Breakdown(Component):
    """Seconds and share of the critical path per category."""

    computer = staticmethod(breakdown_columns)

    def __init__(self, data: Source, **kwargs: Any) -> None:
        super().__init__(data)
        self.source = ColumnDataSource({"category": list(CATEGORIES),
                                        "seconds": [0.0] * len(CATEGORIES),
                                        "share": [0.0] * len(CATEGORIES)})
        self.root = figure(title="Critical path breakdown", y_range=list(CATEGORIES)[::-1],
                           x_axis_label="seconds", name="crux-breakdown", tools="",
                           height=300, **kwargs)
        bars = self.root.hbar(y="category", right="seconds", height=0.7, source=self.source,
                              color="#1f77b4")
        self.root.add_tools(HoverTool(renderers=[bars], tooltips=[
            ("", "@category"), ("seconds", "@seconds{0.000}"), ("share", "@share{0.0%}")]))
