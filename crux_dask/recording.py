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
from crux_dask.model import SHARDS_LABEL, CauseKind, MutationKind, location_class
from crux_dask.runs import Gaps, Run
from crux_dask.store import NO_THREAD, PAGStore

__all__ = ["extract"]

#: Bytes a second between workers that distributed's scheduler assumes until it has
#: measured its own (its ``distributed.scheduler.bandwidth`` default, 100 MB/s).
DASK_BANDWIDTH = 100e6
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
    time = store.column("state_time")
    start = store.column("state_start")
    order, task_of = _tasks(store, time, start)
    n = len(order)
    src = store.column("mutation_src").astype(np.int64)
    dst = store.column("mutation_dst").astype(np.int64)
    kind = store.column("mutation_kind")
    busy = store.column("mutation_busy")
    where = _location_classes(store)
    transfers = np.flatnonzero(kind == _TRANSFER)
    origin_state, copied = _computed_states(store.n_states, src[transfers], dst[transfers])

    # Inputs: the mutations into each task, their sources traced to the tasks that made them.
    into = np.flatnonzero((task_of[dst] >= 0) & (kind != _TRANSFER) & (kind != _DELETE))
    consumer, sources = task_of[dst[into]], src[into]
    edges, dep_ptr = _dependencies(consumer, task_of[origin_state[sources]], n)
    roots = np.unique(sources[where[sources] == "root"])
    origin = float(time[roots].min()) if len(roots) else float(time[order].min())
    worker_index, workers_used, workers, threads = _workers(store, order)

    received = store.column("state_received", order)
    received = np.where(np.isfinite(received), received, start[order])
    gaps = _gaps(start[order], received,
                 data_t=_latest(n, consumer, time[sources]),
                 deps_t=_latest(n, consumer, time[origin_state[sources]]),
                 prev_t=_previous_stop(worker_index, store.column("state_thread", order),
                                       start[order], time[order]),
                 slot_t=_slot_release(store, task_of, time, n),
                 has_deps=np.diff(dep_ptr) > 0, origin=origin)
    gaps.fetch = _fetch_lag(store, into, copied[sources], received, consumer, src)
    latency, bandwidth = _transfer_model(store, transfers, src, dst, busy, where)
    spill = _spill(store, transfers, src, dst, busy, where, order, task_of, worker_index,
                   workers_used, origin_state, into)
    outputs, output_delay = _outputs(time, order, task_of, origin_state,
                                     dst[transfers[where[dst[transfers]] == "client"]])
    makespan = float(time[end] - origin) if end >= 0 else 0.0
    if not makespan > 0:
        raise ValueError("the run has no timing: its end is not after its root")
    key_label = store.column("key_label")
    return Run(store, order, np.maximum(time[order] - start[order], 0.0), spill,
               store.column("state_size", order), key_label[store.column("state_key", order)],
               worker_index, dep_ptr, edges[1].astype(np.int64), workers, threads, gaps,
               latency, bandwidth, outputs, output_delay, origin, makespan)


def _location_classes(store: PAGStore) -> np.ndarray:
    """The class of each state's location (:func:`~crux_dask.model.location_class`; NO_CODE: "")."""
    classes = np.array([location_class(v) for v in store.locations.values] + [""], object)
    return classes[store.column("state_location")]


