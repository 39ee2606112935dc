"""The scheduler's queue of recorded events, and the one place that applies them.

Hooks and the workers' RPC handler only append to :attr:`Ingest.queue`: tuples
in the builder's form, tasks as the transition hook recorded them as it sent
them and, for those no worker reports, as they finished
(:mod:`crux_dask.plugins.tasks`), graphs that reached the scheduler, lost
workers, the workers' batches and the tasks they report, and the files of tasks
a worker sized after their report (joined to it before it is applied). The same
queue entries feed an ingest in a process of its own
(:mod:`crux_dask.plugins.graph_process`). The graph grows from the queue in
slices of a few milliseconds each (at most ``slice_events`` events, fewer while
events are slow to apply), each followed by a turn of the event loop: from the
periodic callback, from a callback a hook schedules when the queue passes
``crux-dask.max-pending-events``, and from :meth:`Ingest.drain` when a client
asks for the graph. Requests to the dashboard read what is applied so far.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from tornado.ioloop import IOLoop

from crux_dask.codec import decode_batch, read_head
from crux_dask.columns import EventColumns
from crux_dask.events import event_time
from crux_dask.plugins.protocol import FOLLOW
from crux_dask.plugins.recorder import (
    COUNTS,
    GRAPH,
    LOST,
    REPORTS,
    TASK_FILES,
    Recorder,
    unpack_reports,
)
from crux_dask.plugins.tasks import (
    DONE,
    SENT,
    TASK,
    Announced,
    Finished,
    Reports,
    Sending,
    reported_task,
    scheduler_task,
    task_events,
)
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

class Ingest(Recorder):
    """Received events, queued in order, and their application to a builder.

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
    sending : Sending
        What the scheduler recorded of the tasks it sent, until they finish.
    reports : Reports
        The tasks the scheduler saw finish, until their worker reports them.
    announced : Announced
        When the scheduler saw the latest tasks finish: the ``requested``
        moment of the data clients gathered.
    awaiting_files, early_files : dict
        Tasks waiting for the files their worker sizes after their report,
        and files that came before their task; each with when it started
        waiting, by (key string, worker).
    """

    def __init__(self, builder: PAGBuilder, spool: Spool, *, max_pending: int,
                 park_timeout: float, slice_events: int = SLICE_EVENTS,
                 slice_seconds: float | None = SLICE_SECONDS) -> None:
        super().__init__(max_pending, COUNTS)
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
        self.sending = Sending()
        self.reports = Reports()
        self.announced = Announced()
        self.awaiting_files: dict[tuple[str, Any], tuple[Finished, float]] = {}
        self.early_files: dict[tuple[str, Any], tuple[Any, float]] = {}
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
                if entry[0] == GRAPH:  # made now, as :meth:`root` does
                    self.roots[entry[1]] = self.builder.root(entry[2], entry[3])
                    self.counts["events_applied"] += 1
                    continue
                self.queue.append(entry)
                self.pending += entry[3] if entry[0] == REPORTS else 1
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
            IOLoop.current().add_callback(self._step)

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
        and the others go on.  Returns how many events were taken from the
        queue.
        """
        started = time.perf_counter(), time.thread_time()
        queue, backlog = self.queue, self.backlog
        now = self.clock()
        taken = failed = 0
        room = self.limit  # events this slice may still apply

        def refuse(event: Any, error: Exception) -> None:
            nonlocal failed
            failed += 1
            self.last_error = f"{type(error).__name__}: {error}"

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
                kind = item[0]
                if kind == REPORTS:
                    tasks, size = self._take_reports(room, refuse)
                else:
                    queue.popleft()
                    tasks, size = (), 1
                taken += size
                room -= size
                try:
                    if kind == SENT:
                        self.sending.record(item)
                    elif kind == DONE:
                        self.announced.done(self.reports.done(item, now), item[3])
                    elif kind == TASK:
                        tasks = (scheduler_task(item),)
                    elif kind == TASK_FILES:
                        tasks = self._files_came(item, now)
                    elif kind == LOST:  # what the worker held is gone
                        for task in self._unreported(item[1], None):
                            events += self._events_of(task, now, refuse)
                        self._apply_run(parts, events, now, refuse)
                        parts, events = [], []
                        self.builder.lose(item[1], item[2])
                    elif kind != REPORTS:
                        events.append(item)
                except Exception as error:
                    refuse(item, error)
                for task in tasks:
                    # a task its files completed has been through _task_came already
                    unfolded = (self._unfold(task, refuse) if kind == TASK_FILES
                                else self._events_of(task, now, refuse))
                    if not unfolded:  # waits for its files, or refused
                        continue
                    alone = task.files is not None  # see below
                    if alone:
                        self._apply_run(parts, events, now, refuse)
                        parts, events = [], []
                    fits = max(room, 0) + 1
                    events.extend(unfolded[:fits])
                    backlog.extend(unfolded[fits:])
                    room -= min(len(unfolded), fits) - 1
                    if alone:
                        # A task that opened files comes in the order tasks finished on
                        # the scheduler, which a file read after it was written elsewhere
                        # must keep: the workers' clocks, each estimated from its
                        # heartbeats, can put the read first by more than the time between.
                        self._apply_run([], events, now, refuse)
                        events = []
            self._apply_run(parts, events, now, refuse)
        finally:
            self.pending -= taken
            self.taken += taken
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

    def _apply_run(self, parts: list[EventColumns], events: list[tuple], now: float,
                   refuse: Any) -> None:
        """Apply batches received in columns, then ``events``, as one run, in time order.

        The scheduler reports a task when it finishes; the worker that fetched
        its inputs reports the fetches in its next batch.  Applied as
        received, the task would wait for them; in the order things
        happened, most events find what they need (clocks permitting).
        """
        for part in parts:
            self.announced.gathers_in(part)
        self.announced.gathers(events)
        if not parts:
            if events:
                self.builder.apply_many(_in_time_order(events), now, on_error=refuse)
            return
        if events:
            parts.append(EventColumns.from_events(events))
        columns = EventColumns.concat(parts)
        order = np.argsort(columns.times(), kind="stable")
        if np.any(order[1:] < order[:-1]):
            columns = columns.take(order)
        self.builder.apply_columns(columns, now, on_error=refuse)

    def _take_reports(self, room: int, refuse: Any) -> tuple[list[Finished], int]:
        """The tasks of the :data:`REPORTS` entry at the head of the queue, at most
        ``room`` of them (the rest stay at the head, unpacked), and how many were taken.

        A report that cannot be unpacked is refused whole, one that is not of
        :func:`~crux_dask.plugins.tasks.reported_task`'s form alone.
        """
        _, source, reports, count = self.queue[0]
        if not isinstance(reports, list):
            try:
                reports = unpack_reports(reports)
            except (BatchError, ValueError) as error:
                self.queue.popleft()
                for _ in range(count):
                    refuse(reports, error)
                return [], count
        if len(reports) > room:
            self.queue[0] = (REPORTS, source, reports[room:], len(reports) - room)
            reports = reports[:room]
        else:
            self.queue.popleft()
        tasks = []
        now = self.clock()
        for report in reports:
            try:
                task = reported_task(report, source)
            except ValueError as error:
                refuse(report, error)
            else:
                self.reports.reported(task, now)
                tasks.append(task)
        return tasks, len(reports)

    def _unreported(self, worker: Any, older_than: float | None) -> list[Finished]:
        """:meth:`Reports.unreported <crux_dask.plugins.tasks.Reports.unreported>`, counted
        as ``tasks_unreported``."""
        tasks = self.reports.unreported(worker, older_than)
        self.counts["tasks_unreported"] += len(tasks)
        return tasks

    def _events_of(self, task: Finished, now: float, refuse: Any) -> list[tuple]:
        """The builder's events of a task that came (:meth:`_task_came`); none while it
        waits for its files."""
        task = self._task_came(task, now)
        return [] if task is None else self._unfold(task, refuse)

    def _unfold(self, task: Finished, refuse: Any) -> list[tuple]:
        """:func:`~crux_dask.plugins.tasks.task_events` of ``task``; none if it cannot be
        made (``refuse`` is told)."""
        try:
            return task_events(task, self.roots, self.wall)
        except Exception as error:
            refuse(task, error)
            return []

    def _task_came(self, task: Finished, now: float) -> Finished | None:
        """``task`` with what the scheduler recorded as it sent it, and its files if
        they follow it; ``None`` while it waits for them."""
        task = task._replace(sent=self.sending.take(task.key))
        files = task.files
        if not (type(files) in (tuple, list) and len(files) == 3 and files[2] == FOLLOW):
            return task
        join = (task.key, task.worker)
        early = self.early_files.pop(join, None)
        if early is None:
            self.awaiting_files[join] = (task, now)
            return None
        return _with_files(task, early[0])

    def _files_came(self, item: tuple, now: float) -> tuple[Finished, ...]:
        """The task a :data:`TASK_FILES` entry completes, if it came before them."""
        join = (item[1], item[2])
        waiting = self.awaiting_files.pop(join, None)
        if waiting is None:
            self.early_files[join] = (item[3], now)
            return ()
        return (_with_files(waiting[0], item[3]),)

    def _release_files(self, older_than: float | None) -> None:
        """Apply the tasks that waited for their files since before ``older_than`` (all:
        ``None``) without them; forget files whose task never came."""
        late = [join for join, (_, since) in self.awaiting_files.items()
                if older_than is None or since < older_than]
        if late:
            self.counts["file_lists_missing"] += len(late)
            events = []
            for join in late:
                events += self._unfold(_with_files(self.awaiting_files.pop(join)[0], []),
                                       self._refused)
            self.builder.apply_many(_in_time_order(events), self.clock(),
                                    on_error=self._refused)
        unmatched = [join for join, (_, since) in self.early_files.items()
                     if older_than is None or since < older_than]
        self.counts["file_lists_unmatched"] += len(unmatched)
        for join in unmatched:
            del self.early_files[join]

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
        self._release_files(older_than)
        now = self.clock()
        events = [event for task in self._unreported(None, now - self.park_timeout)
                  for event in self._events_of(task, now, self._refused)]
        if events:
            self.builder.apply_many(_in_time_order(events), now,
                                    on_error=self._refused)
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


def _with_files(task: Finished, files: Any) -> Finished:
    """``task`` whose files are ``files`` instead of the mark that they follow."""
    io, host, _ = task.files
    return task._replace(files=(io, host, files))


def _in_time_order(events: list[tuple]) -> list[tuple]:
    """``events`` sorted by when they happened (stable, by
    :func:`~crux_dask.events.event_time`: one without a time first, for the builder to
    refuse)."""
    return sorted(events, key=event_time)
