"""The Crux page's components and their arrangement, shared by the live page and the report."""

from __future__ import annotations

from typing import Any

from bokeh.layouts import column, row
from distributed.dashboard.components import DashboardComponent

from crux_dask.dashboard.breakdown import Breakdown
from crux_dask.dashboard.component import Component
from crux_dask.dashboard.data import Source
from crux_dask.dashboard.off_loop import OffLoop
from crux_dask.dashboard.overview import PAGOverview
from crux_dask.dashboard.prefixes import PrefixTable
from crux_dask.dashboard.steps import StepsTable
from crux_dask.dashboard.suggestions import SuggestionTable
from crux_dask.dashboard.timeline import WCPTimeline


def crux_layout(data: Source, background: bool = True) -> tuple[list[DashboardComponent],
                                                                 Any]:
    """What keeps the components up to date (call its ``update``), and the layout.

    ``background`` (a live graph): what the components show is computed off
    the event loop (:class:`~crux_dask.dashboard.off_loop.OffLoop`) from the
    first update on, and what-if replays run in a process of their own
    between computations; else (a recorded graph) the components are rendered at
    once.
    """
    timeline = WCPTimeline(data, sizing_mode="stretch_width")
    breakdown = Breakdown(data, width=420)
    prefixes = PrefixTable(data, width=520)
    steps = StepsTable(data, sizing_mode="stretch_width")
    overview = PAGOverview(data, sizing_mode="stretch_width")
    suggestions = SuggestionTable(data, background, width=740)
    components: list[Component] = [timeline, breakdown, prefixes, steps, overview]
    if background:
        updaters: list[DashboardComponent] = [OffLoop(data, components), suggestions]
    else:
        updaters = [*components, suggestions]
        for updater in updaters:
            updater.update()
    layout = column(row(breakdown.root, prefixes.root, sizing_mode="stretch_width"),
                    steps.root, timeline.root, overview.root, suggestions.root,
                    sizing_mode="stretch_width")
    return updaters, layout
