"""A worker's events, buffered and sent to the scheduler in batches.

Hooks append one tuple to a buffer (a task, packed with msgpack as it
finishes, to a list of its own: :mod:`crux_dask.plugins.task_reports`); a periodic
callback packs the buffer and sends both to the scheduler's ``crux_events``
handler, one round trip per batch, one batch in flight at a time.  The files
of tasks sized after their completion follow through the ``crux_files``
handler.  What cannot be sent stays buffered for the next try, up to
``max-buffered-events``; what the scheduler refuses is counted and dropped.

A batch whose round trip failed is sent again as it was, under its number: the
scheduler may have taken it and only its answer been lost, and it takes a number
from one sender once (:meth:`~crux_dask.plugins.recorder.Recorder.receive`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from time import time

import msgpack
from tornado.ioloop import PeriodicCallback

from crux_dask.codec import encode_batch
from crux_dask.plugins.protocol import EVENTS_HANDLER, FILES_HANDLER, TASKS
from crux_dask.plugins.round_trips import ClockRoundTrips

__all__ = ["SEND_PERIOD", "EventBatches"]

#: The worker plugin's messages, under one name wherever they are logged from.
logger = logging.getLogger("crux_dask.plugins.worker")

#: The shortest period between two sends by default, in milliseconds.  Each batch costs
#: the scheduler an RPC, and what that costs hardly depends on its size: sending every
#: 2 s rather than with each heartbeat (0.5 s) saved the scheduler 1.0-2.3 % of its CPU
#: on tiny tasks.
SEND_PERIOD = 2000
#: What ``poll`` reports of a socket whose peer closed it (Linux; 0: not told).
_HUNG_UP = (select.POLLRDHUP | select.POLLHUP | select.POLLERR
            if hasattr(select, "POLLRDHUP") else 0)


class EventBatches(ClockRoundTrips):
    """The buffers of a worker's plugin and their sends (a mixin of the plugin).

    Attributes
    ----------
    buffer : list of tuple
        Events recorded and not sent yet.
    reports : list of bytes
        Tasks finished and not sent yet, each packed
        (:data:`~crux_dask.plugins.protocol.REPORT_FIELDS`).
    seq : int
        The number of the latest batch sent.
    sender : str
        This plugin's name for itself in the batches it sends (a worker that
        restarts at the same address numbers its batches afresh).
    """

    # Set by the plugin (crux_dask.plugins.worker), or by the other parts of it.
    counts: dict[str, int]
    flush_interval: float | None
    batch_size: int
    max_buffered_events: int
    _longest_period: float
    _callback: PeriodicCallback
    _transfers: bool
    _poll_gathers: Callable[[], None]
    _files_out: list[list]
    _sizing: dict[Future, str]
    _sized: Callable[[Future], None]

    def _start_batches(self) -> None:
        """Empty buffers, and nothing being sent."""
        self.buffer: list[tuple] = []
        # Tasks finished, as the scheduler reads them (protocol.REPORT_FIELDS), each
        # packed; anything an annotation holds that msgpack cannot, as its repr.
        self.reports: list[bytes] = []
        self._packer = msgpack.Packer(default=repr)
        self.seq = 0
        self.sender = uuid.uuid4().hex
        # The batch sent last and not answered: (message, events, reports in it).
        self._unanswered: tuple[dict, int, int] | None = None
        self._sending: asyncio.Future | None = None

    def _record(self, event: tuple) -> None:
        buffer = self.buffer
        buffer.append(event)
        self.counts["events_recorded"] += 1
        if len(buffer) > self.max_buffered_events:
            del buffer[: len(buffer) - self.max_buffered_events]
            self.counts["events_dropped"] += 1
        if len(buffer) >= self.batch_size and self._sending is None:
            self.worker.loop.add_callback(self._flush_soon)

    def _hook_failed(self, error: Exception) -> None:
        self.counts["hook_errors"] += 1
        if self.counts["hook_errors"] == 1:
            logger.warning("Crux worker hook failed (further failures are only counted): %r",
                           error)

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
            while self._unanswered is not None or unsent_events > 0 or unsent_reports > 0:
                if self._unanswered is None:
                    self._unanswered = self._batch(unsent_events, unsent_reports)
                message, events, reports = self._unanswered
                sent = time()
                try:
                    reply = await send(**message)
                except Exception as error:
                    # Keep the batch for the next try: the scheduler may be busy, or may
                    # have taken it and its answer been lost.
                    self.counts["send_failures"] += 1
                    logger.debug("Crux could not send a batch: %r", error)
                    return False
                self._unanswered = None
                unsent_events -= events
                unsent_reports -= reports
                del self.buffer[:events]
                del self.reports[:reports]
                if isinstance(reply, dict) and reply.get("status") == "OK":
                    self.counts["batches_sent"] += 1
                    self.counts["events_sent"] += events + reports
                    self._timed(sent, reply)
                else:  # rejected, or no Crux on the scheduler: nobody will take these
                    self.counts["batches_rejected"] += 1
                    self.counts["events_dropped"] += events + reports
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

    def _batch(self, unsent_events: int, unsent_reports: int) -> tuple[dict, int, int]:
        """The next batch of the first ``unsent_events`` and ``unsent_reports`` buffered,
        numbered: its message, and how many events and reports it holds."""
        events = self.buffer[: min(self.batch_size, unsent_events)]
        reports = self.reports[: min(self.batch_size, unsent_reports)]
        self.seq += 1
        message = {"source": self.worker.address, "sender": self.sender, "seq": self.seq}
        if events:
            message["batch"] = encode_batch(events, self.worker.address, self.seq)
        if reports:  # the packed reports, as one array
            message[TASKS] = b"".join([self._packer.pack_array_header(len(reports)),
                                       *reports])
        return message, len(events), len(reports)

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
