"""The scheduler model of the what-if replay: a recorded run's tasks played on a cluster.

The model (see :mod:`crux_dask.whatif` for what it stands for and what it
leaves out) is a discrete-event loop over the tasks of a :class:`~crux_dask.runs.Run`: a
queue ordered by Dask's priorities, ``decide_worker``-like placement,
root-task queuing, threads per worker, fetches that cost latency plus bytes
over bandwidth, and the scheduling gaps measured in the run.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from crux_dask.runs import Gaps, Run

if TYPE_CHECKING:
    from crux_dask.sharing import Sharing

__all__ = ["Schedule", "root_groups", "simulate"]

#: Dask's default ``distributed.scheduler.worker-saturation``.
WORKER_SATURATION = 1.1
#: Dask's ``rootish-taskgroup`` and ``rootish-taskgroup-dependencies`` defaults.
ROOTISH_GROUPS = 5
ROOTISH_DEPENDENCIES = 5


@dataclass
class Schedule:
    """What the replay decided for every task, and the transfers it made.

    ``sent``: when it was sent to its worker (later than its inputs were
    computed for a root task queued on the scheduler); ``released_by``: the
    task whose end freed the queue slot that sent it (``-1`` for none);
    ``runnable``: at its worker with its inputs there; ``moves``: the transfers,
    five numbers each in one list (see :attr:`transfers`).
    """

    worker: np.ndarray
    thread: np.ndarray
    sent: np.ndarray
    released_by: np.ndarray
    runnable: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    moves: list[float]
    workers: int
    makespan: float

    @property
    def transfers(self) -> Iterator[tuple[int, int, int, float, float]]:
        """Each transfer: ``(task, from worker, to worker, began, there)``."""
        moves = self.moves
        return zip(moves[0::5], moves[1::5], moves[2::5], moves[3::5], moves[4::5])


def simulate(run: Run, workers: int, threads: int, duration: np.ndarray, gaps: Gaps,
             latency: float, bandwidth: float, saturation: float = WORKER_SATURATION,
             sharing: Sharing | None = None) -> Schedule:
    """Replay ``run`` on ``workers`` × ``threads`` with these task seconds and transfer costs.

    With ``sharing`` (:class:`~crux_dask.machine.Sharing`), ``duration`` is
    each task's solo seconds and the tasks running at once share their hosts'
    cores and their workers' GIL; without it, each task runs for its
    ``duration`` whatever runs with it.

    Returns
    -------
    Schedule
        Times are seconds from the graph's root.

    Raises
    ------
    ValueError
        If the recorded inputs form a cycle.
    """
    # The replay makes millions of objects and no cycles: collecting them is waste.
    collecting = gc.isenabled()
    gc.disable()
    try:
        w_of, th_of, t_sent, released_by, t_run, t_start, t_stop, moved = _replay(
            run, workers, threads, duration, gaps, latency, bandwidth, saturation, sharing)
    finally:
        if collecting:
            gc.enable()
    stop = np.asarray(t_stop)
    makespan = float(stop.max())
    if len(run.outputs):
        makespan = max(makespan, float(stop[run.outputs].max() + run.output_delay.max()))
    return Schedule(np.asarray(w_of), np.asarray(th_of), np.asarray(t_sent),
                    np.asarray(released_by), np.asarray(t_run), np.asarray(t_start), stop,
                    moved, workers, makespan)


def _replay(run: Run, workers: int, threads: int, duration: np.ndarray, gaps: Gaps,
            latency: float, bandwidth: float, saturation: float, sharing: Sharing | None
            ) -> tuple[list, ...]:
    """The replay of :func:`simulate`: each task's worker, thread, sent, released-by,
    runnable, start and stop, and the transfers.

    Tasks are placed once their inputs are computed (``place``), sent to a
    worker (``assign``), started once they are runnable there and a thread is
    free, and free their thread, queue slot and dependents as they finish.

    One loop on local names runs the events in time order, as a replay runs
    millions: an event is ``(time, kind * n + task)`` for the run's ``n``
    tasks, of kind 0 done, 1 runnable or 2 started (with sharing), so events
    run by time, then kind, then task; its worker is the task's (``w_of``); with
    sharing, kinds 3 and 4 are a worker's loop and the scheduler done with the
    work after a task.
    A runnable task starts at once if its worker has a free thread (its
    ready heap is then empty), else it waits there; a task that finishes
    hands its thread to the first one waiting, after placing the dependents
    it freed and releasing queued tasks to its worker's free slots (which
    neither read threads nor start tasks).
    """
    n, n_workers = run.n_tasks, workers
    dep_ptr, deps, size, total_in, users, user_ptr, inputs = _lists(run)
    dur, waiting = duration.tolist(), list(inputs)
    # Expected seconds per label (what Dask's occupancy uses) and root-ish tasks.
    label = run.label
    per_label = np.bincount(label, duration) / np.maximum(np.bincount(label), 1)
    expected = per_label[label].tolist()
    rootish = _rootish(run, workers * threads).tolist()
    per_byte = 0.0 if math.isinf(bandwidth) else 1.0 / bandwidth
    slots = max(math.ceil(saturation * threads), 1) if math.isfinite(saturation) else n + 1
    w_of, th_of, released_by = [0] * n, [0] * n, [-1] * n
    t_sent, t_run, t_start, t_stop = ([0.0] * n for _ in range(4))
    # Five numbers a transfer, in one list: a tuple a transfer, a million of them in a
    # replay of a large run, took the collector a second in a scaling.
    moved: list[float] = []
    record = moved.extend
    occupancy, processing = [0.0] * n_workers, [0] * n_workers
    free = [list(range(threads - 1, -1, -1)) for _ in range(n_workers)]
    ready: list[list[int]] = [[] for _ in range(n_workers)]
    queue: list[int] = []  # root-ish tasks waiting for a slot, by priority
    held: list[dict[int, float]] = [{} for _ in range(n_workers)]  # task -> copy there
    holders: list[list[int] | None] = [None] * n  # the workers a result is at
    events: list[tuple[float, int]] = []
    heappush, heappop = heapq.heappush, heapq.heappop
    dispatch, fetch, started = gaps.dispatch, gaps.fetch, 2 * n

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
            copies = held[w]
            for d in deps[lo:hi]:
                there = t_stop[d] if w_of[d] == w else copies.get(d)
                if there is None:
                    began = arrived + fetch
                    there = began + latency + size[d] * per_byte
                    copies[d] = there
                    holders[d].append(w)
                    record((d, w_of[d], w, began, there))
                if there > when:
                    when = there
        t_run[task] = when
        heappush(events, (when, n + task))

    def place(task: int, t: float) -> None:
        """Choose the worker of ``task``, whose inputs are computed at ``t``, as Dask
        would: a root-ish task the least busy worker with a free slot (else it
        queues), another the worker where its inputs cost least to fetch.

        Of the workers holding some of its inputs, each costs its occupancy
        per thread plus the bytes it lacks over the bandwidth, ties broken
        by tasks processing, then index; sizes are whole bytes, so the bytes
        it lacks are exactly all the inputs' less those it holds.
        """
        if rootish[task]:
            w = min(zip(processing, occupancy, range(n_workers)))[2]
            if processing[w] < slots:
                assign(task, w, t)
            else:
                heappush(queue, task)
            return
        lo, hi = dep_ptr[task], dep_ptr[task + 1]
        if lo == hi:
            assign(task, min(zip(occupancy, processing, range(n_workers)))[2], t)
            return
        have: dict[int, int] = {}  # worker -> bytes of the inputs it holds
        get = have.get
        for d in deps[lo:hi]:
            nbytes = size[d]
            for w in holders[d]:
                have[w] = get(w, 0) + nbytes
        if len(have) == 1:
            w = next(iter(have))
        else:
            total, best, chosen = total_in[task], math.inf, -1
            for w, bytes_ in have.items():
                cost = occupancy[w] / threads + per_byte * (total - bytes_)
                if cost < best or (cost == best and (processing[w], w) < (
                        processing[chosen], chosen)):
                    best, chosen = cost, w
            w = chosen
        assign(task, w, t)

    def end(at: float, task: int, w: int) -> None:
        """Plan ``task``'s end at ``at`` (what sharing plans; an end planned before
        is stale); the end of the work after a task (``n`` and more,
        :meth:`~crux_dask.sharing.Sharing.after`) as event ``3 * n + task - n``."""
        heappush(events, (at, task if task < n else looped - n + task))

    looped = 3 * n  # events from here on: the work after a task done

    for task in range(n):
        if waiting[task] == 0:
            place(task, 0.0)
    while events:
        t, task = heappop(events)
        if task >= looped:  # a worker's loop or the scheduler done with a task's work
            sharing.done(t, task - looped + n, end)  # type: ignore[union-attr]
            continue
        if task < n:  # done
            w = w_of[task]
            if sharing is not None:
                if not sharing.due(task, t):
                    continue
                sharing.leave(t, task, w, end)
                if sharing.busy_after:
                    sharing.after(t, task, w, end)
            t_stop[task] = t
            holders[task] = [w]
            processing[w] -= 1
            occupancy[w] -= expected[task]
            for user in users[user_ptr[task]:user_ptr[task + 1]]:
                waiting[user] -= 1
                if waiting[user] == 0:
                    place(user, t)
            while queue and processing[w] < slots:
                queued = heappop(queue)
                released_by[queued] = task
                assign(queued, w, t)
            thread = th_of[task]
            if not ready[w]:
                free[w].append(thread)
                continue
            task = heappop(ready[w])
        elif task < started:  # runnable on its worker
            task -= n
            w = w_of[task]
            if not free[w]:
                heappush(ready[w], task)
                continue
            thread = free[w].pop()
        else:  # started: it shares the machine from now
            task -= started
            sharing.join(t, task, w_of[task], dur[task], end)
            continue
        th_of[task] = thread
        t_start[task] = at = t + dispatch
        heappush(events, (at + dur[task], task) if sharing is None else (at, started + task))
    if queue or any(waiting):
        raise ValueError("the replay could not run every task: the recorded inputs "
                         "form a cycle")
    return w_of, th_of, t_sent, released_by, t_run, t_start, t_stop, moved


def _lists(run: Run) -> tuple[list, ...]:
    """What every replay of ``run`` reads, as lists (made once per run): ``dep_ptr``,
    ``deps``, ``size``, the bytes of each task's inputs together, its users as
    compressed rows, and its number of inputs."""
    found = run.memo.get("lists")
    if found is None:
        summed = np.concatenate([[0], np.cumsum(run.size[run.deps], dtype=np.int64)])
        users, user_ptr = _users(run)
        found = run.memo["lists"] = (
            run.dep_ptr.tolist(), run.deps.tolist(), run.size.tolist(),
            (summed[run.dep_ptr[1:]] - summed[run.dep_ptr[:-1]]).tolist(), users.tolist(),
            user_ptr.tolist(), np.diff(run.dep_ptr).tolist())
    return found


def _users(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """The dependents of each task, as compressed rows (computed once per run)."""
    found = run.memo.get("users")
    if found is None:
        consumers = np.repeat(np.arange(run.n_tasks), np.diff(run.dep_ptr))
        by_dep = np.argsort(run.deps, kind="stable")
        found = run.memo["users"] = (consumers[by_dep], np.searchsorted(
            run.deps[by_dep], np.arange(run.n_tasks + 1)))
    return found


def _rootish(run: Run, total_threads: int) -> np.ndarray:
    """Tasks of root-ish groups, by Dask's rule, with labels standing for task groups."""
    group_size, few_inputs = root_groups(run)
    return ((group_size > 2 * total_threads) & few_inputs)[run.label]


def root_groups(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Per label: its tasks, and whether its input groups are few enough for Dask's rule
    of root-ish groups (what does not depend on the threads, computed once per run)."""
    found = run.memo.get("rootish")
    if found is None:
        n_labels = int(run.label.max()) + 1
        group_size = np.bincount(run.label, minlength=n_labels)
        consumers = np.repeat(np.arange(run.n_tasks), np.diff(run.dep_ptr))
        # Each (group, input group) pair once, in order, as one code per pair.
        pairs = np.unique(run.label[consumers].astype(np.int64) * n_labels
                          + run.label[run.deps])
        group, dep_group = np.divmod(pairs, n_labels)
        # Tasks of each group's input groups, and how many such groups.
        dep_groups = np.bincount(group, minlength=n_labels)
        dep_tasks = np.bincount(group, weights=group_size[dep_group], minlength=n_labels)
        found = run.memo["rootish"] = group_size, ((dep_groups < ROOTISH_GROUPS)
                                                   & (dep_tasks < ROOTISH_DEPENDENCIES))
    return found
