"""The Crux page's components and their arrangement, shared by the live page and the report."""

from __future__ import annotations

from typing import Any

from bokeh.layouts import column, row

from crux_dask.dashboard.breakdown import Breakdown
from crux_dask.dashboard.data import Component, Source
from crux_dask.dashboard.overview import PAGOverview
from crux_dask.dashboard.steps import StepsTable
from crux_dask.dashboard.timeline import WCPTimeline


def crux_layout(data: Source) -> tuple[list[Component], Any]:
    """The four components, updated once, and the layout that shows them."""
    timeline = WCPTimeline(data, sizing_mode="stretch_width")
    breakdown = Breakdown(data, width=420)
    steps = StepsTable(data, sizing_mode="stretch_width")
    overview = PAGOverview(data, sizing_mode="stretch_width")
    components = [timeline, breakdown, steps, overview]
    for component in components:
        component.update()
    layout = column(row(breakdown.root, steps.root, sizing_mode="stretch_width"),
                    timeline.root, overview.root, sizing_mode="stretch_width")
    return components, layout
