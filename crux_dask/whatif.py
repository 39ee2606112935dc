"""What-if replay: a recorded run played again by a model of Dask's scheduler.

The tasks of a recorded run (states computed on a worker thread), their
inputs, compute seconds and output sizes, are replayed by a discrete-event
model that behaves like ``distributed``'s scheduler and workers:

* **order**: task priorities are not recorded, so the order in which the
  tasks started in the recorded run stands in for Dask's priorities (the
  scheduler's queue and each worker's ready heap are ordered by it);
* **placement**: a task whose inputs are all in memory goes, like
  ``decide_worker``, to the worker holding some of its inputs where it could
  start soonest (occupancy per thread plus the bytes to fetch over the
  measured bandwidth), a task without inputs to the least occupied worker;
* **root-task queuing**: tasks of *root-ish* groups (a label with more tasks
  than twice the threads and fewer than five input tasks in all) wait in the
  scheduler's queue until a worker has fewer than
  ``max(ceil(threads * worker_saturation), 1)`` tasks processing;
* **threads**: each worker runs its tasks on ``threads`` threads, each task
  for its recorded compute seconds (divided by its label's speedup);
* **transfers**: an input held elsewhere is fetched, starting the measured
  fetch lag after the task reached its worker, and takes latency + bytes /
  bandwidth, both fitted to the recorded transfers between workers;
* **scheduling gaps**: the medians measured in the run: from a task's release
  (its inputs computed, a queue slot freed, the graph's arrival) to its
  arrival at its worker, and from its inputs there and a thread free to its
  start (see :class:`Gaps`);
* **spill**: the seconds a worker spent spilling after a task, or loading its
  input back from disk, are added to that task (dropped with ``spill=False``).

Not modelled: work stealing, contention for cores or the GIL between
threads (a task's seconds do not grow with more threads), limits on
concurrent transfers, memory limits and pauses, and the order of ties Dask
breaks by bytes held.

The makespan, recorded and predicted alike, is the time from the graph's
root (its arrival at the scheduler) to the run's end state (usually the
result reaching the client).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from crux_dask.model import CauseKind, MutationKind, location_class
from crux_dask.store import NO_CODE, NO_THREAD, PAGStore
from crux_dask.wcp import CriticalPath

__all__ = ["Gaps", "Run", "WhatIf", "extract", "simulate", "suggest", "what_if"]

#: Dask's default ``distributed.scheduler.worker-saturation``.
WORKER_SATURATION = 1.1
#: Dask's ``rootish-taskgroup`` and ``rootish-taskgroup-dependencies`` defaults.
ROOTISH_GROUPS = 5
ROOTISH_DEPENDENCIES = 5
#: Candidate labels of :func:`suggest`: the top labels of the observed path.
TOP_LABELS = 3

_TRANSFER = int(MutationKind.TRANSFER)
_DELETE = int(MutationKind.DELETE)


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
    """A recorded run reduced to what the replay needs; tasks in recorded start order.

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


