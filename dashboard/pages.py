"""The "Crux" tab of the Dask dashboard and its individual pages."""

from __future__ import annotations

import functools
import logging
from typing import Any

from bokeh.layouts import column, row
from bokeh.server.server import BokehTornado
from distributed.dashboard.components import add_periodic_callback
from distributed.dashboard.components.scheduler import BOKEH_THEME, env
from distributed.dashboard.core import BokehApplication
from distributed.dashboard.scheduler import template_variables
from tornado.ioloop import IOLoop

from crux_dask.dashboard.breakdown import Breakdown
from crux_dask.dashboard.data import Source, live_source
from crux_dask.dashboard.overview import PAGOverview
from crux_dask.dashboard.steps import StepsTable
from crux_dask.dashboard.timeline import WCPTimeline

logger = logging.getLogger(__name__)

#: Individual pages: route -> component class.
INDIVIDUAL = {
    "/individual-crux-timeline": WCPTimeline,
    "/individual-crux-breakdown": Breakdown,
    "/individual-crux-steps": StepsTable,
    "/individual-crux-overview": PAGOverview,
}
UPDATE_INTERVAL = 500  # milliseconds


def crux_doc(data: Source, scheduler: Any, extra: dict, doc: Any) -> None:
    """The ``/crux`` page: all components, in the dashboard's template."""
    timeline = WCPTimeline(data, sizing_mode="stretch_width")
    breakdown = Breakdown(data, width=420)
    steps = StepsTable(data, sizing_mode="stretch_width")
    overview = PAGOverview(data, sizing_mode="stretch_width")
    for component in (timeline, breakdown, steps, overview):
        component.update()
        add_periodic_callback(doc, component, UPDATE_INTERVAL)
    doc.title = "Dask: Crux"
    doc.add_root(column(row(breakdown.root, steps.root, sizing_mode="stretch_width"),
                        timeline.root, overview.root, sizing_mode="stretch_width"))
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME


def individual_doc(cls: type, data: Source, scheduler: Any, extra: dict, doc: Any) -> None:
    component = cls(data, sizing_mode="stretch_both")
    component.update()
    add_periodic_callback(doc, component, UPDATE_INTERVAL)
    doc.title = f"Dask: Crux {cls.__name__}"
    doc.add_root(component.root)
    doc.theme = BOKEH_THEME


def install_pages(scheduler: Any, plugin: Any) -> bool:
    """Add the Crux pages to the scheduler's dashboard; ``False`` if it has none."""
    application = getattr(scheduler, "http_application", None)
    existing = [app for app in getattr(application, "applications", [])
                if isinstance(app, BokehTornado)]
    if not existing:
        return False
    if any("/crux" in app.app_paths for app in existing):
        return True  # installed already (the plugin was registered again)
    data = live_source(plugin)
    routes = {"/crux": functools.partial(crux_doc, data)}
    routes.update({route: functools.partial(individual_doc, cls, data)
                   for route, cls in INDIVIDUAL.items()})
    variables = template_variables(scheduler)
    if "crux" not in variables["pages"]:
        variables["pages"].append("crux")
        variables["plots"].extend(
            {"url": route.strip("/"), "name": " ".join(route.strip("/").split("-")[1:]).title()}
            for route in INDIVIDUAL)
        variables["plots"].sort(key=lambda plot: plot["name"])
    prefix = existing[0].prefix
    app = BokehApplication(routes, scheduler, prefix=prefix, template_variables=variables)
    application.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    return True