def _tasks(store: PAGStore, time: np.ndarray, start: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """The run's tasks (states computed on a worker thread), in the order of the replay.

    Tasks are ranked by the priorities Dask gave them (by their recorded
    starts if a task has none), ties by their start, then their state id.

    Parameters
    ----------
    store : PAGStore
    time, start : numpy.ndarray
        Each state's time and start.

    Returns
    -------
    order : numpy.ndarray
        The state of each task, in order.
    task_of : numpy.ndarray
        Each state's task (its index in ``order``); -1 for a state that is no task.

    Raises
    ------
    ValueError
        If the run has no tasks, or they have no timing.
    """
    is_task = ((store.column("state_thread") != NO_THREAD)
               & (store.column("state_worker") != NO_CODE))
    if not is_task.any():
        raise ValueError("the run has no tasks computed on a worker thread to replay")
    task_ids = np.flatnonzero(is_task)
    if not (np.isfinite(time[task_ids]).all() and np.isfinite(start[task_ids]).all()):
        raise ValueError("the run's tasks have no timing (start or stop missing)")
    priority = store.column("state_priority", task_ids)
    rank = priority if np.isfinite(priority).all() else start[task_ids]
    order = task_ids[np.lexsort((task_ids, start[task_ids], rank))]
    task_of = np.full(store.n_states, -1, np.int64)
    task_of[order] = np.arange(len(order))
    return order, task_of


def _computed_states(n_states: int, copy_src: np.ndarray, copy_dst: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Each state's computed state, followed back through the transfers that copied it.

    Parameters
    ----------
    n_states : int
    copy_src, copy_dst : numpy.ndarray
        The source and the copy of each transfer.

    Returns
    -------
    origin_state : numpy.ndarray
        Of each state, the computed state it is a copy of (itself if it is no copy).
    copied : numpy.ndarray
        Whether each state is a copy.
    """
    copied = np.zeros(n_states, bool)
    copied[copy_dst] = True
    origin_state = np.arange(n_states)
    origin_state[copy_dst] = copy_src
    while True:  # pointer jumping
        jumped = origin_state[origin_state]
        if np.array_equal(jumped, origin_state):
            return origin_state, copied
        origin_state = jumped


def _latest(n: int, consumer: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Of each of ``n`` tasks, the latest ``times`` of its inputs (-inf if it has none)."""
    latest = np.full(n, -np.inf)
    np.maximum.at(latest, consumer, times)
    return latest


def _dependencies(consumer: np.ndarray, producer: np.ndarray, n: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The input tasks of each of ``n`` tasks, as compressed rows.

    Parameters
    ----------
    consumer, producer : numpy.ndarray
        Of each input, the task it goes into and the task that made it (-1 for
        data no task made, left out).
    n : int

    Returns
    -------
    edges : numpy.ndarray
        The distinct ``(consumer, producer)`` pairs, as two sorted rows.
    dep_ptr : numpy.ndarray
        Task ``i``'s pairs are the columns ``dep_ptr[i]:dep_ptr[i + 1]``.
    """
    edges = np.unique(np.stack([consumer, producer])[:, producer >= 0], axis=1)
    return edges, np.searchsorted(edges[0], np.arange(n + 1)).astype(np.int64)


def _workers(store: PAGStore, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, list, int]:
    """The workers that ran the tasks, and their threads.

    Returns
    -------
    worker_index : numpy.ndarray
        Of each task, its worker's index in ``workers``.
    workers_used : numpy.ndarray
        The workers' codes (``store.workers``).
    workers : list of str
        The workers' addresses.
    threads : int
        The most distinct threads any worker ran tasks on.
    """
    worker_code = store.column("state_worker", order)
    workers_used = np.unique(worker_code)
    worker_index = np.searchsorted(workers_used, worker_code)
    workers = [store.workers.values[w] for w in workers_used]
    lanes = np.unique(np.stack([worker_index, store.column("state_thread", order)]), axis=1)
    return worker_index, workers_used, workers, int(np.bincount(lanes[0]).max())


def _previous_stop(worker: np.ndarray, thread: np.ndarray, start: np.ndarray,
                   stop: np.ndarray) -> np.ndarray:
    """Of each task, when the task before it on its thread stopped (-inf for the first).

    All four are of the tasks: their worker's index, thread, start and stop.
    """
    lane_order = np.lexsort((start, thread, worker))
    previous = np.full(len(worker), -np.inf)
    same_lane = ((worker[lane_order][1:] == worker[lane_order][:-1])
                 & (thread[lane_order][1:] == thread[lane_order][:-1]))
    previous[lane_order[1:][same_lane]] = stop[lane_order[:-1][same_lane]]
    return previous


def _slot_release(store: PAGStore, task_of: np.ndarray, time: np.ndarray, n: int
                  ) -> np.ndarray:
    """Of each of ``n`` tasks, when the task that freed its queue slot stopped (-inf if none)."""
    released = np.full(n, -np.inf)
    slots = store.column("cause_kind") == int(CauseKind.SLOT)
    slot_dst = task_of[store.column("cause_dst")[slots]]
    released[slot_dst[slot_dst >= 0]] = time[store.column("cause_src")[slots][slot_dst >= 0]]
    return released


def _outputs(time: np.ndarray, order: np.ndarray, task_of: np.ndarray,
             origin_state: np.ndarray, gathered: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tasks whose results the client gathered, and each one's delay.

    The client gathers its results once they are all computed: a result's
    delay is the seconds from the last of them computed to its arrival.

    Parameters
    ----------
    time, order, task_of, origin_state : numpy.ndarray
        Each state's time, the tasks' states, each state's task and the state
        each state is a copy of.
    gathered : numpy.ndarray
        The copies made on the client.
    """
    out_task = task_of[origin_state[gathered]]
    keep = out_task >= 0
    outputs = out_task[keep]
    last = time[order][outputs].max() if len(outputs) else 0.0
    return outputs, np.maximum(time[gathered][keep] - last, 0.0)


def _median(values: np.ndarray) -> float:
    values = values[np.isfinite(values)]
    return float(np.median(np.maximum(values, 0.0))) if len(values) else 0.0


def _gaps(start: np.ndarray, received: np.ndarray, data_t: np.ndarray, deps_t: np.ndarray,
          prev_t: np.ndarray, slot_t: np.ndarray, has_deps: np.ndarray, origin: float) -> Gaps:
    """Each class of release's median gap (see :class:`~crux_dask.runs.Gaps`)."""
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
    """Latency (s) and bandwidth (bytes/s) fitted to the transfers between workers; in a
    run without any, what Dask's scheduler assumes before it measures."""
    between = transfers[(where[src[transfers]] == "memory") & (where[dst[transfers]] == "memory")]
    if not len(between):
        return 0.0, DASK_BANDWIDTH
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
    the task that consumed the loaded copy.  A P2P shuffle's shards, which it
    writes to disk in threads of its own while tasks run, are no spill.
    """
    spill = np.zeros(len(order))
    labels = np.asarray(store.labels.values, dtype=object)[
        store.column("key_label", store.column("state_key", dst[transfers]))]
    transfers = transfers[labels != SHARDS_LABEL]
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
