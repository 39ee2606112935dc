"""The worker plugin: its life cycle, its transition hook, and what a client runs on it.

What only a worker sees is recorded by :class:`CruxWorkerPlugin` and sent to
the scheduler in batches.  The plugin is assembled from the parts that do each
job (mixins, so that a hook reaches each part's methods and state on the
plugin itself, with no indirection), and sets up and tears down their state:

* the transition hook (here), which notes when each task reached the worker
  and when its inputs were all there, and hands on what else it sees;
* the reports of the tasks it finished, and of the files they opened
  (:mod:`crux_dask.plugins.task_reports`);
* the moves of its data: fetched, gathered by clients, spilled, loaded back,
  released (:mod:`crux_dask.plugins.data_moves`);
* the shards P2P shuffles send (:mod:`crux_dask.plugins.shuffles`);
* the buffers and their sends (:mod:`crux_dask.plugins.batches`), whose round
  trips give the scheduler's clock (:mod:`crux_dask.plugins.round_trips`).

The plugin is a guest: it replaces none of the worker's handlers (data a
client gathered is read from the worker's own log of outgoing transfers; the
shuffle runs it watches are wrapped on the instance, and unwrapped), and
its teardown never waits on a scheduler that is gone -- what it could not
send stays in its buffer and is counted (``events_unsent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from dask.system import CPU_COUNT
from distributed.diagnostics.plugin import WorkerPlugin
from tornado.ioloop import PeriodicCallback

from crux_dask.model import CLIENT, disk_location, memory_location
from crux_dask.plugins import config
from crux_dask.plugins.data_moves import DataMoves
from crux_dask.plugins.protocol import (
    CORES_METRIC,
    CPU_TIME_METRIC,
    PLUGIN_NAME,
    REPORTED,
    key_string,
)
from crux_dask.plugins.shuffles import ShardRecorder
from crux_dask.plugins.task_reports import TaskReports

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger(__name__)

#: The default bound of the teardown's last send, in seconds.
TEARDOWN_TIMEOUT = 0.5


class CruxWorkerPlugin(TaskReports, DataMoves, WorkerPlugin):
    """Record a worker's tasks, transfers, spills and releases for the scheduler's graph.

    Parameters
    ----------
    flush_interval : str or float, optional
        How often buffered events are sent (``crux-dask.flush-interval``).  By
        default (``null``) every 2 s, or as often as the worker sends its
        heartbeat where distributed spaces heartbeats out further (clusters of
        more than 200 workers), at most every half ``park-timeout``: the
        scheduler receives Crux's batches no more often than the workers'
        heartbeats, and each batch costs it an RPC.
    batch_size : int, optional
        Buffered events that trigger a send (``crux-dask.batch-size``).
    max_buffered_events : int, optional
        Events kept while the scheduler cannot take them
        (``crux-dask.max-buffered-events``).
    teardown_timeout : float, optional
        The longest the teardown waits to send what is buffered to a scheduler
        that is still there (``TEARDOWN_TIMEOUT``).  To a scheduler that is
        gone it sends nothing.

    Notes
    -----
    Data gathered by a client (directly, or through the scheduler) is read
    from the worker's ``transfer_outgoing_log``, on each flush and before each
    release, rather than by wrapping the ``get_data`` handler.  The log must be
    enabled (``distributed.admin.low-level-log-length`` not 0); if it drops
    entries before they are read (more than its length between two flushes),
    ``transfer_log_overruns`` counts it.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, flush_interval: str | float | None = None,
                 batch_size: int | None = None,
                 max_buffered_events: int | None = None,
                 teardown_timeout: float = TEARDOWN_TIMEOUT) -> None:
        self.flush_interval = config.optional_seconds("flush-interval", flush_interval)
        self.batch_size = config.positive_int("batch-size", batch_size)
        self.max_buffered_events = config.positive_int("max-buffered-events",
                                                       max_buffered_events)
        self.capture = dict(config.get("capture"))
        self.file_patterns = (config.patterns("files.include"),
                              config.patterns("files.exclude"))
        if not teardown_timeout >= 0:
            raise ValueError(f"teardown_timeout must be >= 0, got {teardown_timeout!r}")
        self.teardown_timeout = float(teardown_timeout)
        # An event the scheduler has waits for the reports of the same moment as long
        # as park-timeout: they must come well within it, in clusters of thousands too.
        self._longest_period = config.seconds("park-timeout") * 1000 / 2

    # -- lifecycle ----------------------------------------------------------
    async def setup(self, worker: Worker) -> None:
        self.worker = worker
        self.memory = memory_location(worker.address)
        self.disk = disk_location(worker.address)
        self._start_batches()
        # The scheduler's clock: distributed's estimate as a start, until a send's
        # round trip bounds it better.
        self._start_clock(worker)
        # Tasks that reached this worker, to report when they finish: key ->
        # [when they arrived, when their inputs were all here, distributed's offset
        # as the task started (the one its start and stop are converted with)].
        self._moments: dict[Any, list] = {}
        self.counts = dict.fromkeys(
            ["events_recorded", "events_sent", "events_dropped", "events_unsent",
             "batches_sent", "batches_rejected", "send_failures", "hook_errors",
             "transfer_log_overruns", "file_lists_dropped", "file_lists_unsent"], 0)
        # The capture switches, read once: the hooks test them on every call.
        self._transfers = bool(self.capture.get("transfers", True))
        self._deletes = bool(self.capture.get("deletes", True))
        self._start_data(worker)
        self._start_files(worker)
        self._start_cpu()
        self.shards: ShardRecorder | None = None
        if self.capture.get("shuffles", True):
            self.shards = ShardRecorder(worker, self._record, self._now)
            self.shards.start()
        self._callback = PeriodicCallback(self._flush_soon, self._flush_period())
        self._callback.start()
        worker.metrics[CORES_METRIC] = _cores  # sent with each heartbeat
        worker.metrics[CPU_TIME_METRIC] = _cpu_time
        self._probing = asyncio.ensure_future(self._probe_clock())

    async def teardown(self, worker: Worker) -> None:
        """Stop recording; send what is buffered if the scheduler is still there.

        Never waits on a scheduler that is gone, and at most
        ``teardown_timeout`` seconds on one that does not answer: what could
        not be sent stays in :attr:`buffer` and :attr:`reports`, counted as
        ``events_unsent`` (and the files of tasks as ``file_lists_unsent``).
        """
        self._callback.stop()
        worker.metrics.pop(CORES_METRIC, None)
        worker.metrics.pop(CPU_TIME_METRIC, None)
        if not self._probing.done():  # a scheduler that does not answer: stop asking
            self._probing.cancel()
            await asyncio.wait([self._probing])
        tasks = worker.state.tasks
        for key in self._moments:  # tasks under way: the scheduler records them now
            ts = tasks.get(key)
            if ts is not None:
                ts.metadata.pop(REPORTED, None)
        self._moments.clear()
        if self.files is not None:
            self.files.stop()
        if self.shards is not None:
            self.shards.stop()
        self._unhook_spill()
        self._clocks.close()
        if self._transfers:
            self._poll_gathers()
        if (self.buffer or self.reports or self._files_out or self._sizing) and (
                self._scheduler_connected()):
            with contextlib.suppress(TimeoutError):  # what is left is counted below
                await asyncio.wait_for(self.flush(), self.teardown_timeout)
        sending = self._sending
        if sending is not None:  # a send the scheduler did not answer: stop waiting
            sending.cancel()
            await asyncio.wait([sending])
        if self._sizer is not None:  # files not sized by now are counted below
            self._sizer.shutdown(wait=False, cancel_futures=True)
        self.counts["events_unsent"] = len(self.buffer) + len(self.reports)
        self.counts["file_lists_unsent"] = len(self._files_out) + len(self._sizing)
        if self.counts["events_unsent"]:
            logger.info("Crux: %d events recorded on %s could not be sent to the scheduler "
                        "(counted as events_unsent)", self.counts["events_unsent"],
                        worker.address)

    # -- hooks ----------------------------------------------------------------
    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        # Most transitions (waiting, ready, executing...) need nothing: test the
        # few that do, cheapest first.
        try:
            if finish == "memory":
                if start == "executing" or start == "long-running":
                    moments = self._moments.pop(key, None)
                    if moments is not None:
                        self._report(key, moments)
                elif start == "flight":
                    self._fetched(key)
                elif start == "released" and self._transfers:
                    now = self._now()
                    self._record(("transfer", key_string(key), CLIENT, self.memory, now, now,
                                  self._nbytes(key)))
            elif start == "memory":
                if finish == "released" and self._deletes:
                    self._released(key)
            elif finish == "executing":  # the offset the task's start and stop will have
                moments = self._moments.get(key)
                if moments is not None:
                    moments[2] = self.worker.scheduler_delay
            elif finish == "ready":  # all inputs here: runnable from now on
                moments = self._moments.get(key)
                if moments is not None:
                    moments[1] = self._now()
            elif start == "released":
                if finish == "waiting":  # the task reached this worker: it reports it
                    self._moments[key] = [self._now(), None, None]
                    self.worker.state.tasks[key].metadata[REPORTED] = 1
                elif finish == "fetch":
                    self._requested.setdefault(key, self._now())
            elif finish == "flight":
                ts = self.worker.state.tasks.get(key)
                self._flight_start[key] = (ts.coming_from if ts else None, self._now())
            elif finish in ("released", "forgotten", "missing", "error", "rescheduled"):
                self._moments.pop(key, None)
                self._flight_start.pop(key, None)
                self._requested.pop(key, None)
                if self.files is not None and key in self.files.by_task:
                    self.files.forget(key)
                if self.shards is not None and key in self.shards.by_task:
                    self.shards.forget(key)
        except Exception as error:
            self._hook_failed(error)

    def stats(self) -> dict[str, Any]:
        """What this worker recorded, sent, dropped and could not send.

        ``events_dropped`` were given up (the buffer was full, or the scheduler
        refused them); ``events_unsent`` were still buffered when the plugin
        was torn down, and stay in :attr:`buffer` and :attr:`reports`.
        ``files_recorded`` are the files tasks opened and the scheduler was
        told of, ``files_gone`` those
        left out because they were gone when their task was done.  The
        files of a task sized after its completion (``file_lists_*``) that
        the scheduler refused are ``dropped``; those still being sized or
        sent when the plugin was torn down are ``unsent``.  ``shard_errors``
        count shards of P2P shuffles that could not be recorded (the shuffle
        itself went on).  ``clock_offset`` is what this worker adds to its
        clock to read the scheduler's, within ``clock_bound`` seconds (infinite
        before its first round trip to the scheduler).
        """
        files = self.files
        return {**self.counts, "events_buffered": len(self.buffer) + len(self.reports),
                "files_recorded": files.opened_files if files else 0,
                "files_gone": files.gone if files else 0,
                "shard_errors": self.shards.errors if self.shards else 0,
                "clock_offset": self.offset, "clock_bound": self.clock.bound}


def _cores(worker: Worker) -> int:
    """The cores of the worker's host, as Dask counts them (its affinity and limits)."""
    return CPU_COUNT


def _cpu_time(worker: Worker) -> float:
    """The CPU seconds the worker's process has used, all its threads."""
    return time.process_time()


# -- what the client runs on each worker ------------------------------------------
# Here, not with the client API: a function a client runs is imported by the
# worker from its module, and this one the worker has loaded already (the
# client API would load pandas and the graph's modules into every worker).
async def flush_worker(dask_worker: Worker) -> bool:
    """Send what the worker's plugin buffered (see :meth:`CruxWorkerPlugin.flush`)."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return True if plugin is None else await plugin.flush()


def worker_stats(dask_worker: Worker) -> dict[str, Any]:
    """The worker's plugin's counts (:meth:`CruxWorkerPlugin.stats`); empty without it."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return {} if plugin is None else plugin.stats()
