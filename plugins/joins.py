"""A task's records joined: the scheduler's, its worker's report, and the files sized after it.

The scheduler and a task's worker each record what only the one knows
(:mod:`crux_dask.plugins.tasks`); the ingest joins them by the task's key.
:class:`Sending` keeps what the scheduler recorded as it sent each task until
the task is reported; :class:`Reports` keeps the tasks the scheduler saw
finish until their worker reports them, and makes those whose report never
comes from what the scheduler saw; :class:`Announced` keeps when the scheduler
saw each task finish, which is when a client waiting for its data was told.

:class:`TaskJoins`, a mixin of :class:`~crux_dask.plugins.ingest.Ingest`, is the
ingest's side of the joins: it takes the workers' reports from the queue, makes
each task whole (with the files its worker sized after reporting it, if they
follow) and unfolds it into the builder's events, and gives up on what waited
too long for its other half.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.columns import TRANSFER, EventColumns
from crux_dask.model import CLIENT
from crux_dask.plugins.entries import Done, Reported, Sent, TaskFiles
from crux_dask.plugins.protocol import FOLLOW, key_string
from crux_dask.plugins.recorder import unpack_reports
from crux_dask.plugins.tasks import Finished, reported_task, task_events
from crux_dask.plugins.time_order import Refuse, in_time_order
from crux_dask.validation import BatchError

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder

__all__ = ["ANNOUNCED_MAX", "SENDING_MAX", "Announced", "Reports", "Sending", "TaskJoins"]

#: Tasks sent and not reported finished that :class:`Sending` keeps, at most.
SENDING_MAX = 1_000_000
#: Finished tasks whose moment :class:`Announced` keeps, at most (the oldest go first).
ANNOUNCED_MAX = 65_536


class Sending:
    """What the scheduler recorded of each task it sent, until the task is reported.

    A task sent again before it was reported (taken back from a worker, or
    its worker lost) keeps when it was first sent.  At most
    :data:`SENDING_MAX` tasks are kept, the oldest dropped first (tasks
    released before they finished are never reported): ``dropped`` counts them.
    """

    def __init__(self, most: int = SENDING_MAX) -> None:
        self.most = most
        self.dropped = 0
        # key string -> (root number, when sent, freed key or None, freed worker or
        # None, when first sent if sent before, else None)
        self.tasks: dict[str, tuple] = {}

    def __len__(self) -> int:
        return len(self.tasks)

    def record(self, entry: Sent) -> None:
        """Keep a :class:`~crux_dask.plugins.entries.Sent` entry."""
        key, when, freed, root = entry
        name = key_string(key)
        before = self.tasks.pop(name, None)
        first = None
        if before is not None:  # taken back and sent again
            first = before[4] if before[4] is not None else before[1]
            if root == -1:
                root = before[0]
        elif len(self.tasks) >= self.most:
            del self.tasks[next(iter(self.tasks))]
            self.dropped += 1
        freed_key, freed_worker = (None, None) if freed is None else (
            key_string(freed[0]), freed[1])
        self.tasks[name] = (root, when, freed_key, freed_worker, first)

    def take(self, name: str) -> tuple | None:
        """What was recorded as the task ``name`` was sent, now that it finished."""
        return self.tasks.pop(name, None)


class Reports:
    """The tasks the scheduler saw finish, until their worker's report comes.

    The scheduler records each as a :class:`~crux_dask.plugins.entries.Done` entry.
    A report usually comes after the scheduler saw the task finish (each
    worker sends its reports in batches), rarely before: either waits for the
    other, by key and worker.  The tasks whose report never came (their worker
    died, or it waited longer than the ingest waits for anything) are
    recorded from what the scheduler saw: where, when it finished and its size.
    """

    def __init__(self) -> None:
        # (key string, worker) -> (Done entry, when it started waiting)
        self.awaited: dict[tuple[str, Any], tuple[Done, float]] = {}
        # (key string, worker) -> when a report came before its Done
        self.early: dict[tuple[str, Any], float] = {}

    def done(self, entry: Done, now: float) -> str:
        """The scheduler saw a task finish (a :class:`~crux_dask.plugins.entries.Done`
        entry); its key as a string."""
        join = (key_string(entry.key), entry.worker)
        if self.early.pop(join, None) is None:
            self.awaited[join] = (entry, now)
        return join[0]

    def reported(self, task: Finished, now: float) -> None:
        """``task``'s worker reported it."""
        join = (task.key, task.worker)
        if self.awaited.pop(join, None) is None:
            self.early[join] = now

    def unreported(self, worker: Any = None, older_than: float | None = None
                   ) -> list[Finished]:
        """The tasks whose report did not come, as the scheduler saw them finish: those
        of ``worker`` if given, else those waiting since before ``older_than`` (all:
        ``None``).  Reports that came early and waited as long are let go."""
        if worker is not None:
            late = [join for join in self.awaited if join[1] == worker]
        else:
            late = [join for join, (_, since) in self.awaited.items()
                    if older_than is None or since < older_than]
            for join in [join for join, since in self.early.items()
                         if older_than is None or since < older_than]:
                del self.early[join]
        tasks = []
        for join in late:
            _, where, when, nbytes = self.awaited.pop(join)[0]
            tasks.append(Finished(join[0], False, where, None, when, when, nbytes, (), None,
                                  None, None, None, announced=when))
        return tasks


