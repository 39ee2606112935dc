"""The program activity graph as users see it: tables plus critical paths."""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from crux_dask.model import MUTATION_COLUMNS, ROOT, STATE_COLUMNS, MutationKind
from crux_dask.store import NO_THREAD, PAGStore, StringTable
from crux_dask.wcp import CriticalPath, critical_path

__all__ = ["PAG"]


class PAG:
    """A program activity graph of one or more runs.

    Parameters
    ----------
    stores : list of PAGStore
        One store per run, oldest first.
    ends : list of int, optional
        The end state of each run (its latest state that is not a tombstone);
        found from the data when not given, or where an entry is ``None``.
    """

    def __init__(self, stores: list[PAGStore], ends: list[int | None] | None = None) -> None:
        self.stores = list(stores)
        ends = list(ends) if ends is not None else [None] * len(self.stores)
        self.ends = [_end_state(s) if e is None else e for s, e in zip(self.stores, ends)]

    # -- construction -------------------------------------------------------
    @classmethod
    def from_frames(cls, states: pd.DataFrame, mutations: pd.DataFrame) -> PAG:
        """A PAG from data-state and data-mutation tables (DESIGN §2 columns).

        Within a run, ``state_id`` must number the states ``0..n-1`` and every
        mutation must go from a lower to a higher state id (the order in which
        states are created), which is how the live graph and its exports are
        numbered.

        Raises
        ------
        ValueError
            If a column is missing or the ids break those rules.
        """
        _require_columns("states", states, STATE_COLUMNS)
        _require_columns("mutations", mutations, MUTATION_COLUMNS)
        run_ids = list(dict.fromkeys(states["run_id"].tolist()))
        unknown = set(mutations["run_id"].tolist()) - set(run_ids)
        if unknown:
            raise ValueError(f"mutations of runs with no states: {sorted(unknown)}")
        stores = []
        for run_id in run_ids:
            run_states = states[states["run_id"] == run_id].sort_values("state_id")
            run_mutations = mutations[mutations["run_id"] == run_id].sort_values(
                "mutation_id")
            stores.append(_store_from_frames(run_id, run_states, run_mutations))
        return cls(stores)

    # -- tables -------------------------------------------------------------
    @property
    def run_ids(self) -> list[str]:
        return [s.run_id for s in self.stores]

    @property
    def states(self) -> pd.DataFrame:
        """All data states (DESIGN §2 columns)."""
        return _concat([s.states_frame() for s in self.stores], STATE_COLUMNS)

    @property
    def mutations(self) -> pd.DataFrame:
        """All data mutations (DESIGN §2 columns)."""
        return _concat([s.mutations_frame() for s in self.stores], MUTATION_COLUMNS)

    def __len__(self) -> int:
        return sum(s.n_states for s in self.stores)

    def __repr__(self) -> str:
        n_mutations = sum(s.n_mutations for s in self.stores)
        return (f"<PAG: {len(self.stores)} run(s), {len(self)} states, "
                f"{n_mutations} mutations>")

    # -- analysis -----------------------------------------------------------
    def store(self, run_id: str | None = None) -> PAGStore:
        """The store of ``run_id`` (the latest run by default)."""
        return self.stores[self._run_index(run_id)]

    def wcp(self, start: int | None = None, end: int | None = None,
            method: str = "observed", run_id: str | None = None) -> CriticalPath:
        """The workflow critical path of one run (the latest by default).

        Parameters
        ----------
        start, end : int, optional
            State ids bounding the path; ``end`` defaults to the run's latest
            state that is not a tombstone.
        method : {"observed", "longest"}
            ``observed``: the last-arriving chain of inputs; ``longest``: the
            chain with the most busy time.
        run_id : str, optional
        """
        index = self._run_index(run_id)
        return critical_path(self.stores[index], start, end, method,
                             default_end=self.ends[index])

    def _run_index(self, run_id: str | None) -> int:
        if not self.stores:
            raise ValueError("the graph is empty")
        if run_id is None:
            return len(self.stores) - 1
        for i, store in enumerate(self.stores):
            if store.run_id == run_id:
                return i
        raise ValueError(f"no run {run_id!r}; runs: {', '.join(self.run_ids)}")


def _require_columns(name: str, frame: pd.DataFrame, columns: dict[str, str]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} table lacks columns {missing}")


def _concat(frames: list[pd.DataFrame], columns: dict[str, str]) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})
    return pd.concat(frames, ignore_index=True)


def _fill(column: array, values: np.ndarray) -> None:
    column.frombytes(memoryview(np.ascontiguousarray(values, dtype=column.typecode)).cast("B"))


