"""The worker side: what only a worker sees, sent to the scheduler in batches.

Recorded here: each task this worker finished (what distributed's scheduler
knows of it too, and what only the worker knows: when it arrived and when its
inputs were all there, the shards a P2P transfer task made), data fetched
from other workers (with its source and the transfer's own start and stop),
data scattered by the client and gathered back to it, spill to disk and load
back, data released, and the shards P2P shuffles send
(:mod:`crux_dask.plugins.shuffles`).  A task is reported here, not by the
scheduler's hook, because the worker has every field of it at hand and spends
a few microseconds on it where the scheduler, which serves every worker, would
spend more (see :mod:`crux_dask.plugins.tasks`); the task's metadata only
carries a mark that says so (:data:`~crux_dask.plugins.protocol.REPORTED`).
A task that opened files (:mod:`crux_dask.plugins.files`) is the exception:
its moments, files and shards travel in its metadata, with its completion, and
the scheduler records it.  The files of a task that opened more than
:data:`FILES_INLINE` are sized in a thread of their own and follow through
the ``crux_files`` handler, so that neither the completion nor the event loop
waits for thousands of ``stat``.  Hooks append one tuple to a buffer (a
task, packed with msgpack as it finishes, to a list of its own); a periodic
callback packs the buffer and sends both to the scheduler's ``crux_events``
handler, one round trip per batch, one batch in flight at a time.

Times are in the scheduler's clock, as this worker estimates it from the round
trips of its sends (:mod:`crux_dask.plugins.clock`), not from distributed's
latest heartbeat: times distributed converted (a task's start and stop, a
transfer's) are converted back with the offset it used, and again with that
estimate.

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
import select
import socket
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from time import time
from typing import TYPE_CHECKING, Any

import msgpack
from distributed.diagnostics.plugin import WorkerPlugin
from tornado.ioloop import PeriodicCallback

from crux_dask.codec import encode_batch
from crux_dask.model import CLIENT, disk_location, memory_location
from crux_dask.plugins import config
from crux_dask.plugins.clock import ClockOffset
from crux_dask.plugins.files import FileRecorder
from crux_dask.plugins.logs import since
from crux_dask.plugins.protocol import (
    EVENTS_HANDLER,
    FILES,
    FILES_HANDLER,
    FOLLOW,
    MOMENTS,
    PLUGIN_NAME,
    REPORTED,
    SHARDS,
    TASKS,
    key_string,
)
from crux_dask.plugins.shuffles import ShardRecorder

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger(__name__)

#: How many of the newest entries of the worker's transfer log to search for a
#: finished fetch (the log is a capped deque and is only ever read, never diffed).
_LOG_LOOKBACK = 16
#: The default bound of the teardown's last send, in seconds.
TEARDOWN_TIMEOUT = 0.5
#: The shortest period between two sends by default, in milliseconds.  Each batch costs
#: the scheduler an RPC, and what that costs hardly depends on its size: sending every
#: 2 s rather than with each heartbeat (0.5 s) saved the scheduler 1.0-2.3 % of its CPU
#: on tiny tasks.
SEND_PERIOD = 2000
#: What ``poll`` reports of a socket whose peer closed it (Linux; 0: not told).
_HUNG_UP = (select.POLLRDHUP | select.POLLHUP | select.POLLERR
            if hasattr(select, "POLLRDHUP") else 0)
#: Empty round trips a worker times as it starts, so that what it records before its
#: first batch is in a bounded estimate of the scheduler's clock (the first one may
#: open a connection: the others bound it tighter).
CLOCK_PROBES = 3
#: The most files whose sizes are taken in the event loop as their task is done
#: (a few microseconds each); a task that opened more has them taken in a thread.
FILES_INLINE = 64


class CruxWorkerPlugin(WorkerPlugin):
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
        self.buffer: list[tuple] = []
        # Tasks finished, as the scheduler reads them (protocol.REPORT_FIELDS), each
        # packed; anything an annotation holds that msgpack cannot, as its repr.
        self.reports: list[bytes] = []
        self._packer = msgpack.Packer(default=repr)
        # The scheduler's clock: distributed's estimate as a start, until a send's
        # round trip bounds it better.
        self.clock = ClockOffset(worker.scheduler_delay)
        self.offset = self.clock.offset  # read by every hook: one attribute
        # Tasks that reached this worker, to report when they finish: key ->
        # [when they arrived, when their inputs were all here, distributed's offset
        # as the task started (the one its start and stop are converted with)].
        self._moments: dict[Any, list] = {}
        self.seq = 0
        self.counts = dict.fromkeys(
            ["events_recorded", "events_sent", "events_dropped", "events_unsent",
             "batches_sent", "batches_rejected", "send_failures", "hook_errors",
             "transfer_log_overruns", "file_lists_dropped", "file_lists_unsent"], 0)
        # The capture switches, read once: the hooks test them on every call.
        self._transfers = bool(self.capture.get("transfers", True))
        self._deletes = bool(self.capture.get("deletes", True))
        self._flight_start: dict[Any, tuple[str | None, float]] = {}
        self._requested: dict[Any, float] = {}  # key -> when this worker asked for it
        self._on_disk: set[Any] = set()
        self._sending: asyncio.Future | None = None
        self._spill_hooks: list[tuple[list, Any]] = []
        # The newest entry of the outgoing transfer log already read: entries
        # from before the plugin was set up are not this run's.
        log = worker.transfer_outgoing_log
        self._outgoing_seen: dict | None = log[-1] if log else None
        if self._transfers and log.maxlen == 0:
            logger.warning("Crux cannot see data gathered by clients: the worker's transfer "
                           "log is disabled (distributed.admin.low-level-log-length: 0)")
        if self.capture.get("spill", True):
            self._hook_spill(worker.data)
        self.files: FileRecorder | None = None
        # Files being sized in a thread (task key string by job), and those sized
        # and not sent yet: [key string, files].
        self._sizing: dict[Future, str] = {}
        self._files_out: list[list] = []
        self._sizer: ThreadPoolExecutor | None = None
        if self.capture.get("files", True):
            self.host = socket.gethostname()
            self.files = FileRecorder(worker, *self.file_patterns)
            self.files.start()
        self.shards: ShardRecorder | None = None
        if self.capture.get("shuffles", True):
            self.shards = ShardRecorder(worker, self._record, self._now)
            self.shards.start()
        self._callback = PeriodicCallback(self._flush_soon, self._flush_period())
        self._callback.start()
        self._probing = asyncio.ensure_future(self._probe_clock())

    async def teardown(self, worker: Worker) -> None:
        """Stop recording; send what is buffered if the scheduler is still there.

        Never waits on a scheduler that is gone, and at most
        ``teardown_timeout`` seconds on one that does not answer: what could
        not be sent stays in :attr:`buffer` and :attr:`reports`, counted as
        ``events_unsent`` (and the files of tasks as ``file_lists_unsent``).
        """
        self._callback.stop()
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
        for callbacks, hook in self._spill_hooks:
            if hook in callbacks:
                callbacks.remove(hook)
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

    def _scheduler_connected(self) -> bool:
        """Whether the worker's stream to the scheduler is open (no waiting involved).

        A scheduler that has just closed may not be noticed yet by the worker,
        which reads the stream's end later: where the system tells (Linux's
        ``POLLRDHUP``), the stream's socket is asked whether the scheduler's
        side hung up, without reading anything.
        """
        stream = getattr(self.worker, "batched_stream", None)
        comm = getattr(stream, "comm", None)
        if comm is None or comm.closed():
            return False
        sock = getattr(getattr(comm, "stream", None), "socket", None)
        if _HUNG_UP and sock is not None:
            poll = select.poll()
            try:
                poll.register(sock, _HUNG_UP)
                return not poll.poll(0)
            except (OSError, ValueError):  # closed meanwhile
                return False
        return True

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

    def _report(self, key: Any, moments: list) -> None:
        """Report the task ``key``, which finished now (:data:`REPORT_FIELDS
        <crux_dask.plugins.protocol.REPORT_FIELDS>`); or, if it opened files,
        leave what the scheduler cannot know of it in its metadata."""
        worker = self.worker
        ts = worker.state.tasks.get(key)
        files = self.files
        if ts is None:
            return
        start = stop = None
        for interval in ts.startstops:
            if interval["action"] == "compute":
                start, stop = interval["start"], interval["stop"]
        # distributed converted them with its offset as the task started: a heartbeat
        # since may have moved it; the shift takes them to this plugin's estimate.
        delay = moments[2]
        shift = self.offset - (worker.scheduler_delay if delay is None else delay)
        if stop is None:
            start = stop = self._now()
        else:
            start += shift
            stop += shift
        shards = self.shards
        made = shards.by_task.pop(key) if shards is not None and key in shards.by_task else None
        if files is not None and key in files.by_task:
            opened = self._files_done(key, key_string(key), stop - self.offset)
            if opened is not None:
                # Sent to the scheduler with the task's completion, in the message this
                # transition has just made (it holds the same dict), which also holds
                # the start and stop as distributed converted them: the shift goes too.
                metadata = ts.metadata
                metadata.pop(REPORTED, None)
                metadata[MOMENTS] = (moments[0], moments[1], shift)
                metadata[FILES] = opened
                if made is not None:
                    metadata[SHARDS] = made
                return
        annotations = ts.annotations
        # Packed now, while what it holds is in the processor's cache: packed with the
        # batch, a fraction of a second later, packing took up to half as long again.
        self.reports.append(self._packer.pack([  # keys as they are: the scheduler makes strings
            key, worker.threads.get(key), start, stop, ts.nbytes or 0,
            [dts.key for dts in ts.dependencies], ts.prefix,
            annotations.get("crux") if annotations else None, ts.priority,
            moments[0], moments[1], made,
        ]))
        self.counts["events_recorded"] += 1
        if len(self.reports) > self.max_buffered_events:
            del self.reports[0]
            self.counts["events_dropped"] += 1
        if len(self.reports) >= self.batch_size and self._sending is None:
            worker.loop.add_callback(self._flush_soon)

    def _files_done(self, key: Any, name: str, stop: float) -> tuple | None:
        """What the task ``key`` (``name``) did with files, if anything; ``stop`` is when
        it stopped, in this worker's clock."""
        taken = self.files.take(key, stop)
        if taken is None:
            return None
        io, opened = taken
        if len(opened) <= 2 * FILES_INLINE:
            files = self.files.keep(self.files.files(opened))
            return (io, self.host, files) if files else None
        if self._sizer is None:
            self._sizer = ThreadPoolExecutor(1, thread_name_prefix="crux-files")
        job = self._sizer.submit(self.files.files, opened)
        self._sizing[job] = name
        job.add_done_callback(self._sized_soon)
        return (io, self.host, FOLLOW)

    def _sized_soon(self, job: Future) -> None:
        """In the sizing thread: hand the sized files to the event loop."""
        with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: nobody to tell
            self.worker.loop.add_callback(self._sized, job)

    def _sized(self, job: Future) -> None:
        """The files of a task sized in the thread go out with the next send."""
        if job.cancelled() or job not in self._sizing:  # by a teardown; or a flush took it
            return
        name = self._sizing.pop(job)
        try:
            files = self.files.keep(job.result())
        except Exception as error:
            self._hook_failed(error)
            files = []
        self._files_out.append([name, files])
        if self._sending is None:
            self._flush_soon()

    def _released(self, key: Any) -> None:
        # The commonest event a worker records, its steps inlined: a gather of this
        # key, if any, goes first (the same test as since()'s, before calling it).
        log = self.worker.transfer_outgoing_log
        if self._transfers and log and log[-1] is not self._outgoing_seen:
            self._poll_gathers()
        where = self.memory
        if self._on_disk and key in self._on_disk:
            self._on_disk.discard(key)
            where = self.disk
        self._record(("delete", key if type(key) is str else str(key), where,
                      time() + self.offset))

    def _fetched(self, key: Any) -> None:
        """``key`` arrived from another worker: find the fetch in the transfer log."""
        source, started = self._flight_start.pop(key, (None, None))
        requested = self._requested.pop(key, None)
        if not self._transfers:
            return
        ts = self.worker.state.tasks.get(key)
        nbytes = (ts.nbytes if ts else None) or 0
        log = self.worker.transfer_incoming_log
        for entry in islice(reversed(log), _LOG_LOOKBACK):
            if key in entry["keys"] and (source is None or entry["who"] == source):
                # Logged as the data arrived, just before this transition: converted
                # with distributed's offset of now.
                shift = self.offset - self.worker.scheduler_delay
                start, stop, source = entry["start"] + shift, entry["stop"] + shift, entry["who"]
                break
        else:  # not logged (the log may be disabled): time the flight ourselves
            stop = self._now()
            start = stop if started is None else started
        if source is None:
            return
        self._record(("transfer", key_string(key), memory_location(source), self.memory,
                      start, max(start, stop), nbytes,
                      None if requested is None else min(requested, start)))

    def _hook_spill(self, data: Any) -> None:
        to_slow = getattr(data, "fast_to_slow_callbacks", None)
        to_fast = getattr(data, "slow_to_fast_callbacks", None)
        if not isinstance(to_slow, list) or not isinstance(to_fast, list):
            return  # not a spilling buffer: nothing ever goes to disk
        to_slow.append(self._spilled)
        to_fast.append(self._unspilled)
        self._spill_hooks = [(to_slow, self._spilled), (to_fast, self._unspilled)]

    def _spilled(self, key: Any, value: Any) -> None:
        self._on_disk.add(key)
        self._moved(key, self.memory, self.disk)

    def _unspilled(self, key: Any, value: Any) -> None:
        self._on_disk.discard(key)
        self._moved(key, self.disk, self.memory)

    def _moved(self, key: Any, source: str, destination: str) -> None:
        """Data moved between memory and disk: a transfer, and the source copy is gone."""
        # zict undoes a spill whose callback raises: this must never raise.
        try:
            now = self._now()
            name = key_string(key)
            self._record(("transfer", name, source, destination, now, now, self._nbytes(key)))
            self._record(("delete", name, source, now))
        except Exception as error:
            self._hook_failed(error)

    def _poll_gathers(self) -> None:
        """Record the data this worker handed to clients since the last look.

        Read from the worker's own log of outgoing transfers, newest first down
        to the newest entry read before: an entry that names no peer (``who``
        is ``None``) is data a client gathered, directly or through the
        scheduler.  Costs an identity test when nothing was logged since.
        """
        fresh, lost = since(self.worker.transfer_outgoing_log, self._outgoing_seen)
        if not fresh:
            return
        if lost:  # it fell out of the log before we read what followed
            self.counts["transfer_log_overruns"] += 1
        self._outgoing_seen = fresh[-1]
        try:
            memory = self.memory
            offset = self.offset
            for entry in fresh:
                if entry["who"] is None:
                    # Converted with distributed's offset of then, which the entry's
                    # middle, in this worker's clock, gives back.
                    start, stop = entry["start"], entry["stop"]
                    shift = offset - ((start + stop) / 2 - entry["middle"])
                    start, stop = start + shift, stop + shift
                    keys = entry["keys"]  # key -> bytes sent
                    sent = keys.items() if isinstance(keys, dict) else ((k, 0) for k in keys)
                    for key, nbytes in sent:
                        self._record(("transfer", key_string(key), memory, CLIENT, start,
                                      stop, nbytes or 0))
        except Exception as error:
            self._hook_failed(error)

    # -- transport --------------------------------------------------------------
    def _record(self, event: tuple) -> None:
        buffer = self.buffer
        buffer.append(event)
        self.counts["events_recorded"] += 1
        if len(buffer) > self.max_buffered_events:
            del buffer[: len(buffer) - self.max_buffered_events]
            self.counts["events_dropped"] += 1
        if len(buffer) >= self.batch_size and self._sending is None:
            self.worker.loop.add_callback(self._flush_soon)

    def _flush_period(self) -> float:
        """Milliseconds between two sends: configured, or :data:`SEND_PERIOD` (the
        worker's heartbeat's if longer), at most half the time the scheduler waits
        for a report (``park-timeout``)."""
        if self.flush_interval is not None:
            return self.flush_interval * 1000
        return min(max(self.worker.periodic_callbacks["heartbeat"].callback_time,
                       SEND_PERIOD), self._longest_period)

    def _flush_soon(self) -> None:
        self._callback.callback_time = self._flush_period()  # read for the next call
        if self._transfers:
            self._poll_gathers()
        if (self.buffer or self.reports or self._files_out) and self._sending is None:
            self._sending = asyncio.ensure_future(self._send())

    async def flush(self) -> bool:
        """Send everything buffered and wait until the scheduler has taken it.

        Returns ``False`` if the scheduler could not be reached (the events
        stay buffered for the next try).
        """
        if self._transfers:
            self._poll_gathers()
        while self._sizing:  # files being sized go too
            job = next(iter(self._sizing))
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(job)
            self._sized(job)
        while True:
            if self._sending is not None:
                await asyncio.shield(self._sending)
                continue
            if not self.buffer and not self.reports and not self._files_out:
                return True
            self._sending = asyncio.ensure_future(self._send())
            if not await asyncio.shield(self._sending):
                return False

    async def _send(self) -> bool:
        try:
            send = getattr(self.worker.scheduler, EVENTS_HANDLER)
            # What was recorded by now: what comes while this is sent waits for the next
            # send, rather than following at once in a message of its own.
            unsent_events, unsent_reports = len(self.buffer), len(self.reports)
            while unsent_events > 0 or unsent_reports > 0:
                events = self.buffer[: min(self.batch_size, unsent_events)]
                reports = self.reports[: min(self.batch_size, unsent_reports)]
                unsent_events -= len(events)
                unsent_reports -= len(reports)
                self.seq += 1
                message = {"source": self.worker.address}
                if events:
                    message["batch"] = encode_batch(events, self.worker.address, self.seq)
                if reports:  # the packed reports, as one array
                    message[TASKS] = b"".join([self._packer.pack_array_header(len(reports)),
                                               *reports])
                sent = time()
                try:
                    reply = await send(**message)
                except Exception as error:
                    # Keep the events for the next try; the scheduler may be busy.
                    self.counts["send_failures"] += 1
                    logger.debug("Crux could not send a batch: %r", error)
                    return False
                del self.buffer[: len(events)]
                del self.reports[: len(reports)]
                if isinstance(reply, dict) and reply.get("status") == "OK":
                    self.counts["batches_sent"] += 1
                    self.counts["events_sent"] += len(events) + len(reports)
                    self._timed(sent, reply)
                else:  # rejected, or no Crux on the scheduler: nobody will take these
                    self.counts["batches_rejected"] += 1
                    self.counts["events_dropped"] += len(events) + len(reports)
            if self._files_out:
                files = self._files_out[:]
                try:
                    reply = await getattr(self.worker.scheduler, FILES_HANDLER)(
                        files=files, source=self.worker.address)
                except Exception as error:
                    self.counts["send_failures"] += 1
                    logger.debug("Crux could not send the files of tasks: %r", error)
                    return False
                del self._files_out[: len(files)]
                if not (isinstance(reply, dict) and reply.get("status") == "OK"):
                    self.counts["file_lists_dropped"] += len(files)
            return True
        finally:
            self._sending = None

    async def _probe_clock(self) -> None:
        """Time :data:`CLOCK_PROBES` empty round trips to the scheduler; give up on the
        first that fails (the first batch's round trip will do)."""
        try:
            send = getattr(self.worker.scheduler, EVENTS_HANDLER)
            for _ in range(CLOCK_PROBES):
                sent = time()
                self._timed(sent, await send(source=self.worker.address))
        except Exception as error:
            logger.debug("Crux could not time a round trip to the scheduler: %r", error)

    def _timed(self, sent: float, reply: Any) -> None:
        """A round trip sent at ``sent`` is over: its answer's clock (``time``) may
        bound the scheduler's better (:class:`~crux_dask.plugins.clock.ClockOffset`)."""
        clock = reply.get("time") if isinstance(reply, dict) else None
        if isinstance(clock, float) and self.clock.sample(sent, time(), clock):
            self.offset = self.clock.offset

    # -- helpers ----------------------------------------------------------------
    def _now(self) -> float:
        """Now, in the scheduler's clock."""
        return time() + self.offset

    def _nbytes(self, key: Any) -> int:
        ts = self.worker.state.tasks.get(key)
        return (ts.nbytes if ts else None) or 0

    def _hook_failed(self, error: Exception) -> None:
        self.counts["hook_errors"] += 1
        if self.counts["hook_errors"] == 1:
            logger.warning("Crux worker hook failed (further failures are only counted): %r",
                           error)

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
