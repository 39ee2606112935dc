"""Commit a planned window: append its rows to the store and bring the builder up to date.

:class:`~crux_dask.graph.window.Window` plans a window of routine events
without changing anything; :func:`commit` then adds what one by one would
have added, in the same order: the labels and keys new to the graph, one
state per event, the mutations into it (a computation's inputs or its graph's
root, a copy's source), the causes of the computations, and the builder's
view of what is held where and of the graph's end.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from crux_dask.columns import COMPUTE, DELETE
from crux_dask.encoding import NOT_RECORDED
from crux_dask.graph import arrays, rules
from crux_dask.growable import NO_CODE
from crux_dask.model import MOMENTS, CauseKind, MutationKind
from crux_dask.store import NO_THREAD

if TYPE_CHECKING:
    from crux_dask.graph.window import Window

__all__ = ["commit"]


def commit(window: Window) -> None:
    """Append the window's states, mutations and causes and update the builder."""
    builder = window.builder
    ids = window.base + np.arange(window.n)
    states = _states(window)
    states["pred"], mutations, inputs_ready = _mutations(window, ids, states["ready"])
    causes, states["cause"] = _causes(window, states["time"], inputs_ready)
    states.update(_moments(window))
    _append(window, states, causes, mutations)

    # The builder's view of what is held where, and of the graph's end.
    _update_held(window, ids)
    builder.fanout.forget_many(window.d["src"].tolist())
    created = np.flatnonzero(window.kinds != DELETE)
    builder.ends.add_many(ids[created], states["time"][created], mutations["src"],
                          mutations["dst"])
    builder.n_applied += window.n


def _states(window: Window) -> dict[str, np.ndarray]:
    """The columns of the window's states that follow from their events, by name.

    Times, ready times, sizes, key codes, locations, workers and threads; a
    copy takes what it does not say from its source (which may be in the
    window too).
    """
    builder, store = window.builder, window.builder.store
    f, base = window.n, window.base
    ci, ti, di, c, t, d = window.ci, window.ti, window.di, window.c, window.t, window.d
    time = np.empty(f)
    start = np.empty(f)
    time[ci], start[ci] = c["stop"], c["start"]
    time[ti], start[ti] = t["stop"], t["start"]
    time[di] = start[di] = d["time"]
    ready = time.copy()
    arrays.follow(ready, ti, t["src"], lambda src, at: rules.copies_ready(
        src, t["start"][at], t["stop"][at]), base, store, "state_ready")
    size = np.zeros(f, np.int64)
    size[ci], size[ti] = c["nbytes"], t["nbytes"]
    no_nbytes = t["no_nbytes"]
    arrays.follow(size, ti[no_nbytes], t["src"][no_nbytes], arrays.same, base, store,
                  "state_size")
    key_code = np.empty(f, np.int64)
    key_code[ci] = len(store.keys) + np.arange(len(ci))
    arrays.follow(key_code, np.concatenate([ti, di]), np.concatenate([t["src"], d["src"]]),
                  arrays.same, base, store, "state_key")
    location_workers = np.full(len(store.locations), NO_CODE, np.int64)
    location_workers[list(builder.places.worker)] = list(builder.places.worker.values())
    worker = np.empty(f, np.int64)
    worker[ci] = location_workers[c["memory"]]
    t_worker = location_workers[window.ev_location[ti]]
    worker[ti] = np.where(t_worker == NO_CODE, location_workers[t["source"]], t_worker)
    worker[di] = arrays.values_of(worker, d["src"], base, store, "state_worker")
    thread = np.full(f, NO_THREAD, np.int64)
    thread[ci] = c["thread"]
    return {"time": time, "start": start, "ready": ready, "size": size, "key": key_code,
            "location": window.ev_location, "worker": worker, "thread": thread}


