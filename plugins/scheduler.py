"""The scheduler side: records computations and receives the workers' events.

Hooks only append a tuple to the graph host's queue, and the workers' batches
join the queue as they arrive, still in columns; the host turns the queue into
graph states, in a process of its own or from a periodic callback a bounded
slice at a time, and answers what is asked of the graph off the event loop
(:class:`~crux_dask.plugins.host.GraphHost`), so the cost of analysis never sits
inside a scheduler hook or a dashboard request.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from crux_dask.graph.builder import PAGBuilder
from crux_dask.plugins import config
from crux_dask.plugins.entries import Done, Lost, Sent, Whole
from crux_dask.plugins.functions import FunctionRecorder
from crux_dask.plugins.graph_process import GraphProcess
from crux_dask.plugins.host import GraphHost, LocalHost, Progress
from crux_dask.plugins.load import LoadSampler
from crux_dask.plugins.protocol import (
    EVENTS_HANDLER,
    FILES_HANDLER,
    PLUGIN_NAME,
    REPORTED,
    key_string,
)
from crux_dask.plugins.spool import Spool
from crux_dask.plugins.staging import KeptPieces, Pieces, Staging
from crux_dask.plugins.transitions import TransitionLog, chunks_of_log

if TYPE_CHECKING:
    from distributed import Scheduler

    from crux_dask.pag import PAG
    from crux_dask.scopes import Scope

logger = logging.getLogger(__name__)

__all__ = ["CruxSchedulerPlugin"]

#: Graphs staged for clients and not fetched yet, at most.
STAGED_MAX = 4


class CruxSchedulerPlugin(SchedulerPlugin):
    """Build the program activity graph of everything the scheduler runs.

    Parameters
    ----------
    apply_interval : str or float, optional
        How often received events are turned into states
        (``crux-dask.apply-interval``).
    max_pending_events : int, optional
        Received events past which applying them is scheduled at once
        (``crux-dask.max-pending-events``).
    park_timeout : str or float, optional
        How long an event may wait for an unreported input
        (``crux-dask.park-timeout``).
    max_transitions : int, optional
        Scheduler transitions kept for the export, if every one is recorded
        (``crux-dask.max-transitions``, ``crux-dask.capture.transitions``).

    Attributes
    ----------
    host : GraphHost
        The graph's host: the queue of received events, and what applies them
        and answers questions, in a process of its own (``crux-dask.graph-process``)
        or in the scheduler's (once started).
    spool : Spool
        The segments of the graph written to disk (once started).
    settings : ~crux_dask.plugins.config.Settings
        What it runs with: the parameters given, else the configured keys.
    graph_roots : dict
        Root state of each task submitted that has not run yet.
    erred : dict of str to dict
        Worker, time and exception of each task that failed.
    functions : ~crux_dask.plugins.functions.FunctionRecorder
        The function each task group received runs (once started).

    Notes
    -----
    The dashboard uses only :meth:`progress`, :meth:`analyse`, :meth:`stats`,
    :meth:`add_external`, :meth:`count_http_write`, :meth:`spooled_runs`,
    :meth:`read_spooled`, :meth:`scopes`, :attr:`settings` and :attr:`functions`.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, apply_interval: str | float | None = None,
                 max_pending_events: int | None = None,
                 park_timeout: str | float | None = None,
                 max_transitions: int | None = None) -> None:
        self.settings = config.Settings.read(apply_interval, max_pending_events,
                                             park_timeout, max_transitions)
        self.scheduler: Scheduler | None = None

    # -- lifecycle ----------------------------------------------------------
    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        settings = self.settings
        self.spool = Spool(settings.max_states, settings.spool_dir)
        if settings.graph_process and os.name == "posix":  # it passes pipes to a child
            self.host: GraphHost = GraphProcess(self.spool, {
                "max_pending": settings.max_pending_events,
                "park_timeout": settings.park_timeout, "max_states": settings.max_states,
                "spool_dir": settings.spool_dir, "apply_interval": settings.apply_interval})
            self.host.start()
        else:
            self.host = LocalHost(PAGBuilder(), self.spool,
                                  max_pending=settings.max_pending_events,
                                  park_timeout=settings.park_timeout)
        self.graph_roots: dict[Any, int] = {}
        # The last task-finished: its stimulus, and the task and worker it freed.
        self.last_finished: tuple[str | None, str, str] = (None, "", "")
        self.erred: dict[str, dict[str, Any]] = {}
        # Graphs cut into pieces for clients to fetch: token -> staging.
        self.staged: OrderedDict[str, Staging] = OrderedDict()
        self.http_writes = {"accepted": 0, "rejected": 0}
        self.transitions = TransitionLog(settings.max_transitions)
        self.attached_at = time.time()
        self.tasks_at_attach = len(scheduler.tasks)
        self.transitions_at_attach = scheduler.transition_counter
        if self.tasks_at_attach:
            logger.info("Crux attached to a running scheduler with %d tasks: it records "
                        "what happens from now on", self.tasks_at_attach)
        self.host.root(self.attached_at, "attach")
        scheduler.handlers[EVENTS_HANDLER] = self.host.receive
        scheduler.handlers[FILES_HANDLER] = self.host.receive_files
        self.extensions = install_extensions(scheduler, self)
        self.load, self.functions = LoadSampler(scheduler), FunctionRecorder(scheduler)
        self._callbacks = {
            "crux-apply": PeriodicCallback(self.host.tick, settings.apply_interval * 1000),
            "crux-load": self.load.callback}
        for name, callback in self._callbacks.items():
            scheduler.periodic_callbacks[name] = callback
            callback.start()

    async def close(self) -> None:
        for name, callback in getattr(self, "_callbacks", {}).items():
            callback.stop()
            self.scheduler.periodic_callbacks.pop(name, None)
        for staging in getattr(self, "staged", {}).values():  # never to be fetched now
            staging.release()
        if getattr(self, "host", None) is not None:
            await self.host.close()
        if getattr(self, "spool", None) is not None:
            self.spool.close(remove_temporary=True)

    # -- hooks: record, nothing more ------------------------------------------
    def update_graph(self, scheduler: Scheduler, *, tasks: list | None = None,
                     **kwargs: Any) -> None:
        try:
            root = self.host.root(time.time(), "graph")
            roots = self.graph_roots
            for key in tasks or ():
                roots[key] = root
            self.functions.record(tasks or ())  # never raises
        except Exception as error:
            self.host.failed("update_graph", error)

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        try:
            self.host.record(Lost(worker, time.time()))
        except Exception as error:
            self.host.failed("remove_worker", error)

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   stimulus_id: str | None = None, **kwargs: Any) -> None:
        # What only the scheduler knows of a task is recorded as it is sent; what its
        # worker knows, the worker reports (see crux_dask.plugins.tasks).
        try:
            if self.settings.record_transitions:  # for the export
                self.transitions.record(key, start, finish, stimulus_id)
            if finish == "processing":  # sent to a worker, perhaps for a freed queue slot
                stimulus, freed_by, freed_on = self.last_finished
                entry: tuple = Sent(key, time.time(), (freed_by, freed_on) if (
                    start == "queued" and stimulus == stimulus_id) else None,
                    self.graph_roots.pop(key, -1))
            elif start != "processing" or finish not in ("memory", "erred"):
                if finish == "forgotten":  # never ran: its root is not needed
                    self.graph_roots.pop(key, None)
                return
            else:
                entry = self._finished(key, finish, kwargs.get("worker"), stimulus_id, kwargs)
                if entry is None:
                    return
            ingest = self.host
            ingest.queue.append(entry)
            ingest.pending += 1
            if ingest.pending >= ingest.max_pending:
                ingest.apply_soon()  # only scheduled: the hook itself applies nothing
        except Exception as error:
            self.host.failed("transition", error)

    def _finished(self, key: Any, finish: str, worker: str | None, stimulus_id: str | None,
                  kwargs: dict[str, Any]) -> tuple | None:
        """The queue entry of a task that finished (in memory or erred) on ``worker``: that
        it did, if its worker reports the rest, else the whole task."""
        self.last_finished = (stimulus_id, key, worker)
        if self.settings.record_transitions:
            self.transitions.finished(worker)
        if finish == "memory":
            metadata = kwargs.get("metadata")
            if metadata and REPORTED in metadata:  # its worker reports the rest
                return Done(key, worker, time.time(), kwargs.get("nbytes") or 0)
        else:
            self.erred[key_string(key)] = {
                "worker": worker, "time": time.time(),
                "exception": kwargs.get("exception_text"),
            }
        ts = self.scheduler.tasks.get(key)
        if ts is None:
            return None
        return Whole(key, finish, worker, kwargs.get("thread"), kwargs.get("startstops"),
                kwargs.get("nbytes") or 0, [dts.key for dts in ts.dependencies],
                ts.prefix.name, ts.group.name,
                ts.annotations.get("crux") if ts.annotations else None, ts.priority,
                kwargs.get("metadata"), time.time())

    # -- what the client API and the dashboard use --------------------------------
    def progress(self) -> Progress:
        """How far the graph being recorded got (its size, end state and the builder's
        counts), as known on the scheduler: nothing is asked."""
        return self.host.progress()

    @property
    def counts(self) -> dict[str, int]:
        """Events and batches received, applied and rejected; hook errors; HTTP writes."""
        return {**self.host.counts, "events_received": self.host.received,
                "http_accepted": self.http_writes["accepted"],
                "http_rejected": self.http_writes["rejected"]}

    async def add_external(self, kind: str, **fields: Any) -> int:
        """Add a mutation reported by an application outside Dask; return the new state's id.

        Applied at once, on the graph applied so far, as
        :meth:`crux_dask.graph.PAGBuilder.external` does (``ValueError`` for
        an unknown source state or kind); the state is applied when this returns.
        """
        return await self.host.external(kind, **fields)

    def count_http_write(self, accepted: bool) -> None:
        """Count one write request of the JSON API, accepted or rejected."""
        self.http_writes["accepted" if accepted else "rejected"] += 1

    def spooled_runs(self) -> list[str]:
        """Run ids of the segments spooled to disk, oldest first."""
        return self.spool.run_ids

    def read_spooled(self, run_id: str) -> Future[PAG]:
        """Read the spooled segment ``run_id`` back, off the event loop.

        Returns a :class:`concurrent.futures.Future` of its
        :class:`~crux_dask.pag.PAG`; raises ``KeyError`` for an unknown run.
        """
        return self.spool.read(run_id)

    async def spooled_pieces(self) -> Pieces | KeptPieces:
        """Every spooled segment, read back and cut into pieces
        (:meth:`PAGStore.to_pieces`), oldest first; their head: how many pieces
        each segment's store has (see :meth:`GraphHost.spooled_pieces`)."""
        return await self.host.spooled_pieces()

    async def transition_chunks(self) -> list[tuple[tuple, ...]]:
        """The scheduler's transitions for the export, as the chunks of
        :meth:`~crux_dask.plugins.transitions.TransitionLog.in_chunks`.

        Every one recorded, if ``crux-dask.capture.transitions`` is on; else the
        newest distributed keeps in its own log (``Scheduler.transition_log``, the
        newest ``distributed.admin.low-level-log-length``), which costs nothing
        while the scheduler runs (recording each in the hook cost it about 1-2 % of its
        CPU on tiny tasks), and are made into chunks in a thread.
        """
        if self.settings.record_transitions:
            return self.transitions.in_chunks()
        entries = list(self.scheduler.transition_log)
        return await asyncio.get_running_loop().run_in_executor(None, chunks_of_log, entries)

    def transitions_dropped(self) -> int:
        """Transitions since Crux attached that the export will not have: dropped past
        ``max-transitions`` if recorded, else no longer in distributed's own log."""
        if self.settings.record_transitions:
            return self.transitions.dropped
        scheduler = self.scheduler
        return max(0, scheduler.transition_counter - self.transitions_at_attach
                   - len(scheduler.transition_log))

    def scopes(self) -> list[Scope]:
        """The computations and spans the scheduler remembers, oldest first."""
        from crux_dask.plugins.scopes import computations, spans

        return computations(self.scheduler) + spans(self.scheduler)

    async def analyse(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(store, end, *args)`` on the graph applied so far, off the event loop
        (see :meth:`GraphHost.ask`)."""
        return await self.host.ask(function, *args)

    async def pieces(self) -> Pieces | KeptPieces:
        """The graph applied so far, cut into pieces (:meth:`PAGStore.to_pieces`); their
        head: its end state (see :meth:`GraphHost.pieces`)."""
        return await self.host.pieces()

    def stage(self, parts: list[Pieces | KeptPieces]) -> str:
        """Keep ``parts`` for a client to fetch one piece at a time, as one
        :class:`~crux_dask.plugins.staging.Staging`; their token.

        The oldest of more than :data:`STAGED_MAX` stagings is let go (a client
        that went away before it fetched everything).
        """
        token = uuid.uuid4().hex
        self.staged[token] = Staging(parts)
        while len(self.staged) > STAGED_MAX:
            self.staged.popitem(last=False)[1].release()
        return token

    async def staged_piece(self, token: str, index: int) -> bytes:
        """Piece ``index`` of a staging; the staging goes with its last piece.

        Raises
        ------
        KeyError
            If the staging is unknown or was let go.
        GraphProcessGone
            If the process that keeps the pieces is gone (the staging goes too).
        """
        staging = self.staged[token]
        last = index == len(staging) - 1
        try:
            return await staging.fetch(index)
        except Exception:  # the client is told; it stages again if it can
            last = True
            raise
        finally:
            if last:
                self.staged.pop(token, None)
                staging.release()

    def stats(self) -> dict[str, Any]:
        """Counts of what was received, applied and rejected, and the graph's size."""
        ingest = self.host
        progress, sizes = ingest.progress(), ingest.sizes()
        return {
            **self.counts,
            "seconds_receiving": ingest.seconds["receive"],
            "seconds_applying": ingest.seconds["apply"],
            "longest_slice_seconds": ingest.seconds["longest_slice"],
            "events_pending": sizes["events_pending"],
            "events_parked": progress.n_parked,
            "events_parked_total": progress.n_parked_total,
            "inputs_substituted": progress.n_fallbacks,
            "states_lost": progress.n_lost + self.spool.n_lost,
            "states": progress.n_states, "states_spooled": self.spool.n_states,
            "segments_spooled": len(self.spool.run_ids), "spool_dir": self.spool.directory,
            "mutations": progress.n_mutations,
            "memory_bytes": progress.nbytes,
            "erred_tasks": len(self.erred),
            "transitions_recorded": len(self.transitions),
            "transitions_dropped": self.transitions_dropped(),
            "load_samples": len(self.load.log), "load_dropped": self.load.log.dropped,
            **self.functions.counts,
            "run_id": progress.run_id,
            "attached_at": self.attached_at,
            "tasks_at_attach": self.tasks_at_attach,
            "last_error": ingest.last_error,
            "graph_process": sizes["graph_process"],
        }


#: The entry point group of what a scheduler plugin installs beside itself, each
#: ``install(scheduler, plugin) -> bool`` (Crux's own: the dashboard's pages and routes).
EXTENSIONS = "crux_dask.scheduler"


def install_extensions(scheduler: Scheduler, plugin: CruxSchedulerPlugin) -> dict[str, bool]:
    """Install each extension of :data:`EXTENSIONS` (found by name: they are the layers
    above this one); what each said, by name.  One that fails is logged and skipped."""
    installed = {}
    for entry in importlib.metadata.entry_points(group=EXTENSIONS):
        try:
            installed[entry.name] = bool(entry.load()(scheduler, plugin))
        except Exception as error:  # an extension is optional; the recording is not
            logger.warning("Crux could not install %s: %r", entry.name, error)
            installed[entry.name] = False
    return installed
