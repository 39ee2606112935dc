"""What users call with a :class:`distributed.Client`."""

from __future__ import annotations

import asyncio
import os
import pickle
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask
import distributed

import crux_dask
from crux_dask.plugins.graph_process import GraphProcessGone
from crux_dask.plugins.host import split_pieces
from crux_dask.plugins.scheduler import CruxSchedulerPlugin
from crux_dask.plugins.scopes import path_of_graph, path_of_scope, pickled, scopes_table
from crux_dask.plugins.staging import KeptPieces, Pieces
from crux_dask.plugins.transitions import transitions_frame
from crux_dask.plugins.worker import CruxWorkerPlugin, flush_worker, worker_stats
from crux_dask.scopes import select
from crux_dask.store import PAGStore

# The scheduler imports this module when a client runs one of the functions below on it
# (on its event loop): what needs pandas is imported where it is used, by the client.
if TYPE_CHECKING:
    from distributed import Client

    from crux_dask.pag import PAG
    from crux_dask.wcp import CriticalPath

__all__ = ["attach", "flush", "get_computations", "get_functions", "get_load", "get_pag",
           "get_stats", "get_wcp"]


def attach(client: Client, **worker_options: Any) -> Any:
    """Record the cluster behind ``client``: register both plugins (idempotent).

    Keyword arguments go to :class:`~crux_dask.plugins.CruxWorkerPlugin`.
    """
    return client.sync(_attach, client, worker_options)


async def _attach(client: Client, worker_options: dict[str, Any]) -> None:
    # The scheduler side first, so that workers find its handler from their first batch.
    await client.register_plugin(CruxSchedulerPlugin())
    # Wait for the graph process to be up: its start (0.6 s of CPU, mostly imports)
    # would otherwise fall on the first computation recorded, on its workers' cores.
    await client.run_on_scheduler(_drain_on_scheduler)
    await client.register_plugin(CruxWorkerPlugin(**worker_options))
    # A sample of each worker's CPU seconds before the first computation recorded: the
    # work of its event loop is measured between two of them.
    await client.run_on_scheduler(_hear_workers_on_scheduler)


def flush(client: Client) -> Any:
    """Bring every event recorded so far into the scheduler's graph.

    Workers send what they buffered; the scheduler applies every event
    received before the call, a slice per turn of its event loop, and events
    still waiting for an input that was never reported get a stand-in.
    """
    return client.sync(_flush, client)


async def _flush(client: Client) -> None:
    await client.run(flush_worker)
    await client.run_on_scheduler(_drain_on_scheduler)


def get_pag(client: Client) -> Any:
    """The program activity graph recorded so far (a :class:`~crux_dask.PAG` copy)."""
    return client.sync(_get_pag, client)


async def _get_pag(client: Client) -> PAG:
    from crux_dask.pag import PAG

    await _flush(client)
    (end,), _, (store,) = await _fetch_staged(client, _stage_pag_on_scheduler)
    return PAG([store], [end])


def get_wcp(client: Client, start: int | None = None, end: int | None = None,
            method: str = "observed", *, computation: int | None = None,
            span: str | None = None) -> Any:
    """The workflow critical path recorded so far (a :class:`~crux_dask.CriticalPath`).

    Parameters
    ----------
    client : distributed.Client
    start, end, method
        As for :meth:`crux_dask.PAG.wcp`.
    computation : int, optional
        The path of one computation: its index in :func:`get_computations`'
        computations (``-1``: the latest).
    span : str, optional
        The path of one span (and its children): its id, its name (tags
        joined by ``/``) or its last tag; the newest span of that name.

    The path is computed on the scheduler and only its steps travel.  The path
    of a computation or span ends at the last state its tasks made and starts
    when it was submitted; its steps have a column ``in_scope``, false for a
    step that goes through a task of another one (data it persisted, a
    thread it held).

    Raises
    ------
    ValueError
        For both ``computation`` and ``span``, or either with ``start`` or
        ``end``; for a computation or span that is not known.
    """
    if computation is not None or span is not None:
        if computation is not None and span is not None:
            raise ValueError("give computation or span, not both")
        if start is not None or end is not None:
            raise ValueError("start and end do not apply to a computation or span")
    return client.sync(_get_wcp, client, start, end, method, computation, span)


async def _get_wcp(client: Client, start: int | None, end: int | None, method: str,
                   computation: int | None = None, span: str | None = None) -> CriticalPath:
    await _flush(client)
    if computation is None and span is None:
        return await _unpickled(client, _wcp_on_scheduler, start=start, end=end,
                                method=method)
    return await _unpickled(client, _scope_wcp_on_scheduler, method=method,
                            computation=computation, span=span)