def _mutations(window: Window, ids: np.ndarray, ready: np.ndarray
               ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """The mutations into the window's states: a computation's inputs (or its graph's
    root), a copy's source.

    Returns each state's last-arriving mutation (its ``pred``), the mutations'
    columns by name, and when each computation's last-arriving input was
    ready.  ``ids`` are the states' ids, ``ready`` their ready times.
    """
    builder, store = window.builder, window.builder.store
    base, ci, ti, di, c, t = window.base, window.ci, window.ti, window.di, window.c, window.t
    n_inputs = window.n_inputs
    n_mutations = np.ones(window.n, np.int64)
    n_mutations[ci] = np.maximum(n_inputs, 1)
    m0 = store.n_mutations
    first_mutation = m0 + np.cumsum(n_mutations) - n_mutations
    c_mutations = n_mutations[ci]
    c_first = np.cumsum(c_mutations) - c_mutations
    no_inputs = n_inputs == 0
    c_src = np.empty(int(c_mutations.sum()), np.int64)
    takes_input = np.ones(len(c_src), bool)
    takes_input[c_first[no_inputs]] = False
    c_src[takes_input] = window.input_src
    c_src[c_first[no_inputs]] = c["root"][no_inputs]
    pred = first_mutation.copy()
    src_ready = arrays.values_of(ready, c_src, base, store, "state_ready")
    last_input = rules.last_arriving_segments(src_ready, c_first, c_mutations)
    pred[ci] += last_input
    c_kind = rules.task_kinds(n_inputs)
    single = np.flatnonzero(n_inputs == 1)
    c_kind[single] = builder.fanout.kinds(
        c_src[c_first[single]], c["group"][single], first_mutation[ci[single]],
        store.mutation_kind)
    m_src = np.empty(int(n_mutations.sum()), np.int64)
    m_kind = np.empty(len(m_src), np.int8)
    m_busy = np.zeros(len(m_src))
    c_rows = np.repeat(first_mutation[ci] - m0 - c_first, c_mutations) + np.arange(len(c_src))
    m_src[c_rows] = c_src
    m_kind[c_rows] = np.repeat(c_kind, c_mutations)
    m_busy[c_rows] = np.repeat(c["stop"] - c["start"], c_mutations)
    copy_rows = first_mutation[np.concatenate([ti, di])] - m0
    m_src[copy_rows] = np.concatenate([t["src"], window.d["src"]])
    m_kind[copy_rows] = np.repeat([MutationKind.TRANSFER, MutationKind.DELETE],
                                  [len(ti), len(di)])
    m_busy[copy_rows[:len(ti)]] = t["stop"] - t["start"]
    mutations = {"src": m_src, "dst": np.repeat(ids, n_mutations), "kind": m_kind,
                 "busy": m_busy}
    return pred, mutations, src_ready[c_first + last_input]


def _causes(window: Window, time: np.ndarray, inputs_ready: np.ndarray
            ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The window's causes as the scalar path adds them, and each state's own cause.

    The tasks that waited for their thread (``time`` is when each state of
    the window was made, ``inputs_ready`` when each computation's inputs
    were) and for the task whose end freed their queue slot.  Per state, its
    thread cause, then its slot cause; the state's cause (the ``cause``
    column, ``-1`` for none) is the one whose source finished last, the
    first on ties.
    """
    builder, store = window.builder, window.builder.store
    f, base, ci, c = window.n, window.base, window.ci, window.c

    def time_of(states: np.ndarray) -> np.ndarray:
        return arrays.values_of(time, states, base, store, "state_time")

    thread_src, thread_dst = builder.threads.causes(
        c["memory"], c["thread"], base + ci,
        rules.runnables(c["requested"], c["runnable"], inputs_ready), c["start"], time_of)
    slot_src, slot_dst = window.releaser, base + ci[window.queued]
    src = np.concatenate([thread_src, slot_src])
    dst = np.concatenate([thread_dst, slot_dst])
    kind = np.repeat(np.array([CauseKind.THREAD, CauseKind.SLOT], np.int8),
                     [len(thread_src), len(slot_src)])
    cause = np.full(f, -1, np.int64)
    if len(slot_src):
        order = np.lexsort((kind, dst))
        src, dst, kind = src[order], dst[order], kind[order]
    if len(dst):
        starts = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]])
        lengths = np.diff(np.r_[starts, len(dst)])
        latest = rules.last_arriving_segments(time_of(src).astype(float), starts, lengths)
        cause[dst[starts] - base] = store.n_causes + starts + latest
    return {"src": src, "dst": dst, "kind": kind}, cause


def _moments(window: Window) -> dict[str, np.ndarray]:
    """The states' moments by name: those their events recorded, else NaN."""
    ci, c = window.ci, window.c
    moments = {name: np.full(window.n, np.nan) for name in MOMENTS}
    for name in (*NOT_RECORDED, "submitted"):
        moments[name][ci] = c[name]
    moments["requested"][window.ti] = window.t["requested"]
    return moments


def _append(window: Window, states: dict[str, np.ndarray], causes: dict[str, np.ndarray],
            mutations: dict[str, np.ndarray]) -> None:
    """Append to the store, in order: labels, keys, states, causes, mutations."""
    store = window.builder.store
    c = window.c
    n_labels = len(store.labels)
    for label in window.new_labels[:len(np.unique(c["label"][c["label"] >= n_labels]))]:
        store.labels.code(label)
    store.keys.values.extend(window.c_key)
    arrays.extend(store.key_label, c["label"])
    arrays.extend(store.key_origin, c["origin"])
    for name, values in states.items():
        arrays.extend(getattr(store, f"state_{name}"), values)
    for name, values in causes.items():
        arrays.extend(getattr(store, f"cause_{name}"), values)
    for name, values in mutations.items():
        arrays.extend(getattr(store, f"mutation_{name}"), values)


def _update_held(window: Window, ids: np.ndarray) -> None:
    """Bring the builder's holdings to what is held after the window.

    Keys the window created end up with one copy or none, which arrays
    settle; a key with several copies, or held before the window, gets
    its writes replayed through the builder's own bookkeeping.
    """
    holdings = window.builder.holdings
    live, copies = holdings.newest, holdings.others
    names, kinds = window.names, window.kinds
    # The last write of each slot: the slot order of the as-of join, cut to the prefix.
    writes = window.slot_order[window.slot_order < window.n]
    slot = window.ev_slot[writes]
    ends = np.ones(len(writes), bool)
    ends[:-1] = slot[1:] != slot[:-1]
    last = writes[ends]
    final = np.where(kinds[last] == DELETE, arrays.DEAD, ids[last])
    final_key = window.ev_key[last]
    # Slots sort by key first.
    keys = final_key[np.r_[True, final_key[1:] != final_key[:-1]]]
    created = kinds[window.first_event[keys]] == COMPUTE
    held_before = np.zeros(len(keys), bool)
    earlier = np.flatnonzero(~created)
    earlier_names = list(map(names.__getitem__, keys[earlier].tolist()))
    held_before[earlier] = np.fromiter(map(live.__contains__, earlier_names), bool,
                                       len(earlier))
    regular = np.ones(len(keys), bool)  # one copy before, or none: counts tell the rest
    if copies:
        regular[earlier] = ~np.fromiter(map(copies.__contains__, earlier_names), bool,
                                        len(earlier))
    delta = np.ones(window.n, np.int64)
    delta[window.ti] = window.t["before"] < 0
    delta[window.di] = -1
    held_after = held_before + np.bincount(
        window.ev_key, delta, len(names)).astype(np.int64)[keys]

    gone = list(map(names.__getitem__, keys[regular & held_before & (held_after == 0)]
                    .tolist()))
    deque(map(live.pop, gone, repeat(None)), maxlen=0)
    sole = (created & (held_after == 1))[np.searchsorted(keys, final_key)] & (final >= 0)
    live.update(zip(map(names.__getitem__, final_key[sole].tolist()), final[sole].tolist()))
    replay = keys[(held_after > 0) & ~(created & (held_after == 1))
                  | held_before & ~regular]
    if not len(replay):
        return
    marked = np.zeros(len(names), bool)
    marked[replay] = True
    events = np.flatnonzero(marked[window.ev_key])
    for name, location, sid, kind in zip(
            map(names.__getitem__, window.ev_key[events].tolist()),
            window.ev_location[events].tolist(), ids[events].tolist(),
            kinds[events].tolist()):
        if kind == DELETE:
            holdings.drop(name, location)
        else:
            holdings.add(name, location, sid)  # no event waits for it: see Window.__init__
