"""What users call with a :class:`distributed.Client`."""

from __future__ import annotations

import asyncio
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask
import distributed

import crux_dask
from crux_dask.pag import PAG
from crux_dask.plugins.scheduler import CruxSchedulerPlugin
from crux_dask.plugins.worker import CruxWorkerPlugin
from crux_dask.provenance import write_dataset
from crux_dask.wcp import critical_path

if TYPE_CHECKING:
    from distributed import Client

    from crux_dask.wcp import CriticalPath

__all__ = ["attach", "flush", "get_pag", "get_stats", "get_wcp"]


def attach(client: Client, **worker_options: Any) -> Any:
    """Record the cluster behind ``client``: register both plugins (idempotent).

    Keyword arguments go to :class:`~crux_dask.plugins.CruxWorkerPlugin`.
    """
    return client.sync(_attach, client, worker_options)


async def _attach(client: Client, worker_options: dict[str, Any]) -> None:
    # The scheduler side first, so that workers find its handler from their first batch.
    await client.register_plugin(CruxSchedulerPlugin())
    await client.register_plugin(CruxWorkerPlugin(**worker_options))


def flush(client: Client) -> Any:
    """Bring every event recorded so far into the scheduler's graph.

    Workers send what they buffered; the scheduler applies every event
    received before the call, a slice per turn of its event loop, and events
    still waiting for an input that was never reported get a stand-in.
    """
    return client.sync(_flush, client)


async def _flush(client: Client) -> None:
    await client.run(_flush_worker)
    await client.run_on_scheduler(_drain_on_scheduler)


def get_pag(client: Client) -> Any:
    """The program activity graph recorded so far (a :class:`~crux_dask.PAG` copy)."""
    return client.sync(_get_pag, client)


async def _get_pag(client: Client) -> PAG:
    await _flush(client)
    store, end = await client.run_on_scheduler(_snapshot_on_scheduler)
    return PAG([store], [end])


def get_wcp(client: Client, start: int | None = None, end: int | None = None,
            method: str = "observed") -> Any:
    """The workflow critical path recorded so far (a :class:`~crux_dask.CriticalPath`).

    Parameters are those of :meth:`crux_dask.PAG.wcp`; the path is computed on
    the scheduler and only its steps travel.
    """
    return client.sync(_get_wcp, client, start, end, method)


async def _get_wcp(client: Client, start: int | None, end: int | None, method: str
                   ) -> CriticalPath:
    await _flush(client)
    return await client.run_on_scheduler(_wcp_on_scheduler, start=start, end=end,
                                         method=method)


def get_stats(client: Client) -> Any:
    """Counts of events received, applied and rejected, and the graph's size.

    ``workers`` maps each worker to its own counts (events recorded, sent,
    dropped).
    """
    return client.sync(_get_stats, client)


async def _get_stats(client: Client) -> dict[str, Any]:
    stats = await client.run_on_scheduler(_stats_on_scheduler)
    stats["workers"] = await client.run(_worker_stats)
    return stats


def export_parquet(client: Client, path: str | os.PathLike) -> Any:
    """Write the provenance recorded so far to the Parquet dataset at ``path``.

    The run is added to the dataset (other runs already there stay as they
    are); returns the dataset's path.  See :mod:`crux_dask.provenance`.
    """
    return client.sync(_export_parquet, client, path)


async def _export_parquet(client: Client, path: str | os.PathLike) -> Path:
    await _flush(client)
    stores, end, transitions, stats = await client.run_on_scheduler(_export_on_scheduler)
    info = await client.scheduler.identity()
    workers = info.get("workers", {})
    metadata = {
        "crux_dask": crux_dask.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "python": platform.python_version(),
        "scheduler": info.get("address"),
        "workers": len(workers),
        "threads": sum(w.get("nthreads", 0) for w in workers.values()),
        "memory_limit": sum(w.get("memory_limit") or 0 for w in workers.values()),
        "config": dask.config.get("crux-dask", default={}),
        "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float, str))},
    }
    pag = PAG(stores, [*([None] * (len(stores) - 1)), end])
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, write_dataset, path, pag, metadata, transitions)


# -- run on the cluster ---------------------------------------------------------
def _plugin(server: Any) -> Any:
    plugin = server.plugins.get(CruxSchedulerPlugin.name)
    if plugin is None:
        raise RuntimeError("Crux is not attached to this cluster: call crux_dask.attach(client)")
    return plugin


async def _flush_worker(dask_worker: Any) -> bool:
    plugin = dask_worker.plugins.get(CruxWorkerPlugin.name)
    return True if plugin is None else await plugin.flush()


async def _drain_on_scheduler(dask_scheduler: Any) -> None:
    await _plugin(dask_scheduler).ingest.drain()


def _snapshot_on_scheduler(dask_scheduler: Any) -> tuple:
    return _plugin(dask_scheduler).snapshot()


def _wcp_on_scheduler(dask_scheduler: Any, start: int | None, end: int | None,
                      method: str) -> CriticalPath:
    builder = _plugin(dask_scheduler).builder
    return critical_path(builder.store, start, end, method, default_end=builder.end)


async def _export_on_scheduler(dask_scheduler: Any) -> tuple:
    plugin = _plugin(dask_scheduler)
    loop = asyncio.get_running_loop()
    spooled = await loop.run_in_executor(None, plugin.spooled_stores)
    store, end = plugin.snapshot()
    return [*spooled, store], end, plugin.transitions_frame(), plugin.stats()


def _stats_on_scheduler(dask_scheduler: Any) -> dict[str, Any]:
    return _plugin(dask_scheduler).stats()


def _worker_stats(dask_worker: Any) -> dict[str, Any]:
    plugin = dask_worker.plugins.get(CruxWorkerPlugin.name)
    return {} if plugin is None else plugin.stats()
