"""The scheduler side: records computations and receives the workers' events.

Hooks only append a tuple to a queue, and the workers' batches join the queue
as they arrive, still in columns; a periodic callback turns the queue into
graph states, so the cost of analysis never sits inside a scheduler hook.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from crux_dask.build.builder import PAGBuilder
from crux_dask.codec import BatchError, decode_batch
from crux_dask.columns import EventColumns
from crux_dask.plugins import config
from crux_dask.plugins.protocol import EVENTS_HANDLER, PLUGIN_NAME, key_string

if TYPE_CHECKING:
    from distributed import Scheduler

    from crux_dask.store import PAGStore

logger = logging.getLogger(__name__)

#: Marks the queue entries recorded by the transition hook (the others are
#: workers' events, already in the builder's form).
_TASK = object()


class CruxSchedulerPlugin(SchedulerPlugin):
    """Build the program activity graph of everything the scheduler runs.

    Parameters
    ----------
    apply_interval : str or float, optional
        How often received events are turned into states
        (``crux-dask.apply-interval``).
    max_pending_events : int, optional
        Received events that trigger an immediate apply
        (``crux-dask.max-pending-events``).
    park_timeout : str or float, optional
        How long an event may wait for an unreported input
        (``crux-dask.park-timeout``).
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, apply_interval: str | float | None = None,
                 max_pending_events: int | None = None,
                 park_timeout: str | float | None = None,
                 max_transitions: int | None = None) -> None:
        self.apply_interval = config.seconds("apply-interval", apply_interval)
        self.max_pending_events = config.positive_int("max-pending-events",
                                                      max_pending_events)
        self.park_timeout = config.seconds("park-timeout", park_timeout)
        self.max_transitions = config.positive_int("max-transitions", max_transitions)
        token = config.get("http.token")
        if token is not None and (not isinstance(token, str) or len(token) < 8):
            raise ValueError("crux-dask.http.token must be a string of at least 8 characters")
        self.http_token: str | None = token
        self.http_max_body = config.positive_int("http.max-body-bytes")
        max_states = config.get("max-states")
        if max_states is not None and (isinstance(max_states, bool)
                                       or not isinstance(max_states, int) or max_states < 100):
            raise ValueError("crux-dask.max-states must be null or an integer of at least 100, "
                             f"got {max_states!r}")
        self.max_states: int | None = max_states
        self.spool_dir: str | None = config.get("spool-dir")
        self.record_transitions = bool(config.get("capture.transitions"))
        self.scheduler: Scheduler | None = None
        self.builder: PAGBuilder | None = None

    # -- lifecycle ----------------------------------------------------------
    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.builder = PAGBuilder()
        # Recorded here (tuples) and received from workers (EventColumns), in order.
        self.pending: deque[tuple | EventColumns] = deque()
        self.pending_events = 0
        self.graph_roots: dict[Any, int] = {}
        self.erred: dict[str, dict[str, Any]] = {}
        self.counts = dict.fromkeys(
            ["events_received", "events_from_workers", "events_applied", "events_failed",
             "batches_received", "batches_in_columns", "batches_rejected", "hook_errors",
             "http_accepted", "http_rejected"], 0)
        self.seconds = {"receive": 0.0, "apply": 0.0}
        self.transitions = TransitionLog(self.max_transitions)
        self.last_error: str | None = None
        self.attached_at = time.time()
        self.tasks_at_attach = len(scheduler.tasks)
        if self.tasks_at_attach:
            logger.info("Crux attached to a running scheduler with %d tasks: it records "
                        "what happens from now on", self.tasks_at_attach)
        self.builder.root(self.attached_at, "attach")
        self.spooled: list[tuple[str, Any]] = []  # (run id, future of its write)
        self.spooled_states = 0
        self.lost_before = 0
        self._spooler = None
        scheduler.handlers[EVENTS_HANDLER] = self.receive_events
        from crux_dask.dashboard import install

        self.dashboard = install(scheduler, self)
        self._callback = PeriodicCallback(self._apply_safely, self.apply_interval * 1000)
        scheduler.periodic_callbacks["crux-apply"] = self._callback
        self._callback.start()

    async def close(self) -> None:
        if getattr(self, "_spooler", None) is not None:
            self._spooler.shutdown(wait=True)
        callback = getattr(self, "_callback", None)
        if callback is not None:
            callback.stop()
        if self.scheduler is not None:
            self.scheduler.periodic_callbacks.pop("crux-apply", None)

    # -- hooks: record, nothing more ------------------------------------------
    def update_graph(self, scheduler: Scheduler, *, tasks: list | None = None,
                     **kwargs: Any) -> None:
        try:
            root = self.builder.root(time.time(), "graph")
            roots = self.graph_roots
            for key in tasks or ():
                roots[key] = root
        except Exception as error:
            self._hook_failed("update_graph", error)

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        try:
            self.pending.append(("lost", worker, time.time()))
            self.pending_events += 1
            self.counts["events_received"] += 1
        except Exception as error:
            self._hook_failed("remove_worker", error)

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   stimulus_id: str | None = None, **kwargs: Any) -> None:
        try:
            if self.record_transitions:
                self.transitions.append(key, start, finish, kwargs.get("worker"), stimulus_id)
            if start != "processing" or finish not in ("memory", "erred"):
                if finish == "forgotten":  # never ran, or ran already: its root is not needed
                    self.graph_roots.pop(key, None)
                return
            ts = self.scheduler.tasks.get(key)
            if ts is None:
                return
            annotation = ts.annotations.get("crux") if ts.annotations else None
            self.pending.append((
                _TASK, key, finish, kwargs.get("worker"), kwargs.get("thread"),
                kwargs.get("startstops"), kwargs.get("nbytes") or 0,
                [dts.key for dts in ts.dependencies], ts.prefix.name, ts.group.name,
                annotation, self.graph_roots.pop(key, -1),
            ))
            if finish == "erred":
                self.erred[key_string(key)] = {
                    "worker": kwargs.get("worker"), "time": time.time(),
                    "exception": kwargs.get("exception_text"),
                }
            self.counts["events_received"] += 1
            self.pending_events += 1
            if self.pending_events >= self.max_pending_events:
                self._apply_safely()
        except Exception as error:
            self._hook_failed("transition", error)

    def receive_events(self, batch: bytes | None = None, **kwargs: Any) -> dict[str, Any]:
        """RPC handler for the workers' event batches; never raises."""
        self.counts["batches_received"] += 1
        started = time.perf_counter()
        try:
            decoded = decode_batch(batch)
        except BatchError as error:
            self.counts["batches_rejected"] += 1
            self.last_error = f"batch rejected: {error}"
            logger.debug("Crux rejected a batch from %s: %s", kwargs.get("source"), error)
            return {"status": "rejected", "error": str(error)}
        if decoded.columns is not None:
            self.pending.append(decoded.columns)
            self.counts["batches_in_columns"] += 1
        else:
            self.pending.extend(decoded.rows)
        n = len(decoded)
        self.pending_events += n
        self.counts["events_received"] += n
        self.counts["events_from_workers"] += n
        self.seconds["receive"] += time.perf_counter() - started
        if self.pending_events >= self.max_pending_events:
            self._apply_safely()
        return {"status": "OK", "accepted": n}

    # -- analysis, off the hooks ---------------------------------------------
    def apply_pending(self, final: bool = False) -> None:
        """Turn every received event into states.

        With ``final``, events still waiting for an input that was never
        reported get the best stand-in now, instead of after the park timeout.
        """
        started = time.perf_counter()
        builder = self.builder
        pending = self.pending
        now = time.monotonic()
        failed = 0
        events: list[tuple] = []

        def refuse(event: Any, error: Exception) -> None:  # one bad event never stops others
            nonlocal failed
            failed += 1
            self.last_error = f"{type(error).__name__}: {error}"

        received = self.pending_events
        self.pending_events = 0
        parts: list[EventColumns] = []  # runs of events, applied together
        events: list[tuple] = []
        while pending:
            item = pending.popleft()
            if isinstance(item, EventColumns):
                if events:
                    parts.append(EventColumns.from_events(events))
                    events = []
                parts.append(item)
            elif item[0] is _TASK:
                try:
                    events.append(self._compute_event(item))
                except Exception as error:
                    refuse(item, error)
            elif item[0] == "lost":  # a worker left: what it held is gone
                self._apply_parts(parts, events, now, refuse)
                parts, events = [], []
                try:
                    builder.lose(item[1], item[2])
                except Exception as error:
                    refuse(item, error)
            else:
                events.append(item)
        self._apply_parts(parts, events, now, refuse)
        applied = received - failed
        builder.resolve_parked(None if final else now - self.park_timeout)
        # Spool only when it frees room: data workers still hold stays referenced.
        if (self.max_states is not None and builder.store.n_states > self.max_states
                and builder.store.n_states - builder.n_live > self.max_states // 2):
            self._spool()
        self.counts["events_applied"] += applied
        self.counts["events_failed"] += failed
        self.seconds["apply"] += time.perf_counter() - started

    def _apply_parts(self, parts: list[EventColumns], events: list[tuple], now: float,
                     refuse: Any) -> None:
        """Apply batches received in columns, then ``events``, as one run."""
        if not parts:
            self.builder.apply_many(events, now, on_error=refuse)
            return
        if events:
            parts.append(EventColumns.from_events(events))
        self.builder.apply_columns(EventColumns.concat(parts), now, on_error=refuse)

    def _spool(self) -> None:
        """Write the graph so far to the spool directory and go on in a new segment.

        The write runs in a thread, off the event loop; the data still held by
        workers carries over to the new segment, so later events find it.
        """
        import concurrent.futures
        import tempfile

        from crux_dask.pag import PAG
        from crux_dask.provenance import write_dataset

        old = self.builder
        if self.spool_dir is None:
            self.spool_dir = tempfile.mkdtemp(prefix="crux-spool-")
        if self._spooler is None:
            self._spooler = concurrent.futures.ThreadPoolExecutor(1, "crux-spool")
        pag = PAG([old.store], [old.end])
        self.spooled.append((old.run_id, self._spooler.submit(write_dataset, self.spool_dir,
                                                                pag)))
        self.spooled_states += old.store.n_states
        self.lost_before += old.n_lost
        new = PAGBuilder()
        new.continue_from(old, time.time())
        self.builder = new
        logger.info("Crux spooled %d states to %s; the live graph now holds only what "
                    "came after", old.store.n_states, self.spool_dir)

    def spooled_stores(self) -> list[PAGStore]:
        """The segments written to the spool, read back (waits for pending writes)."""
        from crux_dask.provenance import read_dataset

        stores = []
        for run_id, write in self.spooled:
            write.result()
            stores += read_dataset(self.spool_dir, run_id).stores
        return stores

    def _apply_safely(self) -> None:
        try:
            self.apply_pending()
        except Exception as error:
            self._hook_failed("apply", error)

    def _compute_event(self, item: tuple) -> tuple:
        (_, key, finish, worker, thread, startstops, nbytes, dependencies, prefix, group,
         annotation, root) = item
        start = stop = None
        for interval in startstops or ():
            if interval.get("action") == "compute":
                start, stop = interval["start"], interval["stop"]
        if stop is None:
            start = stop = time.time()
        kind = label = location = reads = None
        if isinstance(annotation, dict):
            kind = annotation.get("mutation")
            label = annotation.get("label")
            location = annotation.get("location")
            reads = annotation.get("reads")
            reads = tuple(reads) if isinstance(reads, (list, tuple)) else None
        return ("compute", key_string(key), worker, thread, start, stop,
                0 if finish == "erred" else nbytes,
                tuple(key_string(d) for d in dependencies), root,
                label or prefix, group, kind, location,
                "erred" if finish == "erred" else None, reads)

    def _hook_failed(self, where: str, error: Exception) -> None:
        self.counts["hook_errors"] += 1
        if self.counts["hook_errors"] == 1:
            logger.warning("Crux %s hook failed (further failures are only counted): %r",
                           where, error)
        self.last_error = f"{where}: {type(error).__name__}: {error}"

    # -- queries --------------------------------------------------------------
    def snapshot(self) -> tuple[PAGStore, int]:
        """A copy of the graph so far and its end state."""
        return self.builder.store.copy(), self.builder.end

    def transitions_frame(self) -> pd.DataFrame:
        """The scheduler transitions recorded (the newest ``max-transitions``)."""
        return self.transitions.frame()

    def stats(self) -> dict[str, Any]:
        """Counts of what was received, applied and rejected, and the graph's size."""
        builder = self.builder
        return {
            **self.counts,
            "seconds_receiving": self.seconds["receive"],
            "seconds_applying": self.seconds["apply"],
            "events_pending": self.pending_events,
            "events_parked": builder.n_parked,
            "events_parked_total": builder.n_parked_total,
            "inputs_substituted": builder.n_fallbacks,
            "states_lost": builder.n_lost + self.lost_before,
            "states": builder.store.n_states,
            "states_spooled": self.spooled_states,
            "segments_spooled": len(self.spooled),
            "spool_dir": self.spool_dir,
            "mutations": builder.store.n_mutations,
            "memory_bytes": builder.store.nbytes(),
            "erred_tasks": len(self.erred),
            "transitions_recorded": len(self.transitions),
            "transitions_dropped": self.transitions.dropped,
            "run_id": builder.run_id,
            "attached_at": self.attached_at,
            "tasks_at_attach": self.tasks_at_attach,
            "last_error": self.last_error,
        }


class TransitionLog:
    """Scheduler transitions in columns, the newest ``capacity`` of them.

    Columns rather than a tuple per transition: the scheduler process holds
    many objects already, and every container added is one more for its
    garbage collector to walk.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.dropped = 0
        self._clear()

    def _clear(self) -> None:
        self.keys: list[Any] = []
        self.starts: list[str] = []
        self.finishes: list[str] = []
        self.times = array("d")
        self.workers: list[str | None] = []
        self.stimuli: list[str | None] = []

    def __len__(self) -> int:
        return len(self.keys)

    def append(self, key: Any, start: str, finish: str, worker: str | None,
               stimulus_id: str | None) -> None:
        if len(self.keys) >= self.capacity:
            self._drop_oldest_half()
        self.keys.append(key)
        self.starts.append(start)
        self.finishes.append(finish)
        self.times.append(time.time())
        self.workers.append(worker)
        self.stimuli.append(stimulus_id)

    def _drop_oldest_half(self) -> None:
        half = max(1, self.capacity // 2)
        self.dropped += half
        for column in (self.keys, self.starts, self.finishes, self.times, self.workers,
                       self.stimuli):
            del column[:half]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({
            "key": [key_string(k) for k in self.keys],
            "start": self.starts, "finish": self.finishes,
            "time": np.frombuffer(self.times, dtype="float64").copy() if self.times else
            np.empty(0), "location": self.workers, "stimulus_id": self.stimuli,
        })