def get_computations(client: Client) -> Any:
    """One row per computation and per span recorded, oldest first (a DataFrame).

    Columns: ``kind`` (``computation`` or ``span``), ``id``, ``name`` (a
    span's tags joined by ``/``; a computation's line of code where Dask
    recorded it, else its task prefixes), ``parent`` (a span's parent span),
    ``start`` (submitted), ``stop`` (its last task done), ``makespan``,
    ``tasks`` (states its tasks computed), ``path_length`` and
    ``top_categories`` of its critical path (see :func:`get_wcp`).
    """
    return client.sync(_get_computations, client)


async def _get_computations(client: Client) -> Any:
    await _flush(client)
    return await _unpickled(client, _computations_on_scheduler)


def get_stats(client: Client) -> Any:
    """Counts of events received, applied and rejected, and the graph's size.

    ``workers`` maps each worker to its own counts (events recorded, sent,
    dropped).
    """
    return client.sync(_get_stats, client)


async def _get_stats(client: Client) -> dict[str, Any]:
    stats = await client.run_on_scheduler(_stats_on_scheduler)
    stats["workers"] = await client.run(worker_stats)
    return stats


def get_load(client: Client, after: float | None = None) -> Any:
    """The load of the scheduler and of every worker, sampled as the run went: a
    DataFrame of :data:`~crux_dask.load.LOAD_COLUMNS` (see :mod:`crux_dask.load`).

    With ``after`` (seconds since the epoch: ``time.time()`` as a computation
    ended), first wait for a heartbeat of each worker after it (at most two
    seconds): the CPU seconds of its process then close the computation's, which
    the what-if reads its event loop's work from.
    """
    return client.sync(_get_load, client, after)


async def _get_load(client: Client, after: float | None = None) -> Any:
    from crux_dask.load import load_frame

    if after is not None:
        await client.run_on_scheduler(_hear_workers_on_scheduler, since=after)
    return load_frame(await client.run_on_scheduler(_load_on_scheduler))


def get_functions(client: Client) -> Any:
    """The function each task group runs, as the scheduler found it in the group's first
    task: a DataFrame of :data:`~crux_dask.functions.FUNCTION_COLUMNS`, one row per task
    group, oldest first (see :mod:`crux_dask.functions`)."""
    return client.sync(_get_functions, client)


async def _get_functions(client: Client) -> Any:
    from crux_dask.functions import function_frame

    return function_frame(await client.run_on_scheduler(_functions_on_scheduler))


def export_parquet(client: Client, path: str | os.PathLike) -> Any:
    """Write the provenance recorded so far to the Parquet dataset at ``path``.

    The run is added to the dataset (other runs already there stay as they
    are); returns the dataset's path.  See :mod:`crux_dask.provenance`.
    """
    return client.sync(_export_parquet, client, path)


async def _export_parquet(client: Client, path: str | os.PathLike) -> Path:
    await _flush(client)
    (end, stats, scopes, load, functions), transitions, stores = await _fetch_staged(
        client, _stage_export_on_scheduler)
    transitions = transitions_frame([pickle.loads(chunk) for chunk in transitions])
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
    from crux_dask.pag import PAG
    from crux_dask.provenance import write_dataset

    pag = PAG(stores, [*([None] * (len(stores) - 1)), end])
    loop = asyncio.get_running_loop()
    from crux_dask.functions import function_frame
    from crux_dask.load import load_frame

    return await loop.run_in_executor(None, write_dataset, path, pag, metadata, transitions,
                                      scopes, load_frame(load), function_frame(functions))


# -- run on the cluster ---------------------------------------------------------
def _plugin(server: Any) -> Any:
    plugin = server.plugins.get(CruxSchedulerPlugin.name)
    if plugin is None:
        raise RuntimeError("Crux is not attached to this cluster: call crux_dask.attach(client)")
    return plugin


async def _drain_on_scheduler(dask_scheduler: Any) -> None:
    await _plugin(dask_scheduler).host.drain()


async def _hear_workers_on_scheduler(dask_scheduler: Any, since: float | None = None
                                     ) -> None:
    await _plugin(dask_scheduler).load.hear_workers(time.time() if since is None else since)


# The analyses come back pickled where they ran, in pieces (see ``pickled``), staged for
# the client to fetch one per message (see ``_unpickled``).
async def _wcp_on_scheduler(dask_scheduler: Any, start: int | None, end: int | None,
                            method: str) -> tuple[str, int]:
    plugin = _plugin(dask_scheduler)
    return _staged(plugin, await plugin.analyse(pickled, path_of_graph, start, end, method))


async def _computations_on_scheduler(dask_scheduler: Any) -> tuple[str, int]:
    plugin = _plugin(dask_scheduler)
    return _staged(plugin, await plugin.analyse(pickled, scopes_table, plugin.scopes()))


