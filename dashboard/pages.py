"""The Crux pages: ``/crux`` and the individual ones, and the Bokeh application serving them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from bokeh.application import Application
from bokeh.document import Document
from bokeh.layouts import column, row
from bokeh.server.server import BokehTornado
from distributed.dashboard.components.scheduler import env
from distributed.dashboard.core import DaskBokehTornado

from crux_dask.dashboard.breakdown import Breakdown
from crux_dask.dashboard.data import (
    PathSelection,
    RunChoice,
    Runs,
    Source,
    chosen_source,
    live_source,
    selected_source,
)
from crux_dask.dashboard.layout import crux_layout
from crux_dask.dashboard.off_loop import OffLoop
from crux_dask.dashboard.overview import PAGOverview
from crux_dask.dashboard.prefixes import PrefixTable
from crux_dask.dashboard.selectors import (
    RunSelector,
    ScopeSelector,
    SelectionCheck,
    path_controls,
)
from crux_dask.dashboard.showing import (
    MadeOffLoop,
    largest_first,
    show_in_stages,
    update_on_the_loop,
)
from crux_dask.dashboard.steps import StepsTable
from crux_dask.dashboard.suggestions import SuggestionTable
from crux_dask.dashboard.tab import INDIVIDUAL_PAGES
from crux_dask.dashboard.timeline import WCPTimeline

#: Individual pages: route -> component class.
INDIVIDUAL = dict(zip(INDIVIDUAL_PAGES, (WCPTimeline, Breakdown, StepsTable, PrefixTable,
                                         PAGOverview, SuggestionTable), strict=True))
UPDATE_INTERVAL = 500  # milliseconds
CHECK_INTERVAL = 100  # milliseconds: how soon a path chosen on the page is shown


def crux_page(data: Source, runs: Runs, extra: dict) -> Callable[[Document], None]:
    """The ``/crux`` page: all components, in the dashboard's template.

    Makes the components (in any thread); what it returns shows them in a
    document, on the event loop, with the selectors, which read the
    scheduler's state.
    """
    selection = PathSelection()
    choice = RunChoice()
    selected = selected_source(chosen_source(data, runs, choice), selection)
    updaters, layout = crux_layout(selected)
    parts = largest_first(list(layout.children))
    layout.children = []

    def show(doc: Document) -> None:
        selector = RunSelector(runs, choice, updaters)
        check = SelectionCheck(selected, selection, updaters)
        scopes = ScopeSelector(runs.plugin, check)
        periodic = [(updater, UPDATE_INTERVAL) for updater in updaters] + [
            (selector, UPDATE_INTERVAL), (check, CHECK_INTERVAL), (scopes, UPDATE_INTERVAL)]
        update_on_the_loop(doc, periodic)
        doc.title = "Dask: Crux"
        doc.template = env.get_template("simple.html")
        doc.template_variables.update(extra)
        root = column(row(selector.root, scopes.root, path_controls(check)), layout,
                      sizing_mode="stretch_width")
        show_in_stages(doc, root, layout, parts, [
            source for updater in updaters
            for component in getattr(updater, "components", [updater])
            for source in component.sources])

    return show


def individual_page(cls: type, data: Source) -> Callable[[Document], None]:
    """An individual page: one component, all the window."""
    component = cls(data, sizing_mode="stretch_both")

    def show(doc: Document) -> None:
        # What it shows is computed off the event loop, from the first update on.
        updater = (component if isinstance(component, SuggestionTable)
                   else OffLoop(data, [component]))
        update_on_the_loop(doc, [(updater, UPDATE_INTERVAL)])
        doc.title = f"Dask: Crux {cls.__name__}"
        body = column(sizing_mode="stretch_both")
        show_in_stages(doc, body, body, [(0, component.root)], component.sources)

    return show


def page_makers(host: Any, extra: dict) -> dict[str, Callable[[], Callable[[Document], None]]]:
    """Route -> what makes that page (see :class:`~.showing.MadeOffLoop`), reading ``host``'s graph.

    ``host`` is what the pages read: the scheduler plugin.  ``extra`` are the
    dashboard template's variables.
    """
    data = live_source(host)
    pages = {"/crux": functools.partial(crux_page, data, Runs(host), extra)}
    pages.update({route: functools.partial(individual_page, cls, data)
                  for route, cls in INDIVIDUAL.items()})
    return pages


def pages_application(host: Any, extra: dict, settings: dict) -> BokehTornado:
    """The Bokeh application of the Crux pages, made as distributed makes its own.

    ``settings``: ``prefix``, ``origins`` (the websocket origins allowed) and
    ``bokeh`` (distributed's ``bokeh-application`` settings, without them).
    """
    return DaskBokehTornado({route: Application(MadeOffLoop(make))
                             for route, make in page_makers(host, extra).items()},
                            prefix=settings["prefix"], use_index=False,
                            extra_websocket_origins=settings["origins"], absolute_url="",
                            **settings["bokeh"])
