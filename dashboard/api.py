"""The routes of the JSON API on the scheduler's web server (``/crux/api/v1/...``).

Reads (:mod:`.api_reads`) are open, like the rest of the dashboard, and answer
from the graph as applied so far; writes (:mod:`.api_writes`), the POST routes
through which applications outside Dask add their data states, need
``crux-dask.http.token`` as a bearer token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crux_dask.dashboard.api_reads import (
    ComputationsHandler,
    MutationsHandler,
    NotFoundHandler,
    StateHandler,
    StatesReader,
    StatsHandler,
    WCPHandler,
)
from crux_dask.dashboard.api_writes import MutationWriteHandler, NewDataWriter

if TYPE_CHECKING:
    from crux_dask.plugins.scheduler import CruxSchedulerPlugin

PREFIX = "crux/api/v1"


class StatesHandler(StatesReader, NewDataWriter):
    """``/states``: GET lists the states (:class:`~.api_reads.StatesReader`), POST adds
    an external application's new data (:class:`~.api_writes.NewDataWriter`)."""


def routes(plugin: CruxSchedulerPlugin, prefix: str = "/") -> list[tuple]:
    """The Crux JSON routes under ``prefix``, each handler bound to ``plugin``."""
    base = "/" + "/".join(p for p in (prefix.strip("/"), PREFIX) if p)
    options = {"plugin": plugin}
    return [
        (f"{base}/states", StatesHandler, options),
        (rf"{base}/states/([^/]+)", StateHandler, options),
        (f"{base}/mutations", MutationsHandler, options),
        (rf"{base}/mutations/([a-zA-Z]+)", MutationWriteHandler, options),
        (f"{base}/wcp", WCPHandler, options),
        (f"{base}/computations", ComputationsHandler, options),
        (f"{base}/stats", StatsHandler, options),
        (rf"{base}/(.*)", NotFoundHandler, options),
    ]


def install_routes(scheduler: Any, plugin: CruxSchedulerPlugin, prefix: str = "/") -> bool:
    """Add the JSON routes to the scheduler's web server; ``False`` if it has none."""
    application = getattr(scheduler, "http_application", None)
    if application is None:
        return False
    application.add_handlers(r".*", routes(plugin, prefix))
    return True
