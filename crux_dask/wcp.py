"""Workflow critical paths over a program activity graph.

State times telescope: along any path from ``A`` to ``B`` the mutation costs add
up to ``B.time - A.time``, so the longest path *by cost* says nothing.  Two
well-defined answers instead:

``observed``
    Walk back from the end state, at each state taking the cause that released
    it last (Jaeger's "last-finishing child"): its last-arriving input, or the
    task that freed the thread or the queue slot it then ran in
    (:class:`~crux_dask.model.CauseKind`), whichever came later.  Inputs are
    ranked by their *ready* time: a copy moved from another worker counts as
    ready its transfer's duration after its source was, because Dask starts
    moving an input only once its consumer can run, and the wait before the
    move belongs to the input that made the consumer ready.  A freed resource
    counts from when the task that held it finished.  Each state keeps its
    last-arriving input and cause incrementally, so the walk is O(path length).
``longest``
    The chain of data mutations with the largest total ``busy`` time: the
    irreducible work, a lower bound on the makespan with unlimited workers and
    threads.  It ignores causes.  One pass over the mutations in topological
    order, O(V + E).
"""

from __future__ import annotations

import numpy as np

from crux_dask.graph import rules
from crux_dask.path import CATEGORIES, NO_STEPS, CriticalPath, Steps
from crux_dask.store import PAGStore

__all__ = ["CATEGORIES", "METHODS", "CriticalPath", "critical_path", "longest_path",
           "observed_path"]

METHODS = ("observed", "longest")


def observed_path(store: PAGStore, end: int, start: int | None = None) -> Steps:
    """The steps of the chain of last causes ending at ``end``, in path order.

    Parameters
    ----------
    store : PAGStore
    end : int
        The state the path ends at.
    start : int, optional
        The state the path must start at.  Without it the walk stops at a state
        with no inputs (a root).  With it, only inputs and causes that descend
        from ``start`` are followed, which costs one pass over the graph.

    Raises
    ------
    ValueError
        If ``end`` does not descend from ``start``.
    """
    if start is None:
        pred, cause = store.state_pred, store.state_cause
    else:
        pred, cause = _from(store, start, end)
    m_src, c_src = store.mutation_src, store.cause_src
    ready, time = store.state_ready, store.state_time
    through_cause: list[bool] = []
    ids: list[int] = []
    state = end
    while state != start:
        mid, cid = pred[state], cause[state]
        if cid >= 0 and (mid < 0 or time[c_src[cid]] > ready[m_src[mid]]):
            through_cause.append(True)
            ids.append(cid)
            state = c_src[cid]
        elif mid >= 0:
            through_cause.append(False)
            ids.append(mid)
            state = m_src[mid]
        else:
            break
    return (np.array(through_cause[::-1], bool), np.array(ids[::-1], np.int64))


def _from(store: PAGStore, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Each state's last-arriving input and last cause among those descending from ``start``.

    Raises
    ------
    ValueError
        If ``end`` does not descend from ``start``.
    """
    m_src, m_dst = store.column("mutation_src"), store.column("mutation_dst")
    c_src, c_dst = store.column("cause_src"), store.column("cause_dst")
    src, dst = np.concatenate([m_src, c_src]), np.concatenate([m_dst, c_dst])
    order = np.argsort(dst, kind="stable")
    reach = [False] * store.n_states
    reach[start] = True
    for s, d in zip(src[order].tolist(), dst[order].tolist()):
        if reach[s]:
            reach[d] = True
    reach = np.array(reach, dtype=bool)
    if not reach[end]:
        raise ValueError(f"state {end} does not descend from state {start}")
    n = store.n_states
    useful = np.flatnonzero(reach[m_src] & (m_dst <= end))
    pred = rules.last_arriving_per_target(
        store.column("state_ready")[m_src[useful]], useful, m_dst[useful], n)
    useful = np.flatnonzero(reach[c_src] & (c_dst <= end))
    cause = rules.last_arriving_per_target(
        store.column("state_time")[c_src[useful]], useful, c_dst[useful], n)
    return pred, cause


def longest_path(store: PAGStore, start: int | None = None, end: int | None = None
                 ) -> list[int]:
    """Mutation ids of the path with the largest total ``busy``, in path order.

    Without ``start`` the path may begin anywhere; without ``end`` it ends
    wherever the total is largest (the first such state on ties).

    Raises
    ------
    ValueError
        If ``end`` does not descend from ``start``.
    """
    n = store.n_states
    src = store.column("mutation_src")
    dst = store.column("mutation_dst")
    busy = store.column("mutation_busy")
    order = np.argsort(dst, kind="stable")  # topological: ids only grow along edges
    if start is None:
        best = [0.0] * n
    else:
        best = [-np.inf] * n
        best[start] = 0.0
    via = [-1] * n
    for mid, s, d, b in zip(order.tolist(), src[order].tolist(), dst[order].tolist(),
                            busy[order].tolist()):
        candidate = best[s] + b
        if candidate > best[d]:
            best[d] = candidate
            via[d] = mid
    if end is None:
        end = int(np.argmax(best)) if n else -1
    if end < 0:
        return []
    if best[end] == -np.inf:
        raise ValueError(f"state {end} does not descend from state {start}")
    path = []
    mid = via[end]
    while mid >= 0 and (start is None or dst[mid] != start):
        path.append(mid)
        mid = via[src[mid]]
    path.reverse()
    return path


def critical_path(store: PAGStore, start: int | None = None, end: int | None = None,
                  method: str = "observed", default_end: int = -1) -> CriticalPath:
    """The critical path of ``store`` between two states.

    Parameters
    ----------
    store : PAGStore
    start, end : int, optional
        State ids.  ``end`` defaults to ``default_end`` for ``observed`` (the
        run's latest state that is not a tombstone).
    method : {"observed", "longest"}
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    for name, value in (("start", start), ("end", end)):
        if value is not None and not 0 <= value < store.n_states:
            raise ValueError(f"{name} state {value} is not in the graph "
                             f"(0 to {store.n_states - 1})")
    if method == "observed":
        end = default_end if end is None else end
        steps = observed_path(store, end, start) if end >= 0 else NO_STEPS
    else:
        mids = np.array(longest_path(store, start, end), np.int64)
        steps = (np.zeros(len(mids), bool), mids)
    return CriticalPath.from_store(store, steps, method,
                                   single=end if not len(steps[1]) else None)
