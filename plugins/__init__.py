"""The Dask side of crux_dask: scheduler and worker plugins, and the client API.

Also a preload module: ``dask scheduler --preload crux_dask.plugins`` and
``dask worker --preload crux_dask.plugins`` install the plugins at start-up.
"""

from __future__ import annotations

from typing import Any

from crux_dask.plugins import config  # noqa: F401  (registers the configuration defaults)
from crux_dask.plugins.api import (
    attach,
    export_parquet,
    flush,
    get_pag,
    get_stats,
    get_wcp,
)
from crux_dask.plugins.scheduler import CruxSchedulerPlugin
from crux_dask.plugins.worker import CruxWorkerPlugin

__all__ = [
    "CruxSchedulerPlugin",
    "CruxWorkerPlugin",
    "attach",
    "dask_setup",
    "export_parquet",
    "flush",
    "get_pag",
    "get_stats",
    "get_wcp",
]


async def dask_setup(server: Any) -> None:
    """Preload hook: install the plugin that fits the server being started."""
    from distributed import Scheduler, Worker

    if isinstance(server, Scheduler):
        server.add_plugin(CruxSchedulerPlugin())
    elif isinstance(server, Worker):
        await server.plugin_add(plugin=CruxWorkerPlugin(), name=CruxWorkerPlugin.name)
