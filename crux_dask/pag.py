"""The program activity graph as users see it: tables plus critical paths."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from crux_dask.model import CAUSE_COLUMNS, MOMENT_COLUMNS, MUTATION_COLUMNS, STATE_COLUMNS
from crux_dask.rebuild import end_state, store_from_frames
from crux_dask.store import PAGStore
from crux_dask.wcp import CriticalPath, critical_path

if TYPE_CHECKING:
    from collections.abc import Iterable

    from crux_dask.scaling import Scaling
    from crux_dask.whatif import WhatIf

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
        self.ends = [end_state(s) if e is None else e for s, e in zip(self.stores, ends)]

    # -- construction -------------------------------------------------------
    @classmethod
    def from_frames(cls, states: pd.DataFrame, mutations: pd.DataFrame,
                    causes: pd.DataFrame | None = None,
                    moments: pd.DataFrame | None = None) -> PAG:
        """A PAG from its tables (columns of :mod:`crux_dask.model`).

        Within a run, ``state_id`` must number the states ``0..n-1`` and every
        mutation and cause must go from a lower to a higher state id (the
        order in which states are created), which is how the live graph and
        its exports are numbered.  ``causes`` and ``moments`` are optional:
        without them the critical path follows data alone, and the time
        before each operation is ``wait``.

        Raises
        ------
        ValueError
            If a column is missing or the ids break those rules.
        """
        _require_columns("states", states, STATE_COLUMNS)
        _require_columns("mutations", mutations, MUTATION_COLUMNS)
        if causes is not None:
            _require_columns("causes", causes, CAUSE_COLUMNS)
        if moments is not None:
            _require_columns("moments", moments, MOMENT_COLUMNS)
        run_ids = list(dict.fromkeys(states["run_id"].tolist()))
        unknown = set(mutations["run_id"].tolist()) - set(run_ids)
        if unknown:
            raise ValueError(f"mutations of runs with no states: {sorted(unknown)}")
        stores = []
        for run_id in run_ids:
            run_states = states[states["run_id"] == run_id].sort_values("state_id")
            run_mutations = mutations[mutations["run_id"] == run_id].sort_values(
                "mutation_id")
            stores.append(store_from_frames(
                run_id, run_states, run_mutations,
                None if causes is None else
                causes[causes["run_id"] == run_id].sort_values("cause_id"),
                None if moments is None else moments[moments["run_id"] == run_id]))
        return cls(stores)

    # -- tables -------------------------------------------------------------
    @property
    def run_ids(self) -> list[str]:
        return [s.run_id for s in self.stores]

    @property
    def states(self) -> pd.DataFrame:
        """All data states (:data:`crux_dask.model.STATE_COLUMNS`)."""
        return _concat([s.states_frame() for s in self.stores], STATE_COLUMNS)

    @property
    def mutations(self) -> pd.DataFrame:
        """All data mutations (:data:`crux_dask.model.MUTATION_COLUMNS`)."""
        return _concat([s.mutations_frame() for s in self.stores], MUTATION_COLUMNS)

    @property
    def causes(self) -> pd.DataFrame:
        """All causes besides data (:data:`crux_dask.model.CAUSE_COLUMNS`)."""
        return _concat([s.causes_frame() for s in self.stores], CAUSE_COLUMNS)

    @property
    def moments(self) -> pd.DataFrame:
        """The recorded moments of operations (:data:`crux_dask.model.MOMENT_COLUMNS`)."""
        return _concat([s.moments_frame() for s in self.stores], MOMENT_COLUMNS)

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

    def what_if(self, workers: int | None = None, threads: int | None = None,
                speedup: dict[str, float] | None = None,
                transfer_speedup: float | None = None, spill: bool = True,
                run_id: str | None = None, stragglers: str | None = None,
                load: pd.DataFrame | None = None) -> WhatIf:
        """Replay the run with a model of Dask's scheduler, changed (see :mod:`crux_dask.whatif`).

        Parameters
        ----------
        workers, threads : int, optional
            Workers, and threads per worker (default: as recorded).
        speedup : dict, optional
            Task prefix (label) to factor ``k``: that prefix computes ``k``
            times faster.
        transfer_speedup : float, optional
            Transfers between workers ``k`` times faster (``float("inf")``:
            free).
        spill : bool
            ``False`` removes the time spent spilling to and loading from disk.
        run_id : str, optional
            The run (the latest by default).
        stragglers : str, optional
            ``"median"``: each straggler (:mod:`crux_dask.groups`) computes for
            its group's median seconds.
        load : DataFrame, optional
            The run's load (:func:`crux_dask.get_load`,
            :func:`crux_dask.read_load`): the cores of its hosts and the GIL
            contention of its workers (:mod:`crux_dask.machine`).  Without it,
            cores are not a limit and no label's GIL share is known.

        Returns
        -------
        WhatIf
            ``.makespan`` (predicted seconds, from the graph's root to the
            run's end), ``.range`` (low and high where the run does not tell
            whether the labels of ``.gil_unknown`` hold the GIL),
            ``.replay_error`` (the unchanged replay against the recorded run,
            as a fraction) and ``.path`` (the predicted run's critical path).

        Raises
        ------
        ValueError
            For an unknown prefix, fewer than one worker or thread, a factor
            that is not positive, ``stragglers`` other than ``"median"``, or a run
            without tasks or timing.
        """
        from crux_dask.whatif import what_if

        index = self._run_index(run_id)
        return what_if(self.stores[index], self.ends[index], workers, threads, speedup,
                       transfer_speedup, spill, stragglers, load=load)

    def suggest(self, run_id: str | None = None, load: pd.DataFrame | None = None
                ) -> pd.DataFrame:
        """What to fix: the advice the path and the load support, then candidate changes
        ranked by the seconds a what-if replay predicts they save.

        The advice (:func:`crux_dask.advice.advise`) comes of the stages of the
        observed path and the load they ran under (``load``, from
        :func:`crux_dask.get_load` or :func:`crux_dask.read_load`; without it,
        only what the path alone supports).  The changes replayed: each of the
        top task prefixes of the path 2× faster, one more worker, twice the
        threads, free transfers, no spill and, where the run has any, its
        stragglers at their group's median.

        Returns
        -------
        pandas.DataFrame
            The advice first, most of the path first, then the changes, most
            seconds saved first: ``kind`` (``advice`` or ``what-if``),
            ``change``, ``why`` (the figures behind an advice), ``path_share``
            (of the path, held by the stages behind an advice), ``predicted``
            makespan (of an advice on the cluster's shape: of the shape its
            ``why`` names; NaN for other advice), ``low`` and ``high`` (its
            range where the run does not tell whether a label holds the GIL,
            else NaN), ``saved`` (against the
            unchanged replay), ``saved_share``,
            ``replay_error`` and ``path_then``: the prefixes with the most busy
            seconds on the predicted critical path.
        """
        from crux_dask.advice import what_to_fix

        index = self._run_index(run_id)
        return what_to_fix(self.stores[index], self.ends[index], self.wcp(run_id=run_id),
                           load)

    def scaling(self, workers: Iterable[int] = range(1, 9), threads: Iterable[int] = (1, 2, 4),
                load: pd.DataFrame | None = None, run_id: str | None = None) -> Scaling:
        """How many workers are enough: the run predicted on each shape of ``workers`` ×
        ``threads`` per worker (see :mod:`crux_dask.scaling`).

        Parameters
        ----------
        workers, threads : iterable of int
            The numbers of workers, and of threads per worker, to combine.
        load : DataFrame, optional
            The run's load, as for :meth:`what_if`.
        run_id : str, optional
            The run (the latest by default).

        Returns
        -------
        Scaling
            ``.table`` (one row per shape: its predicted makespan, range and
            change), ``.enough`` (the smallest shape within 5 % of the best)
            and ``.summary()``.
        """
        from crux_dask.scaling import scaling

        index = self._run_index(run_id)
        return scaling(self.stores[index], self.ends[index], workers, threads, load)

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
