"""The Crux tab in the scheduler's dashboard: the tab, the individual pages, their listing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dask
from bokeh.server.server import BokehTornado
from bokeh.server.util import create_hosts_allowlist
from distributed.dashboard.scheduler import template_variables
from tornado.ioloop import IOLoop

if TYPE_CHECKING:
    from crux_dask.plugins.scheduler import CruxSchedulerPlugin

__all__ = ["INDIVIDUAL_PAGES", "install_pages", "list_individual_pages"]

#: The individual pages, one component each (see :data:`.pages.INDIVIDUAL`).
INDIVIDUAL_PAGES = ("/individual-crux-timeline", "/individual-crux-breakdown",
                    "/individual-crux-steps", "/individual-crux-prefixes",
                    "/individual-crux-overview", "/individual-crux-suggestions")


def install_pages(scheduler: Any, plugin: CruxSchedulerPlugin) -> bool:
    """Add the Crux pages to the scheduler's dashboard; ``False`` if it has none.

    Served by the scheduler's web server, under the same prefix and with the
    same settings as distributed's own pages (see :mod:`.pages`); what they
    show is computed where the graph is built.
    """
    application = getattr(scheduler, "http_application", None)
    existing = [app for app in getattr(application, "applications", [])
                if isinstance(app, BokehTornado)]
    if not existing:
        return False
    if any("/crux" in app.app_paths for app in existing):
        return True  # installed already (the plugin was registered again)
    variables = template_variables(scheduler)
    if "crux" not in variables["pages"]:
        variables["pages"].append("crux")
        variables["plots"].extend(
            {"url": route.strip("/"), "name": " ".join(route.strip("/").split("-")[1:]).title()}
            for route in INDIVIDUAL_PAGES)
        variables["plots"].sort(key=lambda plot: plot["name"])
    prefix = existing[0].prefix
    prefix = "/" + prefix.strip("/") + "/" if prefix else "/"
    extra = {"prefix": prefix, **variables}
    bokeh = dask.config.get("distributed.scheduler.dashboard.bokeh-application").copy()
    origins = create_hosts_allowlist(bokeh.pop("allow_websocket_origin"),
                                     scheduler.http_server.port)
    settings = {"prefix": prefix, "origins": origins, "bokeh": bokeh}
    from crux_dask.dashboard.pages import pages_application

    app = pages_application(plugin, extra, settings)
    application.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    list_individual_pages(application)
    return True


def list_individual_pages(application: Any) -> bool:
    """List the individual Crux pages in ``/individual-plots.json`` too.

    That listing, which JupyterLab's Dask extension reads, only looks at
    distributed's own Bokeh application; its handler is swapped for one that
    adds ours.  Returns ``False`` if the route is not there.
    """
    from distributed.http.scheduler.info import IndividualPlots

    class IndividualPlotsWithCrux(IndividualPlots):
        def write(self, chunk: Any) -> None:
            if isinstance(chunk, dict):
                chunk = {**chunk, **{route.strip("/").replace("-", " ").title(): route
                                     for route in INDIVIDUAL_PAGES}}
            super().write(chunk)

    found = False
    routers = [application.default_router, application.wildcard_router]
    while routers:
        for rule in routers.pop().rules:
            if isinstance(rule.target, type) and issubclass(rule.target, IndividualPlots):
                rule.target = IndividualPlotsWithCrux
                found = True
            elif hasattr(rule.target, "rules"):
                routers.append(rule.target)
    return found