class Announced:
    """When the scheduler saw each task finish, which is when it told the clients
    waiting for its data.

    A worker records the data a client gathered (a ``transfer`` to
    :data:`~crux_dask.model.CLIENT`) from its own log of outgoing transfers,
    which does not say when the client asked.  The scheduler's moment splits the
    time from the task's end to the gather: before it, the worker's message that
    the task finished reached the scheduler; after it, the scheduler told the
    client, the client asked for the data, and its request reached the worker.
    It becomes the gather's ``requested`` moment.

    Parameters
    ----------
    capacity : int
        How many tasks to keep, the most recently finished: data gathered long
        after it was made keeps no moment.
    """

    def __init__(self, capacity: int = ANNOUNCED_MAX) -> None:
        self.capacity = capacity
        self._at: OrderedDict[str, float] = OrderedDict()

    def done(self, name: str, moment: float) -> None:
        """The scheduler saw the task of key string ``name`` finish at ``moment``."""
        at = self._at
        at[name] = moment
        at.move_to_end(name)
        if len(at) > self.capacity:
            at.popitem(last=False)

    def at(self, name: str, default: float | None = None) -> float | None:
        """When the scheduler saw the task of key string ``name`` finish, if kept."""
        return self._at.get(name, default)

    def gathers(self, events: list[tuple]) -> None:
        """Give the gathers among ``events`` (in place) without a ``requested`` moment
        the scheduler's moment of their task, where kept."""
        at = self._at
        for i, event in enumerate(events):
            try:
                if (event[0] == "transfer" and event[3] == CLIENT
                        and (len(event) == 7 or (len(event) == 8 and event[7] is None))
                        and (moment := at.get(event[1])) is not None):
                    events[i] = (*event[:7], moment)
            except (IndexError, TypeError):  # malformed: the builder refuses it
                continue

    def gathers_in(self, columns: EventColumns) -> None:
        """Give the gathers in ``columns`` without a ``requested`` moment the scheduler's
        moment of their task, where kept."""
        try:
            client = columns.strings.index(CLIENT)
        except ValueError:  # no gather in the batch
            return
        strings, key, requested, at = columns.strings, columns.key, columns.requested, self._at
        for row in np.flatnonzero((columns.kind == TRANSFER) & (columns.location == client)
                                  & np.isnan(requested)):
            moment = at.get(strings[key[row]])
            if moment is not None:
                requested[row] = moment