def extract(store: PAGStore, end: int) -> Run:
    """The tasks, inputs, transfers and gaps of a recorded run.

    Parameters
    ----------
    store : PAGStore
    end : int
        The run's end state.

    Raises
    ------
    ValueError
        If the run has no tasks, or no timing.
    """
    thread = store.column("state_thread")
    worker_code = store.column("state_worker")
    is_task = (thread != NO_THREAD) & (worker_code != NO_CODE)
    time = store.column("state_time")
    start = store.column("state_start")
    if not is_task.any():
        raise ValueError("the run has no tasks computed on a worker thread to replay")
    task_ids = np.flatnonzero(is_task)
    if not (np.isfinite(time[task_ids]).all() and np.isfinite(start[task_ids]).all()):
        raise ValueError("the run's tasks have no timing (start or stop missing)")
    order = task_ids[np.lexsort((task_ids, start[task_ids]))]
    n_states = store.n_states
    task_of = np.full(n_states, -1, np.int64)
    task_of[order] = np.arange(len(order))

    src = store.column("mutation_src").astype(np.int64)
    dst = store.column("mutation_dst").astype(np.int64)
    kind = store.column("mutation_kind")
    busy = store.column("mutation_busy")
    location = store.column("state_location")
    classes = np.array([location_class(v) for v in store.locations.values] + [""], object)
    where = classes[location]  # the class of each state's location (NO_CODE -> "")

    # Each copy's computed state: TRANSFER steps followed back by pointer jumping.
    made_by = np.full(n_states, -1, np.int64)
    transfers = np.flatnonzero(kind == _TRANSFER)
    made_by[dst[transfers]] = transfers
    origin_state = np.arange(n_states)
    copies = dst[transfers]
    origin_state[copies] = src[transfers]
    while True:
        jumped = origin_state[origin_state]
        if np.array_equal(jumped, origin_state):
            break
        origin_state = jumped

    # Inputs: the mutations into each task, their sources traced to the tasks that made them.
    into = np.flatnonzero(is_task[dst] & (kind != _TRANSFER) & (kind != _DELETE))
    consumer = task_of[dst[into]]
    producer = task_of[origin_state[src[into]]]
    arrival = time[src[into]]
    readiness = time[origin_state[src[into]]]
    n = len(order)
    data_t = np.full(n, -np.inf)
    np.maximum.at(data_t, consumer, arrival)
    deps_t = np.full(n, -np.inf)
    np.maximum.at(deps_t, consumer, readiness)
    fetched = made_by[src[into]] >= 0
    edges = np.unique(np.stack([consumer, producer])[:, producer >= 0], axis=1)
    dep_ptr = np.searchsorted(edges[0], np.arange(n + 1)).astype(np.int64)

    roots = np.unique(src[into][where[src[into]] == "root"])
    origin = float(time[roots].min()) if len(roots) else float(time[order].min())

    # Workers and threads.
    workers_used = np.unique(worker_code[order])
    worker_index = np.searchsorted(workers_used, worker_code[order])
    workers = [store.workers.values[w] for w in workers_used]
    lanes = np.unique(np.stack([worker_index, thread[order]]), axis=1)
    threads = int(np.bincount(lanes[0]).max())

    # The task before each on its thread, and the slot that released each.
    lane_order = np.lexsort((start[order], thread[order], worker_index))
    prev_t = np.full(n, -np.inf)
    same_lane = ((worker_index[lane_order][1:] == worker_index[lane_order][:-1])
                 & (thread[order][lane_order][1:] == thread[order][lane_order][:-1]))
    prev_t[lane_order[1:][same_lane]] = time[order][lane_order[:-1][same_lane]]
    slot_t = np.full(n, -np.inf)
    cause_kind = store.column("cause_kind")
    slots = cause_kind == int(CauseKind.SLOT)
    slot_dst = task_of[store.column("cause_dst")[slots]]
    slot_t[slot_dst[slot_dst >= 0]] = time[store.column("cause_src")[slots][slot_dst >= 0]]

    duration = time[order] - start[order]
    has_deps = np.diff(dep_ptr) > 0
    received = store.column("state_received", order)
    received = np.where(np.isfinite(received), received, start[order])
    gaps = _gaps(start[order], received, data_t, deps_t, prev_t, slot_t, has_deps, origin)
    gaps.fetch = _fetch_lag(store, into, fetched, received, consumer, src)
    latency, bandwidth = _transfer_model(store, transfers, src, dst, busy, where)
    spill = _spill(store, transfers, src, dst, busy, where, order, task_of, worker_index,
                   workers_used, origin_state, into)

    to_client = transfers[where[dst[transfers]] == "client"]
    out_task = task_of[origin_state[dst[to_client]]]
    keep = out_task >= 0
    outputs = out_task[keep]
    # The client gathers its results once they are all computed.
    last = time[order][outputs].max() if len(outputs) else 0.0
    output_delay = np.maximum(time[dst[to_client]][keep] - last, 0.0)
    makespan = float(time[end] - origin) if end >= 0 else 0.0
    if not makespan > 0:
        raise ValueError("the run has no timing: its end is not after its root")
    key_label = store.column("key_label")
    return Run(store, order, np.maximum(duration, 0.0), spill,
               store.column("state_size", order), key_label[store.column("state_key", order)],
               worker_index, dep_ptr, edges[1].astype(np.int64), workers, threads, gaps,
               latency, bandwidth, outputs, output_delay, origin, makespan)