def _encoded(values: pd.Series) -> tuple[np.ndarray, list]:
    """Codes and distinct values of a string column (missing values get code -1)."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return codes, [str(u) for u in uniques]


def _store_from_frames(run_id: str, states: pd.DataFrame, mutations: pd.DataFrame
                       ) -> PAGStore:
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
        **strings,
    )


def store_from_columns(run_id: str, *, state_id: np.ndarray, time: np.ndarray,
                       size: np.ndarray, thread: np.ndarray, key: tuple, label: tuple,
                       origin: tuple, location: tuple, worker: tuple, src: np.ndarray,
                       dst: np.ndarray, kind: tuple, busy: np.ndarray, start: np.ndarray
                       ) -> PAGStore:
    """A store from whole columns; string columns come as ``(codes, values)`` pairs.

    Checks the ids (states ``0..n-1``, mutations from lower to higher ids) and
    derives what the builder keeps incrementally: each state's start, ready
    time and last-ready input.

    Raises
    ------
    ValueError
        If the ids or the mutation kinds are not valid.
    """
    n = len(state_id)
    if not np.array_equal(state_id, np.arange(n)):
        raise ValueError(f"run {run_id}: state ids must be 0..{n - 1}")
    if len(src) and (src.min() < 0 or dst.max() >= n):
        raise ValueError(f"run {run_id}: a mutation refers to a state that does not exist")
    if np.any(src >= dst):
        raise ValueError(f"run {run_id}: every mutation must go from a lower to a higher "
                         "state id")
    try:
        kind_of_value = np.array([int(MutationKind.parse(k)) for k in kind[1]] + [-1],
                                 dtype="int8")
    except ValueError as error:
        raise ValueError(f"run {run_id}: {error}") from None
    kinds = kind_of_value[kind[0]]
    if np.any(kinds < 0):
        raise ValueError(f"run {run_id}: a mutation has no kind")

    store = PAGStore(run_id)
    key_codes = _into(store.keys, key)
    # Label and origin belong to the key: take them from each key's first state.
    first_of_key = np.unique(key_codes, return_index=True)[1]
    _fill(store.key_label, _into(store.labels, label)[first_of_key])
    _fill(store.key_origin, _into(store.labels, origin)[first_of_key])
    # A state starts when the operation that created it started.
    state_start = time.copy()
    state_start[dst[::-1]] = start[::-1]
    ready = _ready_times(time, src, dst, kinds, busy)
    _fill(store.state_time, time)
    _fill(store.state_start, state_start)
    _fill(store.state_ready, ready)
    _fill(store.state_size, size)
    _fill(store.state_key, key_codes)
    _fill(store.state_location, _into(store.locations, location))
    _fill(store.state_worker, _into(store.workers, worker))
    _fill(store.state_thread, thread)
    _fill(store.state_pred, _last_arriving(ready, src, dst, n))
    _fill(store.mutation_src, src)
    _fill(store.mutation_dst, dst)
    _fill(store.mutation_kind, kinds)
    _fill(store.mutation_busy, busy)
    return store


def _into(table: StringTable, encoded: tuple[np.ndarray, list]) -> np.ndarray:
    """Codes of ``table`` for a ``(codes, values)`` column (-1 stays -1)."""
    codes, values = encoded
    if not table.values:  # into an empty table: in one go, if the values are distinct
        table.codes = dict(zip(values, range(len(values))))
        if len(table.codes) == len(values):
            table.values = list(values)
            return codes
        table.codes = {}
    mapping = np.array([table.code(v) for v in values] + [-1], dtype="int64")
    return mapping[codes]


def _ready_times(time: np.ndarray, src: np.ndarray, dst: np.ndarray, kinds: np.ndarray,
                 busy: np.ndarray) -> np.ndarray:
    """Per state, its ready time: a transfer's copy is ready its duration after its source."""
    ready = time.copy()
    transfers = np.flatnonzero(kinds == MutationKind.TRANSFER)
    transfers = transfers[np.argsort(dst[transfers], kind="stable")]
    for s, d, b in zip(src[transfers].tolist(), dst[transfers].tolist(),
                       busy[transfers].tolist()):
        ready[d] = min(ready[s] + b, time[d])
    return ready


def _last_arriving(ready: np.ndarray, src: np.ndarray, dst: np.ndarray, n: int
                   ) -> np.ndarray:
    """Per state, the incoming mutation whose source was ready last (first on ties)."""
    pred = np.full(n, -1, dtype="int64")
    if not len(src):
        return pred
    if np.all(dst[1:] >= dst[:-1]):  # grouped by target, as the builder writes them
        arrival = ready[src]
        starts = np.flatnonzero(np.concatenate([[True], dst[1:] != dst[:-1]]))
        latest = np.maximum.reduceat(arrival, starts)
        counts = np.diff(np.append(starts, len(src)))
        ids = np.where(arrival == np.repeat(latest, counts), np.arange(len(src)), len(src))
        pred[dst[starts]] = np.minimum.reduceat(ids, starts)
        return pred
    mids = np.arange(len(src))
    order = np.lexsort((-mids, ready[src]))
    pred[dst[order]] = order
    return pred


def _end_state(store: PAGStore) -> int:
    """The latest state that is neither a root nor a tombstone (last id on ties)."""
    if not store.n_states:
        return -1
    time = store.column("state_time")
    candidate = np.ones(store.n_states, dtype=bool)
    kind = store.column("mutation_kind")
    candidate[store.column("mutation_dst")[kind == MutationKind.DELETE]] = False
    root = store.locations.codes.get(ROOT)
    if root is not None:
        candidate[store.column("state_location") == root] = False
    if not candidate.any():
        return -1
    ids = np.flatnonzero(candidate)
    latest = time[ids]
    return int(ids[np.flatnonzero(latest == latest.max())[-1]])
