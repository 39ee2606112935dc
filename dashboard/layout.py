"""The Crux page's components and their arrangement, shared by the live page and the report."""

from __future__ import annotations

from typing import Any

from bokeh.layouts import column, row

from crux_dask.dashboard.breakdown import Breakdown
from crux_dask.dashboard.data import Component, Source
from crux_dask.dashboard.overview import PAGOverview
from crux_dask.dashboard.prefixes import PrefixTable
from crux_dask.dashboard.steps import StepsTable
from crux_dask.dashboard.suggestions import SuggestionTable
from crux_dask.dashboard.timeline import WCPTimeline


def crux_layout(data: Source, background: bool = True) -> tuple[list[Component], Any]:
    """The components, updated once, and the layout that shows them.

    ``background``: what-if replays run off the event loop, between
    computations (a live graph); else at once (a recorded one).
    """
    timeline = WCPTimeline(data, sizing_mode="stretch_width")
    breakdown = Breakdown(data, width=420)
    prefixes = PrefixTable(data, width=520)
    steps = StepsTable(data, sizing_mode="stretch_width")
    overview = PAGOverview(data, sizing_mode="stretch_width")
    suggestions = SuggestionTable(data, background, width=740)
    components = [timeline, breakdown, prefixes, steps, overview, suggestions]
    for component in components:
        component.update()
    layout = column(row(breakdown.root, prefixes.root, sizing_mode="stretch_width"),
                    steps.root, timeline.root, overview.root, suggestions.root,
                    sizing_mode="stretch_width")
    return components, layout
