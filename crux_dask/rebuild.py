"""A graph rebuilt from its tables: what the live builder keeps, derived offline.

An exported run holds its states and mutations; the columns the builder kept
as it went (each state's start, ready time and last-arriving input, and the
graph's end) are derived here with the same rules
(:mod:`crux_dask.graph.rules`), so that a run read back from Parquet gives the
critical path the live dashboard showed.
"""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from crux_dask.graph import rules
from crux_dask.growable import Strings, StringTable
from crux_dask.model import MOMENTS, ROOT, CauseKind, MutationKind
from crux_dask.store import NO_THREAD, PAGStore

__all__ = ["end_state", "store_from_columns", "store_from_frames"]



def store_from_frames(run_id: str, states: pd.DataFrame, mutations: pd.DataFrame,
                      causes: pd.DataFrame | None = None, moments: pd.DataFrame | None = None
                      ) -> PAGStore:
    """A store from one run's tables (states, mutations, and causes and moments if any)."""
    strings = {name: _encoded(states[name])
               for name in ("key", "label", "origin", "location", "worker")}
    return store_from_columns(
        run_id,
        state_id=states["state_id"].to_numpy(),
        time=states["time"].to_numpy(dtype="float64"),
        size=states["size"].to_numpy(dtype="int64"),
        thread=states["thread"].astype("Int64").fillna(NO_THREAD).to_numpy(dtype="int64"),
        src=mutations["src"].to_numpy().astype("int64"),
        dst=mutations["dst"].to_numpy().astype("int64"),
        kind=_encoded(mutations["kind"]),
        busy=mutations["busy"].to_numpy(dtype="float64"),
        start=mutations["start"].to_numpy(dtype="float64"),
        causes=None if causes is None else (
            causes["src"].to_numpy().astype("int64"), causes["dst"].to_numpy().astype("int64"),
            _encoded(causes["kind"])),
        moments=None if moments is None else (
            moments["state_id"].to_numpy().astype("int64"),
            {name: moments[name].to_numpy(dtype="float64") for name in MOMENTS
             if name in moments}),
        **strings,
    )


def store_from_columns(run_id: str, *, state_id: np.ndarray, time: np.ndarray,
                       size: np.ndarray, thread: np.ndarray, key: tuple, label: tuple,
                       origin: tuple, location: tuple, worker: tuple, src: np.ndarray,
                       dst: np.ndarray, kind: tuple, busy: np.ndarray, start: np.ndarray,
                       causes: tuple | None = None, moments: tuple | None = None
                       ) -> PAGStore:
    """A store from whole columns; string columns come as ``(codes, values)`` pairs.

    ``causes`` are ``(src, dst, kind)`` (``kind`` as a string column),
    ``moments`` ``(state ids, {"requested": ..., "received": ..., "runnable":
    ..., "priority": ...})`` (a column left out is not recorded).  Checks the
    ids (states ``0..n-1``, mutations and causes from lower to higher ids)
    and derives what the builder keeps incrementally: each state's start,
    ready time, last-arriving input and last cause.

    Raises
    ------
    ValueError
        If the ids or the mutation kinds are not valid.
    """
    n = len(state_id)
    _check_ids(run_id, state_id, src, dst)
    kinds = _mutation_kinds(run_id, kind)
    c_src, c_dst, c_kind = _causes(run_id, causes, n)
    store = PAGStore(run_id)
    _fill_names(store, key, label, origin, location, worker)
    _fill_times(store, n, time, start, src, dst, kinds)
    _fill(store.state_size, size)
    _fill(store.state_thread, thread)
    _fill(store.mutation_src, src)
    _fill(store.mutation_dst, dst)
    _fill(store.mutation_kind, kinds)
    _fill(store.mutation_busy, busy)
    for name, values in _moments(run_id, moments, n).items():
        _fill(getattr(store, f"state_{name}"), values)
    _fill(store.state_cause, rules.last_arriving_per_target(
        time[c_src], np.arange(len(c_src)), c_dst, n))
    _fill(store.cause_src, c_src)
    _fill(store.cause_dst, c_dst)
    _fill(store.cause_kind, c_kind)
    return store


