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
    """
    n = run.n_tasks
    dep_ptr = run.dep_ptr.tolist()
    deps = run.deps.tolist()
    size = run.size.tolist()
    dur = duration.tolist()
    # Dependents, as compressed rows.
    consumers = np.repeat(np.arange(n), np.diff(run.dep_ptr))
    by_dep = np.argsort(run.deps, kind="stable")
    users = consumers[by_dep].tolist()
    user_ptr = np.searchsorted(run.deps[by_dep], np.arange(n + 1)).tolist()
    waiting = np.diff(run.dep_ptr).tolist()
    # Expected seconds per label (what Dask's occupancy uses) and root-ish tasks.
    label = run.label
    per_label = np.bincount(label, duration) / np.maximum(np.bincount(label), 1)
    expected = per_label[label].tolist()
    rootish = _rootish(run, workers * threads).tolist()
    per_byte = 0.0 if math.isinf(bandwidth) else 1.0 / bandwidth
    slots = max(math.ceil(saturation * threads), 1) if math.isfinite(saturation) else n + 1

    occupancy = [0.0] * workers
    processing = [0] * workers
    free = [list(range(threads - 1, -1, -1)) for _ in range(workers)]
    ready_heap: list[list[int]] = [[] for _ in range(workers)]
    queue: list[int] = []  # root-ish tasks waiting for a slot, by priority
    held: dict[int, float] = {}  # task * workers + worker -> when its data is there
    holders: list[list[int]] = [[] for _ in range(n)]  # the workers each result is at
    home = [0] * n
    w_of = [0] * n
    th_of = [0] * n
    t_sent = [0.0] * n
    released_by = [-1] * n
    t_run = [0.0] * n
    t_start = [0.0] * n
    t_stop = [0.0] * n
    moved: list[tuple[int, int, int, float, float]] = []
    events: list[tuple[float, int, int, int]] = []  # (time, 0 done / 1 runnable, task, worker)
    push, pop = heapq.heappush, heapq.heappop

    def begin(t: float, w: int) -> None:
        task = pop(ready_heap[w])
        th_of[task] = free[w].pop()
        t_start[task] = t + gaps.dispatch
        push(events, (t_start[task] + dur[task], 0, task, w))

    def assign(task: int, w: int, t: float) -> None:
        """Send ``task`` to ``w`` at ``t`` (its inputs all computed by then)."""
        processing[w] += 1
        occupancy[w] += expected[task]
        w_of[task] = w
        t_sent[task] = t
        lo, hi = dep_ptr[task], dep_ptr[task + 1]
        if lo == hi:
            when = t + (gaps.slot if t > 0 else gaps.first)
        else:
            when = arrived = t + gaps.local
            for d in deps[lo:hi]:
                there = held.get(d * workers + w)
                if there is None:
                    began = arrived + gaps.fetch
                    there = began + latency + size[d] * per_byte
                    held[d * workers + w] = there
                    holders[d].append(w)
                    moved.append((d, home[d], w, began, there))
                if there > when:
                    when = there
        t_run[task] = when
        push(events, (when, 1, task, w))

    def place(task: int, t: float) -> None:
        if rootish[task]:
            w = min(range(workers), key=lambda w: (processing[w], occupancy[w], w))
            if processing[w] < slots:
                assign(task, w, t)
            else:
                push(queue, task)
            return
        lo, hi = dep_ptr[task], dep_ptr[task + 1]
        if lo == hi:
            w = min(range(workers), key=lambda w: (occupancy[w], processing[w], w))
        else:
            candidates = {w for d in deps[lo:hi] for w in holders[d]}
            w = min(candidates, key=lambda w: (
                occupancy[w] / threads + per_byte * sum(
                    size[d] for d in deps[lo:hi] if d * workers + w not in held),
                processing[w], w))
        assign(task, w, t)

    for task in range(n):
        if waiting[task] == 0:
            place(task, 0.0)
    while events:
        t, what, task, w = pop(events)
        if what:  # runnable on w
            push(ready_heap[w], task)
            if free[w]:
                begin(t, w)
            continue
        t_stop[task] = t
        home[task] = w
        held[task * workers + w] = t
        holders[task].append(w)
        free[w].append(th_of[task])
        processing[w] -= 1
        occupancy[w] -= expected[task]
        if ready_heap[w]:
            begin(t, w)
        for user in users[user_ptr[task]:user_ptr[task + 1]]:
            waiting[user] -= 1
            if waiting[user] == 0:
                place(user, t)
        while queue and processing[w] < slots:
            queued = pop(queue)
            released_by[queued] = task
            assign(queued, w, t)
    if queue or any(waiting):
        raise ValueError("the replay could not run every task: the recorded inputs form "
                         "a cycle")
    stop = np.asarray(t_stop)
    makespan = float(stop.max())
    if len(run.outputs):
        makespan = max(makespan, float(stop[run.outputs].max() + run.output_delay.max()))
    return Schedule(np.asarray(w_of), np.asarray(th_of),
                    np.asarray(t_sent), np.asarray(released_by), np.asarray(t_run),
                    np.asarray(t_start), stop, moved, workers, makespan)


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
