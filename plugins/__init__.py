"""The Dask side of crux_dask: scheduler and worker plugins, and the client API.

Also a preload module: ``dask scheduler --preload crux_dask.plugins`` and
``dask worker --preload crux_dask.plugins`` install the plugins at start-up.

Importing this package registers the ``crux-dask`` configuration defaults and
nothing more: the names below are imported when first used, so that a worker
loads only what it sends (never the builder nor the dashboard).
"""

from __future__ import annotations

import importlib
from typing import Any

from crux_dask.plugins import config  # noqa: F401  (registers the configuration defaults)

#: Public names and the module each lives in.
_EXPORTS = {
    "CruxSchedulerPlugin": "crux_dask.plugins.scheduler",
    "CruxWorkerPlugin": "crux_dask.plugins.worker",
    "attach": "crux_dask.plugins.api",
    "export_parquet": "crux_dask.plugins.api",
    "flush": "crux_dask.plugins.api",
    "get_computations": "crux_dask.plugins.api",
    "get_pag": "crux_dask.plugins.api",
    "get_stats": "crux_dask.plugins.api",
    "get_wcp": "crux_dask.plugins.api",
}

__all__ = sorted([*_EXPORTS, "dask_setup"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'crux_dask.plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


async def dask_setup(server: Any) -> None:
    """Preload hook: install the plugin that fits the server being started."""
    from distributed import Scheduler, Worker

    if isinstance(server, Scheduler):
        from distributed.protocol.pickle import dumps

        from crux_dask.plugins.scheduler import CruxSchedulerPlugin
        from crux_dask.plugins.worker import CruxWorkerPlugin

        server.add_plugin(CruxSchedulerPlugin())
        # Registered with the scheduler like any worker plugin, so that its list of
        # worker plugins is what its workers hold (a preloaded worker adds the same one).
        server.worker_plugins.setdefault(CruxWorkerPlugin.name, dumps(CruxWorkerPlugin()))
    elif isinstance(server, Worker):
        from crux_dask.plugins.worker import CruxWorkerPlugin

        await server.plugin_add(plugin=CruxWorkerPlugin(), name=CruxWorkerPlugin.name)
