"""The scheduler's queue of recorded events, and the one place that applies them.

Hooks and the workers' RPC handler only append to :attr:`Ingest.queue`: tuples
in the builder's form, tasks as the transition hook recorded them as it sent
them and, for those no worker reports, as they finished
(:mod:`crux_dask.plugins.tasks`), graphs that reached the scheduler, lost
workers, the workers' batches and the tasks they report, and the files of tasks
a worker sized after their report (joined to it before it is applied: see
:mod:`crux_dask.plugins.joins`). The same queue entries feed an ingest in a
process of its own (:mod:`crux_dask.plugins.graph_process`). The graph grows
from the queue in slices of a few milliseconds each (at most ``slice_events``
events, fewer while events are slow to apply, in runs applied in time order:
:mod:`crux_dask.plugins.time_order`), each followed by a turn of the event
loop: from the periodic callback, from a callback a hook schedules when the
queue passes ``crux-dask.max-pending-events``, and from :meth:`Ingest.drain`
when a client asks for the graph. Requests to the dashboard read what is
applied so far.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from crux_dask.codec import decode_batch, read_head
from crux_dask.columns import EventColumns
from crux_dask.plugins.entries import Done, Graph, Lost, Reported, Sent, TaskFiles, Whole
from crux_dask.plugins.joins import TaskJoins
from crux_dask.plugins.recorder import COUNTS, Recorder
from crux_dask.plugins.tasks import Finished, scheduler_task
from crux_dask.plugins.time_order import Refuse, apply_run, in_time_order
from crux_dask.validation import BatchError

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder
    from crux_dask.plugins.spool import Spool

logger = logging.getLogger(__name__)

__all__ = ["SLICE_EVENTS", "SLICE_SECONDS", "Ingest"]

#: The most events applied in one slice: enough for the builder to apply
#: routine events in windows (about a microsecond each).
SLICE_EVENTS = 2048
#: What one slice should take of the event loop.  Events that wait for inputs
#: reported late go one by one at 5-10 microseconds each, routine ones in
#: windows at about one: after each full or slow slice, the bound on events per
#: slice is set to what fits in this time at the rate just measured (from
#: ``SLICE_MIN`` to ``slice_events``).
SLICE_SECONDS = 0.005
SLICE_MIN = 128

class Ingest(TaskJoins, Recorder):
    """Received events, queued in order, and their application to a builder.

    Each task's records are joined by its mixin
    :class:`~crux_dask.plugins.joins.TaskJoins` (whose attributes are
    ``sending``, ``reports``, ``announced``, ``awaiting_files`` and ``early_files``).

    Parameters
    ----------
    builder : PAGBuilder
        The builder of the segment being recorded.
    spool : Spool
        Where the graph goes when it grows past its bound.
    max_pending : int
        Queued events past which a hook schedules a prompt apply.
    park_timeout : float
        Seconds an event may wait for an input before it gets a stand-in.
    slice_events : int
        The most events one slice applies; a worker's batch larger than what
        is left of a slice is split.
    slice_seconds : float or None
        What a slice should take: the events per slice follow the rate of
        the last slices (:data:`SLICE_SECONDS`).  ``None``: always
        ``slice_events``.

    Attributes
    ----------
    builder : PAGBuilder
        The builder of the segment being recorded (replaced when it spools).
    queue : collections.deque
        Events received and not applied yet: tuples, and the workers' batches
        in columns (:class:`~crux_dask.columns.EventColumns`); see
        :class:`Recorder` for the counts.
    taken : int
        Events taken from the queue since the start.
    limit : int
        Events the next slice may apply.
    roots : dict of int to int
        The root state of each graph, by the number :meth:`root` gave it.
    """

    def __init__(self, builder: PAGBuilder, spool: Spool, *, max_pending: int,
                 park_timeout: float, slice_events: int = SLICE_EVENTS,
                 slice_seconds: float | None = SLICE_SECONDS) -> None:
        Recorder.__init__(self, max_pending, COUNTS)
        self.builder = builder
        self.spool = spool
        self.park_timeout = park_timeout
        self.slice_events = slice_events
        # Events a task's entry unfolded into that the slice had no room for
        # (a task that opened many files): applied before the queue goes on.
        self.backlog: deque[tuple] = deque()
        self.taken = 0
        self.slice_seconds = slice_seconds
        self.limit = slice_events if slice_seconds is None else min(slice_events, 4 * SLICE_MIN)
        self.roots: dict[int, int] = {}
        TaskJoins.__init__(self)
        self._soon = False  # a callback that applies the next slice is scheduled
        #: What the ingest reads the time from: the monotonic clock, and the wall's.
        self.clock: Callable[[], float] = time.monotonic
        self.wall: Callable[[], float] = time.time

    @property
    def received(self) -> int:
        """Events received since the start (taken from the queue or in it)."""
        return self.taken + self.pending

    # -- recording: cheap, never applies --------------------------------------
    def queue_batch(self, batch: bytes) -> tuple[int, bool]:
        """Queue a worker's batch, checked (:func:`~crux_dask.codec.decode_batch`): in
        columns if it came so, else its rows."""
        decoded = decode_batch(batch)
        if decoded.columns is not None:
            self.queue.append(decoded.columns)
        else:
            self.queue.extend(decoded.rows)
        return len(decoded), decoded.columns is not None

    def take(self, entries: list) -> None:
        """Queue what another process recorded, in order: queue entries, and the
        workers' batches as received (bytes, of which that process read the head:
        :func:`~crux_dask.codec.read_head`).  A batch whose events turn out to be
        malformed is counted in ``batches_failed``, its events in ``events_failed``."""
        for entry in entries:
            if isinstance(entry, tuple):
                if type(entry) is Graph:  # made now, as :meth:`root` does
                    self.roots[entry.number] = self.builder.root(entry.time, entry.label)
                    self.counts["events_applied"] += 1
                    continue
                self.queue.append(entry)
                self.pending += entry.count if type(entry) is Reported else 1
            else:
                try:
                    self.pending += self.queue_batch(entry)[0]
                except BatchError as error:  # only its head was read: its events failed
                    self.counts["batches_failed"] += 1
                    self.counts["events_failed"] += read_head(entry).events
                    self.last_error = f"batch rejected: {error}"

    def apply_soon(self) -> None:
        """Schedule slices on the running event loop until the queue is empty (once)."""
        if not self._soon:
            self._soon = True
            asyncio.get_running_loop().call_soon(self._step)

    # -- applying -----------------------------------------------------------------
    def root(self, time: float, label: str) -> int:
        """The root state of a graph that reached the scheduler, made now (it needs
        nothing); the number the graph's tasks name it by."""
        number = self.next_graph()
        self.roots[number] = self.builder.root(time, label)
        return number

    def add_external(self, kind: str, **fields: Any) -> int:
        """Apply one mutation reported from outside Dask, on the graph applied so far.

        ``fields`` are those of :meth:`PAGBuilder.external`; the queue is left
        as it is.  Returns the new state's id.

        Raises
        ------
        ValueError
            If a source state does not exist or the kind is unknown.
        """
        return self.builder.external(kind, **fields)

    def tick(self) -> None:
        """The periodic callback: apply a slice, then the rest a slice per loop turn."""
        if not self._soon:  # else the slices scheduled go on by themselves
            self._step()

    async def drain(self) -> None:
        """Apply every event queued before the call, then resolve every waiting event.

        Slices alternate with turns of the event loop.  Events still waiting
        for an input that was never reported get the best stand-in now,
        instead of after the park timeout.
        """
        target = self.received
        while (self.taken < target and self.queue) or self.backlog:
            self.apply_slice()
            await asyncio.sleep(0)
        self.resolve(None)

    def apply_slice(self) -> int:
        """Apply the oldest queued events, at most :attr:`limit` of them.

        The backlog goes first.  An event that cannot be applied is counted
        and the others go on.  The limit of the next slice then follows the
        time this one took (:data:`SLICE_SECONDS`).  Returns how many events
        were taken from the queue.
        """
        started = time.perf_counter(), time.thread_time()
        failed = 0

        def refuse(event: Any, error: Exception) -> None:
            nonlocal failed
            failed += 1
            self.last_error = f"{type(error).__name__}: {error}"

        taken, room = self._take_slice(self.clock(), refuse)
        self.counts["events_applied"] += taken - failed
        self.counts["events_failed"] += failed
        self._spool_if_due()
        elapsed = self._took(started)
        target = self.slice_seconds
        applied = self.limit - room
        if target is not None and (room <= 0 or elapsed > target):
            fits = int(0.8 * applied * target / max(elapsed, 1e-6))
            self.limit = min(self.slice_events, max(SLICE_MIN, fits))
        return taken

    def _take_slice(self, now: float, refuse: Refuse) -> tuple[int, int]:
        """Take the backlog, then the queue's oldest entries, as far as :attr:`limit`
        lets, and apply them in runs; how many events were taken from the queue, and
        the room left in the slice."""
        queue, backlog = self.queue, self.backlog
        taken = 0
        room = self.limit  # events this slice may still apply
        parts: list[EventColumns] = []  # runs of events, applied together
        events: list[tuple] = []
        try:
            while backlog and room > 0:
                events.append(backlog.popleft())
                room -= 1
            while queue and room > 0:
                item = queue[0]
                if isinstance(item, EventColumns):
                    if len(item) > room:  # a batch too large for what is left
                        item, queue[0] = item.rows(0, room), item.rows(room, len(item))
                    else:
                        queue.popleft()
                    taken += len(item)
                    room -= len(item)
                    if events:
                        parts.append(EventColumns.from_events(events))
                        events = []
                    parts.append(item)
                    continue
                kind = type(item)
                if kind is Reported:
                    tasks, size = self._take_reports(room, refuse)
                else:
                    queue.popleft()
                    tasks, size = self._take_entry(item, now, parts, events, refuse), 1
                taken += size
                room -= size
                if tasks:
                    room = self._take_tasks(tasks, kind is TaskFiles, room, now, parts,
                                            events, refuse)
            apply_run(self.builder, self.announced, parts, events, now, refuse)
        finally:
            self.pending -= taken
            self.taken += taken
        return taken, room

    def _take_entry(self, item: Any, now: float, parts: list[EventColumns],
                    events: list[tuple], refuse: Refuse) -> Sequence[Finished]:
        """Take one entry of the queue (not a batch in columns, nor a
        :class:`~crux_dask.plugins.entries.Reported`): an event joins the slice's run
        (``parts`` and ``events``, emptied in place when applied here); the tasks it
        completes are returned."""
        kind = type(item)
        try:
            if kind is Sent:
                self.sending.record(item)
            elif kind is Done:
                self.announced.done(self.reports.done(item, now), item.time)
            elif kind is Whole:
                task = scheduler_task(item)
                self.announced.done(task.key, item.time)
                return (task,)
            elif kind is TaskFiles:
                return self._files_came(item, now)
            elif kind is Lost:  # what the worker held is gone
                for task in self._unreported(item.worker, None):
                    events += self._events_of(task, now, refuse)
                apply_run(self.builder, self.announced, parts, events, now, refuse)
                parts.clear()
                events.clear()
                self.builder.lose(item.worker, item.time)
            else:
                events.append(item)
        except Exception as error:
            refuse(item, error)
        return ()

    def _take_tasks(self, tasks: Sequence[Finished], completed: bool, room: int, now: float,
                    parts: list[EventColumns], events: list[tuple], refuse: Refuse) -> int:
        """Add the builder's events of ``tasks`` to the slice's run (``parts`` and
        ``events``, emptied in place when applied here); those of a task past the
        slice's ``room`` go to the backlog.  Returns the room left.

        ``completed``: the tasks are those their files completed, which have
        been through :meth:`~crux_dask.plugins.joins.TaskJoins._task_came` already.
        """
        backlog = self.backlog
        for task in tasks:
            unfolded = (self._unfold(task, refuse) if completed
                        else self._events_of(task, now, refuse))
            if not unfolded:  # waits for its files, or refused
                continue
            alone = task.files is not None  # see below
            if alone:
                apply_run(self.builder, self.announced, parts, events, now, refuse)
                parts.clear()
                events.clear()
            fits = max(room, 0) + 1
            events.extend(unfolded[:fits])
            backlog.extend(unfolded[fits:])
            room -= min(len(unfolded), fits) - 1
            if alone:
                # A task that opened files comes in the order tasks finished on
                # the scheduler, which a file read after it was written elsewhere
                # must keep: the workers' clocks, each estimated from its
                # heartbeats, can put the read first by more than the time between.
                apply_run(self.builder, self.announced, [], events, now, refuse)
                events.clear()
        return room

    def _step(self) -> None:
        self._soon = False
        try:
            self.apply_slice()
            if self.queue or self.backlog:
                self.apply_soon()
            else:
                self.resolve(self.clock() - self.park_timeout)
        except Exception as error:
            self.failed("apply", error)

    def _refused(self, event: Any, error: Exception) -> None:
        self.counts["events_failed"] += 1
        self.last_error = f"{type(error).__name__}: {error}"

    def resolve(self, older_than: float | None) -> None:
        """Give waiting events a stand-in: those waiting since before ``older_than``, or all.

        Tasks that waited as long for the files their worker sizes after
        them go without (counted as ``file_lists_missing``).  Tasks whose
        report waited longer than ``park_timeout`` (whatever ``older_than``)
        are recorded from what the scheduler saw (``tasks_unreported``): one
        that finished since its worker last sent what it had is not given up
        on, or its report, when it comes, would make it a second time.
        """
        started = time.perf_counter(), time.thread_time()
        self._release_files(older_than, self._refused)
        now = self.clock()
        events = [event for task in self._unreported(None, now - self.park_timeout)
                  for event in self._events_of(task, now, self._refused)]
        if events:
            self.builder.apply_many(in_time_order(events), now, on_error=self._refused)
        self.builder.resolve_parked(older_than)
        self._spool_if_due()
        self._took(started)

    def _took(self, started: tuple[float, float]) -> float:
        """Account for an apply begun at ``started`` (wall, thread CPU); return its wall time."""
        elapsed = time.perf_counter() - started[0]
        self.seconds["apply"] += time.thread_time() - started[1]
        self.seconds["longest_slice"] = max(self.seconds["longest_slice"], elapsed)
        return elapsed

    def _spool_if_due(self) -> None:
        if self.spool.due(self.builder):
            self.builder = self.spool.spool(self.builder, self.wall())