def _median(values: np.ndarray) -> float:
    values = values[np.isfinite(values)]
    return float(np.median(np.maximum(values, 0.0))) if len(values) else 0.0


def _gaps(start: np.ndarray, received: np.ndarray, data_t: np.ndarray, deps_t: np.ndarray,
          prev_t: np.ndarray, slot_t: np.ndarray, has_deps: np.ndarray, origin: float) -> Gaps:
    """Each class of release's median gap (see :class:`Gaps`)."""
    received = np.where(np.isfinite(received), received, start)
    by_slot = np.isfinite(slot_t)
    first = ~has_deps & ~by_slot
    ready = np.maximum(np.maximum(received, data_t), prev_t)
    return Gaps(first=_median(received[first] - origin),
                local=_median(received[has_deps] - deps_t[has_deps]),
                slot=_median(received[by_slot] - slot_t[by_slot]),
                dispatch=_median(start - ready))


def _fetch_lag(store: PAGStore, into: np.ndarray, fetched: np.ndarray, received: np.ndarray,
               consumer: np.ndarray, src: np.ndarray) -> float:
    """Median seconds from a task reaching its worker to the start of its fetches."""
    if not fetched.any():
        return 0.0
    begun = store.column("state_start", src[into][fetched])
    return _median(begun - received[consumer[fetched]])


def _transfer_model(store: PAGStore, transfers: np.ndarray, src: np.ndarray, dst: np.ndarray,
                    busy: np.ndarray, where: np.ndarray) -> tuple[float, float]:
    """Latency (s) and bandwidth (bytes/s) fitted to the transfers between workers."""
    between = transfers[(where[src[transfers]] == "memory") & (where[dst[transfers]] == "memory")]
    if not len(between):
        return 0.0, math.inf
    nbytes = store.column("state_size", dst[between]).astype(float)
    seconds = busy[between]
    if len(between) > 1 and np.ptp(nbytes) > 0:
        slope, intercept = np.polyfit(nbytes, seconds, 1)
        if slope > 0 and intercept >= 0:
            return float(intercept), float(1.0 / slope)
    if nbytes.sum() > 0 and seconds.sum() > 0:
        return 0.0, float(nbytes.sum() / seconds.sum())
    return _median(seconds), math.inf


def _spill(store: PAGStore, transfers: np.ndarray, src: np.ndarray, dst: np.ndarray,
           busy: np.ndarray, where: np.ndarray, order: np.ndarray, task_of: np.ndarray,
           worker_index: np.ndarray, workers_used: np.ndarray, origin_state: np.ndarray,
           into: np.ndarray) -> np.ndarray:
    """Seconds of spilling charged to each task.

    A spill to disk is charged to the task that finished last on its worker
    before it began (its result filled the memory); a load back from disk to
    the task that consumed the loaded copy.
    """
    spill = np.zeros(len(order))
    out = transfers[(where[src[transfers]] == "memory") & (where[dst[transfers]] == "disk")]
    if len(out):
        stops = store.column("state_time", order)
        by_worker = np.lexsort((stops, worker_index))
        spill_worker = np.searchsorted(workers_used, store.column("state_worker", dst[out]))
        began = store.column("state_start", dst[out])
        for w in np.unique(spill_worker):
            mine = by_worker[worker_index[by_worker] == w]
            which = np.searchsorted(stops[mine], began[spill_worker == w], "right") - 1
            np.add.at(spill, mine[np.maximum(which, 0)], busy[out][spill_worker == w])
    back = (where[src[transfers]] == "disk") & (where[dst[transfers]] == "memory")
    if back.any():
        loaded = np.zeros(store.n_states)
        loaded[dst[transfers[back]]] = busy[transfers[back]]
        np.add.at(spill, task_of[dst[into]], loaded[src[into]])
    return spill


