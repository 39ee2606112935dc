"""The worker side: what only a worker sees, sent to the scheduler in batches.

Recorded here: data fetched from other workers (with its source and the
transfer's own start and stop), data scattered by the client and gathered back
to it, spill to disk and load back, and data released.  Hooks append one tuple
to a buffer; a periodic callback packs the buffer with msgpack and sends it to
the scheduler's ``crux_events`` handler, one round trip per batch, one batch
in flight at a time.
"""

from __future__ import annotations

import asyncio
import logging
from time import time
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import WorkerPlugin
from tornado.ioloop import PeriodicCallback

from crux_dask.codec import encode_batch
from crux_dask.model import CLIENT, disk_location, memory_location
from crux_dask.plugins import config
from crux_dask.plugins.protocol import EVENTS_HANDLER, MOMENTS, PLUGIN_NAME, key_string

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger(__name__)

#: How many of the newest entries of the worker's transfer log to search for a
#: finished fetch (the log is a capped deque and is only ever read, never diffed).
_LOG_LOOKBACK = 16


class CruxWorkerPlugin(WorkerPlugin):
    """Record a worker's transfers, spills and releases for the scheduler's graph.

    Parameters
    ----------
    flush_interval : str or float, optional
        How often buffered events are sent (``crux-dask.flush-interval``).
    batch_size : int, optional
        Buffered events that trigger a send (``crux-dask.batch-size``).
    max_buffered_events : int, optional
        Events kept while the scheduler cannot take them
        (``crux-dask.max-buffered-events``).
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, flush_interval: str | float | None = None,
                 batch_size: int | None = None,
                 max_buffered_events: int | None = None) -> None:
        self.flush_interval = config.seconds("flush-interval", flush_interval)
        self.batch_size = config.positive_int("batch-size", batch_size)
        self.max_buffered_events = config.positive_int("max-buffered-events",
                                                       max_buffered_events)
        self.capture = dict(config.get("capture"))

    # -- lifecycle ----------------------------------------------------------
    async def setup(self, worker: Worker) -> None:
        self.worker = worker
        self.memory = memory_location(worker.address)
        self.disk = disk_location(worker.address)
        self.buffer: list[tuple] = []
        self.seq = 0
        self.counts = dict.fromkeys(
            ["events_recorded", "events_sent", "events_dropped", "batches_sent",
             "batches_rejected", "send_failures", "hook_errors"], 0)
        self._flight_start: dict[Any, tuple[str | None, float]] = {}
        self._requested: dict[Any, float] = {}  # key -> when this worker asked for it
        self._on_disk: set[Any] = set()
        self._sending: asyncio.Future | None = None
        self._spill_hooks: list[tuple[list, Any]] = []
        self._original_get_data = None
        if self.capture.get("spill", True):
            self._hook_spill(worker.data)
        if self.capture.get("transfers", True):
            self._hook_get_data(worker)
        self._callback = PeriodicCallback(self._flush_soon, self.flush_interval * 1000)
        self._callback.start()

    async def teardown(self, worker: Worker) -> None:
        self._callback.stop()
        for callbacks, hook in self._spill_hooks:
            if hook in callbacks:
                callbacks.remove(hook)
        if self._original_get_data is not None:
            worker.handlers["get_data"] = self._original_get_data
        await self.flush()

    # -- hooks ----------------------------------------------------------------
    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        # Most transitions (waiting, ready, executing...) need nothing: test the
        # few that do, cheapest first.
        try:
            if finish == "memory":
                if start == "flight":
                    self._fetched(key)
                elif start == "released" and self.capture.get("transfers", True):
                    now = self._now()
                    self._record(("transfer", key_string(key), CLIENT, self.memory, now, now,
                                  self._nbytes(key)))
            elif start == "memory":
                if finish == "released" and self.capture.get("deletes", True):
                    self._released(key)
            elif finish == "ready":  # all inputs here: runnable from now on
                moments = self.worker.state.tasks[key].metadata.get(MOMENTS)
                if moments is not None:
                    moments[1] = self._now()
            elif start == "released":
                if finish == "waiting":  # the task reached this worker
                    self.worker.state.tasks[key].metadata[MOMENTS] = [self._now(), None]
                elif finish == "fetch":
                    self._requested.setdefault(key, self._now())
            elif finish == "flight":
                ts = self.worker.state.tasks.get(key)
                self._flight_start[key] = (ts.coming_from if ts else None, self._now())
            elif finish in ("released", "forgotten", "missing"):
                self._flight_start.pop(key, None)
                self._requested.pop(key, None)
        except Exception as error:
            self._hook_failed(error)

    def _released(self, key: Any) -> None:
        now = self._now()
        if key in self._on_disk:
            self._on_disk.discard(key)
            self._record(("delete", key_string(key), self.disk, now))
        else:
            self._record(("delete", key_string(key), self.memory, now))

    def _fetched(self, key: Any) -> None:
        """``key`` arrived from another worker: find the fetch in the transfer log."""
        source, started = self._flight_start.pop(key, (None, None))
        requested = self._requested.pop(key, None)
        if not self.capture.get("transfers", True):
            return
        ts = self.worker.state.tasks.get(key)
        nbytes = (ts.nbytes if ts else None) or 0
        log = self.worker.transfer_incoming_log
        for entry in _newest(log, _LOG_LOOKBACK):
            if key in entry["keys"] and (source is None or entry["who"] == source):
                start, stop, source = entry["start"], entry["stop"], entry["who"]
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

    def _hook_get_data(self, worker: Worker) -> None:
        """Wrap the ``get_data`` handler to see data gathered by the client."""
        original = worker.handlers.get("get_data")
        if original is None:
            return
        plugin = self

        async def get_data(comm: Any, keys: Any = (), who: str | None = None,
                           **kwargs: Any) -> Any:
            start = plugin._now()
            result = await original(comm, keys=keys, who=who, **kwargs)
            if who is None:  # peers say who they are; the client and scheduler do not
                plugin._gathered(keys, start)
            return result

        self._original_get_data = original
        worker.handlers["get_data"] = get_data

    def _gathered(self, keys: Any, start: float) -> None:
        try:
            stop = self._now()
            for key in keys:
                if key in self.worker.data:
                    self._record(("transfer", key_string(key), self.memory, CLIENT, start,
                                  stop, self._nbytes(key)))
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

    def _flush_soon(self) -> None:
        if self.buffer and self._sending is None:
            self._sending = asyncio.ensure_future(self._send())

    async def flush(self) -> bool:
        """Send everything buffered and wait until the scheduler has taken it.

        Returns ``False`` if the scheduler could not be reached (the events
        stay buffered for the next try).
        """
        while True:
            if self._sending is not None:
                await asyncio.shield(self._sending)
                continue
            if not self.buffer:
                return True
            self._sending = asyncio.ensure_future(self._send())
            if not await asyncio.shield(self._sending):
                return False

    async def _send(self) -> bool:
        try:
            send = getattr(self.worker.scheduler, EVENTS_HANDLER)
            while self.buffer:
                events = self.buffer[: self.batch_size]
                self.seq += 1
                data = encode_batch(events, self.worker.address, self.seq)
                try:
                    reply = await send(batch=data, source=self.worker.address)
                except Exception as error:
                    # Keep the events for the next try; the scheduler may be busy.
                    self.counts["send_failures"] += 1
                    logger.debug("Crux could not send a batch: %r", error)
                    return False
                del self.buffer[: len(events)]
                if isinstance(reply, dict) and reply.get("status") == "OK":
                    self.counts["batches_sent"] += 1
                    self.counts["events_sent"] += len(events)
                else:  # rejected, or no Crux on the scheduler: nobody will take these
                    self.counts["batches_rejected"] += 1
                    self.counts["events_dropped"] += len(events)
            return True
        finally:
            self._sending = None

    # -- helpers ----------------------------------------------------------------
    def _now(self) -> float:
        """Now, in the scheduler's clock."""
        return time() + self.worker.scheduler_delay

    def _nbytes(self, key: Any) -> int:
        ts = self.worker.state.tasks.get(key)
        return (ts.nbytes if ts else None) or 0

    def _hook_failed(self, error: Exception) -> None:
        self.counts["hook_errors"] += 1
        if self.counts["hook_errors"] == 1:
            logger.warning("Crux worker hook failed (further failures are only counted): %r",
                           error)

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "events_buffered": len(self.buffer)}


def _newest(log: Any, n: int) -> list:
    """The ``n`` newest entries of a deque, newest first."""
    entries = []
    for entry in reversed(log):
        entries.append(entry)
        if len(entries) == n:
            break
    return entries