def _check_ids(run_id: str, state_id: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
    """Check that the states are ``0..n-1`` and each mutation goes to a later state.

    Raises
    ------
    ValueError
        If they are not.
    """
    n = len(state_id)
    if not np.array_equal(state_id, np.arange(n)):
        raise ValueError(f"run {run_id}: state ids must be 0..{n - 1}")
    if len(src) and (src.min() < 0 or dst.max() >= n):
        raise ValueError(f"run {run_id}: a mutation refers to a state that does not exist")
    if np.any(src >= dst):
        raise ValueError(f"run {run_id}: every mutation must go from a lower to a higher "
                         "state id")


def _mutation_kinds(run_id: str, kind: tuple) -> np.ndarray:
    """The :class:`~crux_dask.model.MutationKind` of each mutation, from a string column.

    Raises
    ------
    ValueError
        If a kind is unknown or missing.
    """
    try:
        kind_of_value = np.array([int(MutationKind.parse(k)) for k in kind[1]] + [-1],
                                 dtype="int8")
    except ValueError as error:
        raise ValueError(f"run {run_id}: {error}") from None
    kinds = kind_of_value[kind[0]]
    if np.any(kinds < 0):
        raise ValueError(f"run {run_id}: a mutation has no kind")
    return kinds


def _fill_names(store: PAGStore, key: tuple, label: tuple, origin: tuple, location: tuple,
                worker: tuple) -> None:
    """Fill the string columns: each state's key, location and worker, each key's label and origin.

    Each comes as a ``(codes, values)`` pair, one code per state.
    """
    key_codes = _into(store.keys, key)
    # Label and origin belong to the key: take them from each key's first state.
    first_of_key = np.unique(key_codes, return_index=True)[1]
    _fill(store.key_label, _into(store.labels, label)[first_of_key])
    _fill(store.key_origin, _into(store.labels, origin)[first_of_key])
    _fill(store.state_key, key_codes)
    _fill(store.state_location, _into(store.locations, location))
    _fill(store.state_worker, _into(store.workers, worker))


def _fill_times(store: PAGStore, n: int, time: np.ndarray, start: np.ndarray,
                src: np.ndarray, dst: np.ndarray, kinds: np.ndarray) -> None:
    """Fill each state's time, and what the builder derives from the times.

    That is each state's start (of the mutation that made it), ready time and
    last-arriving input (of ``n`` states); ``time`` is of the states, ``start``
    of the mutations.
    """
    # A state starts when the operation that created it started.
    state_start = time.copy()
    state_start[dst[::-1]] = start[::-1]
    ready = _ready_times(time, state_start, src, dst, kinds)
    _fill(store.state_time, time)
    _fill(store.state_start, state_start)
    _fill(store.state_ready, ready)
    _fill(store.state_pred, rules.last_arriving_per_target(ready[src], np.arange(len(src)),
                                                           dst, n))


def _causes(run_id: str, causes: tuple | None, n: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked cause columns, in the order of their targets."""
    if causes is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int8)
    src, dst, (codes, names) = causes
    if len(src) and (src.min() < 0 or dst.max() >= n or np.any(src >= dst)):
        raise ValueError(f"run {run_id}: a cause must go from a state to a later one")
    try:
        value = np.array([int(CauseKind[str(k).upper()]) for k in names] + [-1], "int8")
    except KeyError as error:
        raise ValueError(f"run {run_id}: unknown cause kind {error}") from None
    kinds = value[codes]
    if np.any(kinds < 0):
        raise ValueError(f"run {run_id}: a cause has no kind")
    return src, dst, kinds


def _moments(run_id: str, moments: tuple | None, n: int) -> dict[str, np.ndarray]:
    """Full moment columns (NaN where a state has none, or a run recorded none of a kind)."""
    full = {name: np.full(n, np.nan) for name in MOMENTS}
    if moments is not None:
        ids, values = moments
        if len(ids) and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"run {run_id}: moments of a state that does not exist")
        for name, given in values.items():
            full[name][ids] = given
    return full


def end_state(store: PAGStore) -> int:
    """The graph's end, as the live builder found it (:class:`rules.EndTracker`)."""
    if not store.n_states:
        return -1
    candidate = np.ones(store.n_states, dtype=bool)
    src, dst = store.column("mutation_src"), store.column("mutation_dst")
    candidate[dst[store.column("mutation_kind") == MutationKind.DELETE]] = False
    root = store.locations.codes.get(ROOT)
    if root is not None:
        candidate[store.column("state_location") == root] = False
    states = np.flatnonzero(candidate)
    tracker = rules.EndTracker()
    tracker.add_many(states, store.column("state_time")[states], src, dst)
    return tracker.end


def _ready_times(time: np.ndarray, start: np.ndarray, src: np.ndarray, dst: np.ndarray,
                 kinds: np.ndarray) -> np.ndarray:
    """Per state, when it counts as ready: a copy by :func:`rules.copy_ready`, others at once."""
    ready = time.copy()
    transfers = np.flatnonzero(kinds == MutationKind.TRANSFER)
    transfers = transfers[np.argsort(dst[transfers], kind="stable")]
    copy_ready = rules.copy_ready
    for s, d in zip(src[transfers].tolist(), dst[transfers].tolist()):
        ready[d] = copy_ready(ready[s], start[d], time[d])
    return ready


def _fill(column: array, values: np.ndarray) -> None:
    column.frombytes(memoryview(np.ascontiguousarray(values, dtype=column.typecode)).cast("B"))


def _encoded(values: pd.Series) -> tuple[np.ndarray, list]:
    """Codes and distinct values of a string column (missing values get code -1)."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return codes, [str(u) for u in uniques]


def _into(table: StringTable, encoded: tuple[np.ndarray, list]) -> np.ndarray:
    """Codes of ``table`` for a ``(codes, values)`` column (-1 stays -1)."""
    codes, values = encoded
    if not table.values:  # into an empty table: in one go, if the values are distinct
        table.codes = dict(zip(values, range(len(values))))
        if len(table.codes) == len(values):
            table.values = Strings(values)
            return codes
        table.codes = {}
    mapping = np.array([table.code(v) for v in values] + [-1], dtype="int64")
    return mapping[codes]