@dataclass
class Schedule:
    """What the replay decided for every task, and the transfers it made."""

    worker: np.ndarray
    thread: np.ndarray
    ready: np.ndarray
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
    t_ready = [0.0] * n
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
        t_ready[task] = t
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
            assign(pop(queue), w, t)
    if queue or any(waiting):
        raise ValueError("the replay could not run every task: the recorded inputs form "
                         "a cycle")
    stop = np.asarray(t_stop)
    makespan = float(stop.max())
    if len(run.outputs):
        makespan = max(makespan, float(stop[run.outputs].max() + run.output_delay.max()))
    return Schedule(np.asarray(w_of), np.asarray(th_of), np.asarray(t_ready),
                    np.asarray(t_run), np.asarray(t_start), stop, moved, workers, makespan)


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


@dataclass
class WhatIf:
    """A predicted run.

    Attributes
    ----------
    makespan : float
        Predicted seconds from the graph's root to the run's end.
    recorded : float
        The recorded run's makespan, same definition.
    replay_error : float
        The unchanged replay's makespan against ``recorded``, as a fraction
        (``+0.05``: the model predicts the recorded run 5 % too long).
    baseline : float
        The unchanged replay's makespan: ``makespan - baseline`` is what the
        change does within the model.
    changes : dict
        The change replayed.
    """

    makespan: float
    recorded: float
    replay_error: float
    baseline: float
    changes: dict
    run: Run = field(repr=False)
    schedule: Schedule = field(repr=False)

    @property
    def saved(self) -> float:
        """Seconds the change saves, against the unchanged replay."""
        return self.baseline - self.makespan

    @cached_property
    def path(self) -> CriticalPath:
        """The observed critical path of the predicted run (a PAG built from its events)."""
        return predicted_pag(self.run, self.schedule).wcp()

    def summary(self) -> str:
        """One line: the change, predicted and recorded makespans, and the replay's error."""
        change = ", ".join(f"{k}={v}" for k, v in self.changes.items()) or "unchanged"
        return (f"{change}: predicted {self.makespan:.3f} s (saves {self.saved:+.3f} s), "
                f"recorded {self.recorded:.3f} s, unchanged replay error "
                f"{self.replay_error:+.1%}")


def predicted_pag(run: Run, schedule: Schedule):
    """A PAG of the predicted run, built by :class:`~crux_dask.PAGBuilder` from its events."""
    from crux_dask.build.builder import PAGBuilder

    store = run.store
    keys = np.asarray(store.keys.values, dtype=object)[store.column("state_key", run.state)]
    names = [run.workers[w] if w < len(run.workers) else f"tcp://what-if:{w}"
             for w in range(schedule.workers)]
    origin = run.origin
    events: list[tuple[float, int, tuple]] = [(0.0, 0, ("root", origin, "graph"))]
    for d, src, dst, began, there in schedule.transfers:
        events.append((there, 1, ("transfer", keys[d], f"memory@{names[src]}",
                                  f"memory@{names[dst]}", origin + began, origin + there,
                                  int(run.size[d]))))
    labels = run.label_names
    for task in range(run.n_tasks):
        inputs = tuple(keys[run.deps[run.dep_ptr[task]:run.dep_ptr[task + 1]]])
        events.append((schedule.stop[task], 2, (
            "compute", keys[task], names[schedule.worker[task]], int(schedule.thread[task]),
            origin + schedule.start[task], origin + schedule.stop[task], int(run.size[task]),
            inputs, 0, labels[task], None, None, None, None, None,
            origin + schedule.ready[task], origin + schedule.runnable[task],
            origin + schedule.runnable[task])))
    last = schedule.stop[run.outputs].max() if len(run.outputs) else 0.0
    for task, delay in zip(run.outputs.tolist(), run.output_delay.tolist()):
        there = last + delay
        events.append((there, 3, ("transfer", keys[task], f"memory@{names[schedule.worker[task]]}",
                                  "client", origin + min(last, there), origin + there,
                                  int(run.size[task]))))
    events.sort(key=lambda e: (e[0], e[1]))
    builder = PAGBuilder(run_id=f"{store.run_id}-what-if")
    builder.apply_many([e[2] for e in events])
    builder.resolve_parked()
    return builder.pag()


