"""What the scheduler's hooks and the workers' RPC handler record into: the queue.

The entries of the queue are the builder's events, the workers' batches, and
the named records of :mod:`crux_dask.plugins.entries`.  :class:`~crux_dask.plugins.ingest.Ingest`
applies them where the scheduler runs; :class:`~crux_dask.plugins.graph_process.GraphProcess`
sends them to the graph process, which applies them with an ingest of its own.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgpack

from crux_dask.codec import MAX_BATCH_BYTES, MAX_BATCH_EVENTS
from crux_dask.plugins.entries import Reported, TaskFiles
from crux_dask.validation import BatchError

logger = logging.getLogger(__name__)

__all__ = ["COUNTS", "Recorder", "count_reports", "unpack_reports"]

COUNTS = ["events_from_workers", "events_applied", "events_failed", "batches_received",
           "batches_in_columns", "batches_rejected", "batches_repeated", "batches_failed",
           "hook_errors",
           "file_lists_received", "file_lists_rejected", "file_lists_missing",
           "file_lists_unmatched", "tasks_reported", "tasks_unreported"]


class Recorder:
    """What the scheduler's hooks and the workers' RPC handler record into.

    The rules both places that take recorded events share: a queue, its
    counts, receiving the workers' batches, and applying (or sending) the
    queue promptly once it holds ``max_pending`` events.  A subclass says how
    much of a batch it checks and what the batch becomes in the queue
    (:meth:`queue_batch`), and what applying soon means (:meth:`apply_soon`).

    Attributes
    ----------
    queue : collections.deque
        What was recorded and not applied (or sent) yet.
    pending : int
        Events in :attr:`queue`.
    max_pending : int
        Queued events past which a hook or the handler calls :meth:`apply_soon`.
    counts : dict of str to int
    seconds : dict of str to float
        CPU seconds receiving batches (``receive``) and applying events
        (``apply``), and the longest stretch of the event loop (``longest_slice``).
    last_error : str or None
        The last batch or event refused, or hook failure.
    """

    def __init__(self, max_pending: int, counts: Iterable[str]) -> None:
        self.queue: deque = deque()
        self.pending = 0
        self.max_pending = max_pending
        self.counts = dict.fromkeys(counts, 0)
        self.seconds = {"receive": 0.0, "apply": 0.0, "longest_slice": 0.0}
        self.last_error: str | None = None
        self.graphs = 0  # graphs numbered so far
        # worker address -> (sender, the number of its batch taken last)
        self._taken: dict[Any, tuple[Any, int]] = {}

    def next_graph(self) -> int:
        """The number of the next graph that reaches the scheduler."""
        self.graphs += 1
        return self.graphs - 1

    def record(self, event: tuple) -> None:
        """Queue one event."""
        self.queue.append(event)
        self.pending += 1
        if self.pending >= self.max_pending:
            self.apply_soon()

    def receive(self, batch: bytes | None = None, tasks: bytes | None = None,
                **kwargs: Any) -> dict[str, Any]:
        """RPC handler for the workers' event batches and the tasks they report with
        them (:data:`~crux_dask.plugins.protocol.TASKS`): check and queue; never raises.

        Returns
        -------
        dict
            ``{"status": "OK", "accepted": n, "time": now}`` (events and tasks; the
            scheduler's clock, from which the worker estimates its offset: see
            :mod:`crux_dask.plugins.clock`; a message with neither is only that),
            or ``{"status": "rejected", "error": ...}`` for a malformed batch or
            report (nothing of either is queued).  A batch taken before (the
            same ``sender`` and ``seq``: sent again, its answer lost) is answered
            as taken, with nothing queued again.
        """
        if batch is None and tasks is None:  # a worker timing a round trip: nothing else
            return {"status": "OK", "accepted": 0, "time": time.time()}
        source, sender, seq = kwargs.get("source"), kwargs.get("sender"), kwargs.get("seq")
        numbered = sender is not None and type(seq) is int
        taken = self._taken.get(source) if numbered else None
        if taken is not None and taken[0] == sender and seq <= taken[1]:
            self.counts["batches_repeated"] += 1
            return {"status": "OK", "accepted": 0, "time": time.time()}
        started = time.thread_time()
        self.counts["batches_received"] += 1
        try:
            reported = None if tasks is None else count_reports(tasks)
            events, in_columns = (0, False) if batch is None and reported else (
                self.queue_batch(batch))
            if reported:
                self.queue_reports(kwargs.get("source"), tasks, reported)
                self.counts["tasks_reported"] += reported
                events += reported
        except BatchError as error:
            self.counts["batches_rejected"] += 1
            self.last_error = f"batch rejected: {error}"
            logger.debug("Crux rejected a batch from %s: %s", kwargs.get("source"), error)
            return {"status": "rejected", "error": str(error)}
        if numbered:
            self._taken[source] = (sender, seq)
        self.counts["batches_in_columns"] += in_columns
        self.counts["events_from_workers"] += events
        self.pending += events
        self.seconds["receive"] += time.thread_time() - started
        if self.pending >= self.max_pending:
            self.apply_soon()
        return {"status": "OK", "accepted": events, "time": time.time()}

    def receive_files(self, files: Any = None, source: Any = None,
                      **kwargs: Any) -> dict[str, Any]:
        """RPC handler for the files of tasks a worker sized after their completion.

        ``files`` is ``[[key string, [[path, written, size], ...]], ...]``;
        each list is queued as a :class:`~crux_dask.plugins.entries.TaskFiles` entry (its files are
        checked as the task's entry takes them).  Never raises.

        Returns
        -------
        dict
            ``{"status": "OK"}``, or ``{"status": "rejected", "error": ...}``
            for anything of another form (nothing of it is queued).
        """
        if not (type(source) is str and isinstance(files, (list, tuple))
                and all(isinstance(item, (list, tuple)) and len(item) == 2
                        and type(item[0]) is str and isinstance(item[1], (list, tuple))
                        for item in files)):
            self.counts["file_lists_rejected"] += 1
            self.last_error = f"files of tasks rejected from {source!r}"
            return {"status": "rejected", "error": "expected [[key, [[path, written, size], "
                                                   "...]], ...] from a worker"}
        self.counts["file_lists_received"] += len(files)
        for name, listed in files:
            self.record(TaskFiles(name, source, listed))
        return {"status": "OK"}

    def queue_batch(self, batch: bytes) -> tuple[int, bool]:
        """Queue a worker's batch: how many events it holds, and whether in columns.

        Raises
        ------
        BatchError
            If the batch is refused: nothing of it is queued.
        """
        raise NotImplementedError

    def queue_reports(self, source: Any, tasks: bytes, count: int) -> None:
        """Queue the ``count`` tasks a worker reported, as received (a
        :class:`~crux_dask.plugins.entries.Reported` entry): each is checked as it is applied."""
        self.queue.append(Reported(source, bytes(tasks), count))

    def apply_soon(self) -> None:
        """Apply (or send) the queue promptly, without doing it in the caller."""
        raise NotImplementedError

    def failed(self, where: str, error: Exception) -> None:
        """Count a hook or apply that raised; log the first one."""
        self.counts["hook_errors"] += 1
        if self.counts["hook_errors"] == 1:
            logger.warning("Crux %s hook failed (further failures are only counted): %r",
                           where, error, exc_info=error)
        self.last_error = f"{where}: {type(error).__name__}: {error}"


#: The most bytes a msgpack array's head takes (its type, and a 32-bit length).
_LONGEST_ARRAY_HEAD = 5


def count_reports(tasks: Any) -> int:
    """How many tasks a worker's report holds (:data:`~crux_dask.plugins.protocol.TASKS`),
    read from its head only.

    Raises
    ------
    BatchError
        If it is not msgpack bytes of an array, or too large.
    """
    if not isinstance(tasks, (bytes, bytearray, memoryview)):
        raise BatchError(f"tasks must be msgpack bytes, got {type(tasks).__name__}")
    if len(tasks) > MAX_BATCH_BYTES:
        raise BatchError(f"tasks of {len(tasks)} bytes, more than {MAX_BATCH_BYTES}")
    unpacker = msgpack.Unpacker()
    unpacker.feed(bytes(tasks[:_LONGEST_ARRAY_HEAD]))  # not a copy of the whole report
    try:
        count = unpacker.read_array_header()
    except Exception as error:  # msgpack raises several unrelated types
        raise BatchError(f"tasks are not a msgpack array: {error}") from None
    if count > MAX_BATCH_EVENTS:
        raise BatchError(f"{count} tasks, more than {MAX_BATCH_EVENTS}")
    return count


def unpack_reports(tasks: bytes) -> list:
    """The tasks of a worker's report, unpacked (not checked: see
    :func:`~crux_dask.plugins.tasks.reported_task`)."""
    try:
        reports = msgpack.unpackb(tasks, raw=False, strict_map_key=False, max_ext_len=0)
    except Exception as error:
        raise BatchError(f"tasks are not valid msgpack: {error}") from None
    if not isinstance(reports, list):
        raise BatchError("tasks are not a msgpack array")
    return reports
