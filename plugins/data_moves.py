"""Where a worker's data goes: fetched, gathered by clients, spilled, loaded back, released.

Recorded as transfers (from a location to another, with their start, stop and
bytes) and deletes (a copy gone):

* data fetched from other workers, with its source and the transfer's own
  start and stop, found in the worker's log of incoming transfers (or timed
  here where the log is off);
* data scattered by the client (``released -> memory``: recorded by the
  plugin's transition hook) and gathered back to it, read from the worker's
  own log of outgoing transfers (:mod:`crux_dask.plugins.logs`), not by
  replacing its handler;
* spill to disk and load back, from the spilling buffer's callbacks;
* data released, from memory or from disk.

Times distributed converted (a transfer's start and stop) are converted back
with the offset it used, and again with this worker's estimate of the
scheduler's clock (:mod:`crux_dask.plugins.round_trips`).
"""

from __future__ import annotations

import logging
from itertools import islice
from time import time
from typing import TYPE_CHECKING, Any

from crux_dask.model import CLIENT, memory_location
from crux_dask.plugins.batches import EventBatches
from crux_dask.plugins.logs import since
from crux_dask.plugins.protocol import key_string

if TYPE_CHECKING:
    from distributed import Worker

__all__ = ["DataMoves"]

#: The worker plugin's messages, under one name wherever they are logged from.
logger = logging.getLogger("crux_dask.plugins.worker")

#: How many of the newest entries of the worker's transfer log to search for a
#: finished fetch (the log is a capped deque and is only ever read, never diffed).
_LOG_LOOKBACK = 16


class DataMoves(EventBatches):
    """The moves of a worker's data that its plugin records (a mixin of the plugin)."""

    # Set by the plugin (crux_dask.plugins.worker).
    capture: dict[str, Any]
    memory: str
    disk: str
    _transfers: bool

    def _start_data(self, worker: Worker) -> None:
        """Nothing in flight nor on disk yet; the spilling buffer's callbacks hooked."""
        self._flight_start: dict[Any, tuple[str | None, float]] = {}
        self._requested: dict[Any, float] = {}  # key -> when this worker asked for it
        self._on_disk: set[Any] = set()
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

    def _unhook_spill(self) -> None:
        """Take this plugin's callbacks out of the spilling buffer's."""
        for callbacks, hook in self._spill_hooks:
            if hook in callbacks:
                callbacks.remove(hook)

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

    def _nbytes(self, key: Any) -> int:
        ts = self.worker.state.tasks.get(key)
        return (ts.nbytes if ts else None) or 0
