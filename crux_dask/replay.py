"""The scheduler model of the what-if replay: a recorded run's tasks played on a cluster.

The model (see :mod:`crux_dask.whatif` for what it stands for and what it
leaves out) is a discrete-event loop over the tasks of a :class:`Run`: a
queue ordered by Dask's priorities, ``decide_worker``-like placement,
root-task queuing, threads per worker, fetches that cost latency plus bytes
over bandwidth, and the scheduling gaps measured in the run.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from crux_dask.store import PAGStore

__all__ = ["Gaps", "Run", "Schedule", "simulate"]

#: Dask's default ``distributed.scheduler.worker-saturation``.
WORKER_SATURATION = 1.1
#: Dask's ``rootish-taskgroup`` and ``rootish-taskgroup-dependencies`` defaults.
ROOTISH_GROUPS = 5
ROOTISH_DEPENDENCIES = 5



@dataclass
class Gaps:
    """Seconds between what released a task and its next step, medians of the run.

    Where the run recorded when each worker received its tasks, the scheduler's
    part (release to arrival at the worker) and the worker's part (inputs there
    and a thread free to the start) are measured apart; without that moment,
    the whole interval counts as the scheduler's part.

    Attributes
    ----------
    first : float
        Graph root to a task without inputs reaching its worker.
    local : float
        A task's last input computed to the task reaching its worker (the
        scheduler's round trip).
    slot : float
        A queue slot freed to the root task it released reaching its worker.
    fetch : float
        A task reaching its worker to the start of fetching an input held
        elsewhere.
    dispatch : float
        A task at its worker with its inputs there and a thread free, to its
        start.
    """

    first: float = 0.0
    local: float = 0.0
    slot: float = 0.0
    fetch: float = 0.0
    dispatch: float = 0.0


@dataclass
class Run:
    """A recorded run reduced to what the replay needs; tasks in priority order.

    A task's index is its rank: Dask's priority where the run recorded every
    task's, else its recorded start.

    Attributes
    ----------
    store : PAGStore
        The recorded graph.
    state : numpy.ndarray
        The state each task computed.
    duration : numpy.ndarray
        Compute seconds of each task.
    spill : numpy.ndarray
        Seconds of spilling charged to each task.
    size : numpy.ndarray
        Bytes of each task's output.
    label : numpy.ndarray
        Label code of each task (``store.labels``).
    worker : numpy.ndarray
        Index of the worker each task ran on (into ``workers``).
    dep_ptr, deps : numpy.ndarray
        Input tasks of each task, as compressed rows.
    workers : list of str
        Addresses of the workers that ran tasks.
    threads : int
        Threads per worker seen (the most distinct threads of any worker).
    gaps : Gaps
    latency, bandwidth : float
        Of transfers between workers: seconds, and bytes per second.
    outputs : numpy.ndarray
        Tasks whose results went to the client, with ``output_delay``: seconds
        from the last of them computed to each one's arrival there.
    output_delay : numpy.ndarray
    origin : float
        Time of the graph's root.
    makespan : float
        Seconds from ``origin`` to the run's end state.
    """

    store: PAGStore
    state: np.ndarray
    duration: np.ndarray
    spill: np.ndarray
    size: np.ndarray
    label: np.ndarray
    worker: np.ndarray
    dep_ptr: np.ndarray
    deps: np.ndarray
    workers: list[str]
    threads: int
    gaps: Gaps
    latency: float
    bandwidth: float
    outputs: np.ndarray
    output_delay: np.ndarray
    origin: float
    makespan: float

    @property
    def n_tasks(self) -> int:
        return len(self.state)

    @cached_property
    def replay(self) -> Schedule:
        """The unchanged replay (computed once)."""
        return simulate(self, len(self.workers), self.threads, self.duration + self.spill,
                        self.gaps, self.latency, self.bandwidth)

    @cached_property
    def label_names(self) -> np.ndarray:
        """The label of each task, as strings."""
        return np.asarray(self.store.labels.values, dtype=object)[self.label]


@dataclass
class Schedule:
    """What the replay decided for every task, and the transfers it made.

    ``sent``: when it was sent to its worker (later than its inputs were
    computed for a root task queued on the scheduler); ``released_by``: the
    task whose end freed the queue slot that sent it (``-1`` for none);
    ``runnable``: at its worker with its inputs there.
    """

    worker: np.ndarray
    thread: np.ndarray
    sent: np.ndarray
    released_by: np.ndarray
    runnable: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    transfers: list[tuple[int, int, int, float, float]]
    workers: int
    makespan: float


def simulate(run: Run, workers: int, threads: int, duration: np.ndarray, gaps: Gaps,
             latency: float, bandwidth: float,
             saturation: float = WORKER_SATURATION) -> Schedule:
    """Replay ``run`` on ``workers`` × ``threads`` with these task seconds and transfer costs.

    Returns
    -------
    Schedule
        Times are seconds from the graph's root.

    Raises
    ------
    ValueError
        If the recorded inputs form a cycle.
    """
    replay = _Replay(run, workers, threads, duration, gaps, latency, bandwidth, saturation)
    replay.play()
    stop = np.asarray(replay.t_stop)
    makespan = float(stop.max())
    if len(run.outputs):
        makespan = max(makespan, float(stop[run.outputs].max() + run.output_delay.max()))
    return Schedule(np.asarray(replay.w_of), np.asarray(replay.th_of),
                    np.asarray(replay.t_sent), np.asarray(replay.released_by),
                    np.asarray(replay.t_run), np.asarray(replay.t_start), stop, replay.moved,
                    workers, makespan)


class _Replay:
    """One replay under way: the run's tables as lists, and the cluster's state.

    Tasks are placed once their inputs are computed (:meth:`place`), sent to
    a worker (:meth:`assign`), started once they are runnable there and a
    thread is free (:meth:`begin`), and free their thread, queue slot and
    dependents as they finish (:meth:`finish`).  :meth:`play` runs the events
    in time order.
    """

    def __init__(self, run: Run, workers: int, threads: int, duration: np.ndarray,
                 gaps: Gaps, latency: float, bandwidth: float, saturation: float) -> None:
        n = run.n_tasks
        self.workers, self.threads, self.gaps, self.latency = workers, threads, gaps, latency
        self.dep_ptr, self.deps = run.dep_ptr.tolist(), run.deps.tolist()
        self.size, self.dur = run.size.tolist(), duration.tolist()
        # Dependents, as compressed rows.
        consumers = np.repeat(np.arange(n), np.diff(run.dep_ptr))
        by_dep = np.argsort(run.deps, kind="stable")
        self.users = consumers[by_dep].tolist()
        self.user_ptr = np.searchsorted(run.deps[by_dep], np.arange(n + 1)).tolist()
        self.waiting = np.diff(run.dep_ptr).tolist()
        # Expected seconds per label (what Dask's occupancy uses) and root-ish tasks.
        label = run.label
        per_label = np.bincount(label, duration) / np.maximum(np.bincount(label), 1)
        self.expected = per_label[label].tolist()
        self.rootish = _rootish(run, workers * threads).tolist()
        self.per_byte = 0.0 if math.isinf(bandwidth) else 1.0 / bandwidth
        self.slots = (max(math.ceil(saturation * threads), 1) if math.isfinite(saturation)
                      else n + 1)
        self.occupancy = [0.0] * workers
        self.processing = [0] * workers
        self.free = [list(range(threads - 1, -1, -1)) for _ in range(workers)]
        self.ready: list[list[int]] = [[] for _ in range(workers)]
        self.queue: list[int] = []  # root-ish tasks waiting for a slot, by priority
        self.held: dict[int, float] = {}  # task * workers + worker -> when its data is there
        self.holders: list[list[int]] = [[] for _ in range(n)]  # the workers a result is at
        self.home, self.w_of, self.th_of = [0] * n, [0] * n, [0] * n
        self.released_by = [-1] * n
        self.t_sent, self.t_run, self.t_start, self.t_stop = ([0.0] * n for _ in range(4))
        self.moved: list[tuple[int, int, int, float, float]] = []
        # (time, 0 done / 1 runnable, task, worker)
        self.events: list[tuple[float, int, int, int]] = []

    def play(self) -> None:
        """Place the tasks without inputs, then run every event in time order."""
        for task in range(len(self.waiting)):
            if self.waiting[task] == 0:
                self.place(task, 0.0)
        events, ready, free = self.events, self.ready, self.free
        while events:
            t, what, task, w = heapq.heappop(events)
            if what:  # runnable on w
                heapq.heappush(ready[w], task)
                if free[w]:
                    self.begin(t, w)
            else:
                self.finish(t, task, w)
        if self.queue or any(self.waiting):
            raise ValueError("the replay could not run every task: the recorded inputs "
                             "form a cycle")

    def begin(self, t: float, w: int) -> None:
        """Start the first ready task of ``w`` on a free thread at ``t``."""
        task = heapq.heappop(self.ready[w])
        self.th_of[task] = self.free[w].pop()
        self.t_start[task] = start = t + self.gaps.dispatch
        heapq.heappush(self.events, (start + self.dur[task], 0, task, w))

    def assign(self, task: int, w: int, t: float) -> None:
        """Send ``task`` to ``w`` at ``t`` (its inputs all computed by then)."""
        self.processing[w] += 1
        self.occupancy[w] += self.expected[task]
        self.w_of[task] = w
        self.t_sent[task] = t
        lo, hi = self.dep_ptr[task], self.dep_ptr[task + 1]
        gaps = self.gaps
        if lo == hi:
            when = t + (gaps.slot if t > 0 else gaps.first)
        else:
            when = arrived = t + gaps.local
            held, workers, size = self.held, self.workers, self.size
            for d in self.deps[lo:hi]:
                there = held.get(d * workers + w)
                if there is None:
                    began = arrived + gaps.fetch
                    there = began + self.latency + size[d] * self.per_byte
                    held[d * workers + w] = there
                    self.holders[d].append(w)
                    self.moved.append((d, self.home[d], w, began, there))
                if there > when:
                    when = there
        self.t_run[task] = when
        heapq.heappush(self.events, (when, 1, task, w))

    def place(self, task: int, t: float) -> None:
        """Choose the worker of ``task``, whose inputs are computed at ``t``, as Dask
        would: a root-ish task the least busy worker with a free slot (else it
        queues), another the worker where its inputs cost least to fetch."""
        processing, occupancy = self.processing, self.occupancy
        workers = range(self.workers)
        if self.rootish[task]:
            w = min(workers, key=lambda w: (processing[w], occupancy[w], w))
            if processing[w] < self.slots:
                self.assign(task, w, t)
            else:
                heapq.heappush(self.queue, task)
            return
        lo, hi = self.dep_ptr[task], self.dep_ptr[task + 1]
        if lo == hi:
            w = min(workers, key=lambda w: (occupancy[w], processing[w], w))
        else:
            deps, held, size, n_workers = self.deps[lo:hi], self.held, self.size, self.workers
            candidates = {w for d in deps for w in self.holders[d]}
            w = min(candidates, key=lambda w: (
                occupancy[w] / self.threads + self.per_byte * sum(
                    size[d] for d in deps if d * n_workers + w not in held),
                processing[w], w))
        self.assign(task, w, t)

    def finish(self, t: float, task: int, w: int) -> None:
        """``task`` finished on ``w`` at ``t``: its thread, slot and dependents are free."""
        self.t_stop[task] = t
        self.home[task] = w
        self.held[task * self.workers + w] = t
        self.holders[task].append(w)
        self.free[w].append(self.th_of[task])
        self.processing[w] -= 1
        self.occupancy[w] -= self.expected[task]
        if self.ready[w]:
            self.begin(t, w)
        waiting = self.waiting
        for user in self.users[self.user_ptr[task]:self.user_ptr[task + 1]]:
            waiting[user] -= 1
            if waiting[user] == 0:
                self.place(user, t)
        queue = self.queue
        while queue and self.processing[w] < self.slots:
            queued = heapq.heappop(queue)
            self.released_by[queued] = task
            self.assign(queued, w, t)


def _rootish(run: Run, total_threads: int) -> np.ndarray:
    """Tasks of root-ish groups, by Dask's rule, with labels standing for task groups."""
    n_labels = int(run.label.max()) + 1
    group_size = np.bincount(run.label, minlength=n_labels)
    consumers = np.repeat(np.arange(run.n_tasks), np.diff(run.dep_ptr))
    pairs = np.unique(np.stack([run.label[consumers], run.label[run.deps]]), axis=1)
    # Tasks of each group's input groups, and how many such groups.
    dep_groups = np.bincount(pairs[0], minlength=n_labels)
    dep_tasks = np.bincount(pairs[0], weights=group_size[pairs[1]], minlength=n_labels)
    ok = ((group_size > 2 * total_threads) & (dep_groups < ROOTISH_GROUPS)
          & (dep_tasks < ROOTISH_DEPENDENCIES))
    return ok[run.label]