class TaskJoins:
    """The ingest's joins of each task's records, and what waits for its other half.

    A mixin of :class:`~crux_dask.plugins.ingest.Ingest`, whose queue, counts,
    builder, graph roots and clocks its methods use.

    Attributes
    ----------
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

    queue: deque
    counts: dict[str, int]
    builder: PAGBuilder
    roots: dict[int, int]
    clock: Callable[[], float]
    wall: Callable[[], float]

    def __init__(self) -> None:
        self.sending = Sending()
        self.reports = Reports()
        self.announced = Announced()
        self.awaiting_files: dict[tuple[str, Any], tuple[Finished, float]] = {}
        self.early_files: dict[tuple[str, Any], tuple[Any, float]] = {}

    def _take_reports(self, room: int, refuse: Refuse) -> tuple[list[Finished], int]:
        """The tasks of the :class:`~crux_dask.plugins.entries.Reported` entry at the
        head of the queue, at most ``room`` of them (the rest stay at the head,
        unpacked), and how many were taken.

        A report that cannot be unpacked is refused whole, one that is not of
        :func:`~crux_dask.plugins.tasks.reported_task`'s form alone.
        """
        source, reports, count = self.queue[0]
        if not isinstance(reports, list):
            try:
                reports = unpack_reports(reports)
            except (BatchError, ValueError) as error:
                self.queue.popleft()
                for _ in range(count):
                    refuse(reports, error)
                return [], count
        if len(reports) > room:
            self.queue[0] = Reported(source, reports[room:], len(reports) - room)
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
        """:meth:`Reports.unreported`, counted as ``tasks_unreported``."""
        tasks = self.reports.unreported(worker, older_than)
        self.counts["tasks_unreported"] += len(tasks)
        return tasks

    def _events_of(self, task: Finished, now: float, refuse: Refuse) -> list[tuple]:
        """The builder's events of a task that came (:meth:`_task_came`); none while it
        waits for its files."""
        task = self._task_came(task, now)
        return [] if task is None else self._unfold(task, refuse)

    def _unfold(self, task: Finished, refuse: Refuse) -> list[tuple]:
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
        task = task._replace(sent=self.sending.take(task.key),
                             announced=self.announced.at(task.key, task.announced))
        files = task.files
        if not (type(files) in (tuple, list) and len(files) == 3 and files[2] == FOLLOW):
            return task
        join = (task.key, task.worker)
        early = self.early_files.pop(join, None)
        if early is None:
            self.awaiting_files[join] = (task, now)
            return None
        return _with_files(task, early[0])

    def _files_came(self, item: TaskFiles, now: float) -> tuple[Finished, ...]:
        """The task a :class:`~crux_dask.plugins.entries.TaskFiles` entry completes, if
        it came before them."""
        join = (item.key, item.worker)
        waiting = self.awaiting_files.pop(join, None)
        if waiting is None:
            self.early_files[join] = (item.files, now)
            return ()
        return (_with_files(waiting[0], item.files),)

    def _release_files(self, older_than: float | None, refuse: Refuse) -> None:
        """Apply the tasks that waited for their files since before ``older_than`` (all:
        ``None``) without them (``refuse`` is told of what cannot be applied); forget
        files whose task never came."""
        late = [join for join, (_, since) in self.awaiting_files.items()
                if older_than is None or since < older_than]
        if late:
            self.counts["file_lists_missing"] += len(late)
            events = []
            for join in late:
                events += self._unfold(_with_files(self.awaiting_files.pop(join)[0], []),
                                       refuse)
            self.builder.apply_many(in_time_order(events), self.clock(), on_error=refuse)
        unmatched = [join for join, (_, since) in self.early_files.items()
                     if older_than is None or since < older_than]
        self.counts["file_lists_unmatched"] += len(unmatched)
        for join in unmatched:
            del self.early_files[join]


def _with_files(task: Finished, files: Any) -> Finished:
    """``task`` whose files are ``files`` instead of the mark that they follow."""
    io, host, _ = task.files
    return task._replace(files=(io, host, files))