def what_if(store: PAGStore, end: int, workers: int | None = None, threads: int | None = None,
            speedup: dict[str, float] | None = None, transfer_speedup: float | None = None,
            spill: bool = True, run: Run | None = None) -> WhatIf:
    """Replay a recorded run with changes; see :meth:`crux_dask.PAG.what_if`.

    Raises
    ------
    ValueError
        For an unknown label, a number of workers or threads below one, a
        factor that is not positive, or a run without tasks or timing.
    """
    run = extract(store, end) if run is None else run
    changes: dict = {}
    if workers is not None:
        _positive_int("workers", workers)
        changes["workers"] = workers
    if threads is not None:
        _positive_int("threads", threads)
        changes["threads"] = threads
    factor = np.ones(run.n_tasks)
    if speedup:
        known = set(run.label_names.tolist())
        for prefix, k in speedup.items():
            if prefix not in known:
                raise ValueError(f"unknown task prefix {prefix!r}; the run's prefixes: "
                                 f"{', '.join(sorted(known))}")
            _positive("speedup of " + prefix, k)
            factor[run.label_names == prefix] = k
        changes["speedup"] = dict(speedup)
    if transfer_speedup is not None:
        _positive("transfer_speedup", transfer_speedup)
        changes["transfer_speedup"] = transfer_speedup
    if not spill:
        changes["spill"] = False
    base = run.replay
    if not changes:
        schedule = base
    else:
        k = transfer_speedup or 1.0
        latency = 0.0 if math.isinf(k) else run.latency / k
        bandwidth = math.inf if math.isinf(k) else run.bandwidth * k
        seconds = run.duration / factor + (run.spill if spill else 0.0)
        schedule = simulate(run, workers or len(run.workers), threads or run.threads, seconds,
                            run.gaps, latency, bandwidth)
    return WhatIf(schedule.makespan, run.makespan, base.makespan / run.makespan - 1,
                  base.makespan, changes, run, schedule)


def suggest(store: PAGStore, end: int, path: CriticalPath) -> pd.DataFrame:
    """Candidate changes ranked by predicted seconds saved; see :meth:`crux_dask.PAG.suggest`."""
    run = extract(store, end)
    steps = path.to_frame()
    on_path = steps[steps["category"] == "compute"].groupby("label")["busy"].sum()
    candidates: list[tuple[str, dict]] = [
        (f"{prefix} 2x faster", {"speedup": {prefix: 2.0}})
        for prefix in on_path.sort_values(ascending=False).index[:TOP_LABELS]]
    candidates += [
        (f"{len(run.workers) + 1} workers", {"workers": len(run.workers) + 1}),
        (f"{2 * run.threads} threads per worker", {"threads": 2 * run.threads}),
        ("free transfers", {"transfer_speedup": math.inf}),
        ("no spill", {"spill": False}),
    ]
    rows = []
    for name, change in candidates:
        result = what_if(store, end, run=run, **change)
        rows.append({"change": name, "predicted": result.makespan, "saved": result.saved,
                     "saved_share": result.saved / result.baseline,
                     "replay_error": result.replay_error,
                     "path_then": _top_labels(result.path)})
    frame = pd.DataFrame(rows)
    return frame.sort_values("saved", ascending=False, kind="stable").reset_index(drop=True)


def _top_labels(path: CriticalPath, top: int = TOP_LABELS) -> str:
    """The labels with the most busy seconds on a path, with their seconds."""
    steps = path.to_frame()
    busy = steps.groupby("label")["busy"].sum().sort_values(ascending=False).head(top)
    return ", ".join(f"{label} {seconds:.3f}s" for label, seconds in busy.items() if seconds > 0)


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float, np.number)) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