async def _scope_wcp_on_scheduler(dask_scheduler: Any, method: str, computation: int | None,
                                  span: str | None) -> tuple[str, int]:
    plugin = _plugin(dask_scheduler)
    return _staged(plugin, await plugin.analyse(
        pickled, path_of_scope, select(plugin.scopes(), computation, span), method))


def _staged(plugin: CruxSchedulerPlugin, *parts: Pieces | KeptPieces) -> tuple[str, int]:
    return plugin.stage(list(parts)), sum(len(part) for part in parts)


async def _unpickled(client: Client, function: Any, **kwargs: Any) -> Any:
    """What ``function`` (run on the scheduler with ``kwargs``) staged, fetched a piece
    per message and unpickled."""
    return pickle.loads(b"".join(await _fetched(client, function, **kwargs)))


async def _fetch_staged(client: Client, stage: Any
                        ) -> tuple[tuple, list[bytes], list[PAGStore]]:
    """What ``stage`` staged on the scheduler, a piece per message: its head, the pieces
    it staged besides the graph, and the stores."""
    pieces = await _fetched(client, stage)
    head, n_extra, counts = pickle.loads(pieces[0])
    stores = [PAGStore.from_pieces(part)
              for part in split_pieces(pieces[1 + n_extra:], counts)]
    return head, pieces[1:1 + n_extra], stores


async def _fetched(client: Client, stage: Any, **kwargs: Any) -> list[bytes]:
    """The pieces ``stage`` (run on the scheduler with ``kwargs``) staged, a piece per
    message.  If they are gone meanwhile (the graph process that kept them died, or the
    staging was let go for newer ones), they are staged again, once."""
    try:
        return await _fetch(client, *await client.run_on_scheduler(stage, **kwargs))
    except (GraphProcessGone, KeyError):
        return await _fetch(client, *await client.run_on_scheduler(stage, **kwargs))


async def _fetch(client: Client, token: str, count: int) -> list[bytes]:
    return [await client.run_on_scheduler(_staged_piece, token=token, index=index)
            for index in range(count)]


async def _stage_pag_on_scheduler(dask_scheduler: Any) -> tuple[str, int]:
    return await _stage(_plugin(dask_scheduler), Pieces([], []), lambda end: ((end,), []))


async def _stage_export_on_scheduler(dask_scheduler: Any) -> tuple[str, int]:
    plugin = _plugin(dask_scheduler)
    transitions = await plugin.transition_chunks()
    spooled = await plugin.spooled_pieces()
    stats, scopes, load = plugin.stats(), plugin.scopes(), plugin.load.log.columns()
    functions = plugin.functions.log.columns()
    return await _stage(plugin, spooled, lambda end: ((end, stats, scopes, load, functions),
                                                      transitions))


async def _stage(plugin: CruxSchedulerPlugin, spooled: Pieces | KeptPieces,
                 head: Callable[[int], tuple[tuple, list]]) -> tuple[str, int]:
    """Stage what ``head(end)`` returns (a tuple and pieces of its own), the
    ``spooled`` segments' pieces and the live graph as it is now, for a client.

    The graphs are cut into pieces of half a megabyte where they are built or
    spooled (:meth:`~CruxSchedulerPlugin.pieces`,
    :meth:`~CruxSchedulerPlugin.spooled_pieces`): in the graph process, which
    keeps them until they are fetched, or in a thread of the scheduler's.  The
    pieces of ``head`` are pickled one at a time as they are fetched.  The
    client fetches one piece per message, so that the event loop never
    serializes much at once (nor holds more than a few pieces the graph
    process keeps).  Returns the token and the number of pieces.
    """
    live = None
    try:
        live = await plugin.pieces()
        made, extra = head(live.head)
        first = pickle.dumps((made, len(extra), [*spooled.head, len(live)]))
    except BaseException:  # what the process keeps for this staging is let go
        spooled.release()
        if live is not None:
            live.release()
        raise
    return _staged(plugin, Pieces([first, *extra]), spooled, live)


async def _staged_piece(dask_scheduler: Any, token: str, index: int) -> bytes:
    return await _plugin(dask_scheduler).staged_piece(token, index)


def _load_on_scheduler(dask_scheduler: Any) -> dict[str, Any]:
    return _plugin(dask_scheduler).load.log.columns()


def _functions_on_scheduler(dask_scheduler: Any) -> dict[str, list]:
    return _plugin(dask_scheduler).functions.log.columns()


def _stats_on_scheduler(dask_scheduler: Any) -> dict[str, Any]:
    return _plugin(dask_scheduler).stats()
