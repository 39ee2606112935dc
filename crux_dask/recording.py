"""A recorded run reduced to what the what-if replay needs.

:func:`extract` finds a run's tasks (states computed on a worker thread) in
the order of the priorities Dask gave them (of their recorded starts in a
run recorded without priorities), with their inputs, compute and spill seconds and
output sizes, and measures what the model takes from the run: the scheduling
gaps from the tasks' moments, and latency and bandwidth from its transfers.
"""

from __future__ import annotations

import math

import numpy as np

from crux_dask.growable import NO_CODE
from crux_dask.model import CauseKind, MutationKind, location_class
from crux_dask.replay import Gaps, Run
from crux_dask.store import NO_THREAD, PAGStore

__all__ = ["extract"]

_TRANSFER = int(MutationKind.TRANSFER)
_DELETE = int(MutationKind.DELETE)


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
    priority = store.column("state_priority", task_ids)
    rank = priority if np.isfinite(priority).all() else start[task_ids]
    order = task_ids[np.lexsort((task_ids, start[task_ids], rank))]
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
