"""crux_dask in the Dask dashboard: a "Crux" tab, individual pages, a JSON API, reports."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crux_dask.plugins.scheduler import CruxSchedulerPlugin

__all__ = ["install"]


def install(scheduler: Any, plugin: CruxSchedulerPlugin) -> bool:
    """Add the Crux pages and JSON routes to ``scheduler``'s web server.

    Returns ``False`` when the scheduler runs without a web server.  Never
    raises: a dashboard problem must not stop the scheduler plugin.
    """
    import logging

    try:
        from crux_dask.dashboard.api import install_routes

        installed = False
        dashboard = _dashboard(scheduler)
        if dashboard is not None:
            from crux_dask.dashboard.tab import install_pages

            installed = install_pages(scheduler, plugin)
        prefix = (dashboard.prefix or "/") if dashboard is not None else "/"
        return install_routes(scheduler, plugin, prefix) or installed
    except Exception as error:  # the dashboard is optional; the recording is not
        logging.getLogger(__name__).warning("Crux could not add its dashboard: %r", error)
        return False


def _dashboard(scheduler: Any) -> Any:
    """The Bokeh application of ``scheduler``'s dashboard, or None if it runs none.

    A scheduler without a dashboard has not imported Bokeh: neither does
    this (the pages' modules take half a second to import).
    """
    if "bokeh.server.server" not in sys.modules:
        return None
    from bokeh.server.server import BokehTornado

    for app in getattr(getattr(scheduler, "http_application", None), "applications", []):
        if isinstance(app, BokehTornado):
            return app
    return None
