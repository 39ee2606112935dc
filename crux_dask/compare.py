"""Recorded runs side by side: their critical paths and the steps that vary most."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from crux_dask.model import ROOT
from crux_dask.pag import PAG
from crux_dask.wcp import CATEGORIES

__all__ = ["compare_runs", "compute_durations", "run_summary"]


def _runs(pags: list[PAG]) -> list[tuple[PAG, str]]:
    return [(pag, run_id) for pag in pags for run_id in pag.run_ids]


def run_summary(pag: PAG, run_id: str) -> dict[str, Any]:
    """Makespan, critical-path length and breakdown of one run.

    The makespan runs from the first graph reaching the scheduler to the
    run's last state (usually the result reaching the client).
    """
    store = pag.store(run_id)
    end = pag.ends[pag.run_ids.index(run_id)]
    time = store.column("state_time")
    roots = np.flatnonzero(store.column("state_location") == store.locations.codes[ROOT])
    # The first root marks when Crux was attached; the graphs' roots follow it.
    start = time[roots[1]] if len(roots) > 1 else time[roots[0]]
    path = pag.wcp(run_id=run_id)
    return {"run_id": run_id, "makespan": float(time[end] - start) if end >= 0 else 0.0,
            "wcp_length": path.length, "wcp_steps": len(path), **path.breakdown}


def compute_durations(pag: PAG, run_id: str) -> pd.DataFrame:
    """Seconds of computation per task of one run: ``key``, ``prefix``, ``seconds``."""
    store = pag.store(run_id)
    mutations = store.mutations_frame()
    computed = mutations[mutations["thread"].notna()].drop_duplicates("dst")
    labels = store.states_frame(computed["dst"].to_numpy())["label"]
    return pd.DataFrame({"key": computed["key"].to_numpy(dtype=object),
                         "prefix": labels.to_numpy(dtype=object),
                         "seconds": computed["busy"].to_numpy()})


def compare_runs(pags: list[PAG]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs side by side, and the steps whose duration varies most between them.

    Returns
    -------
    summary : DataFrame
        One row per run: makespan, WCP length and steps, and the breakdown.
    steps : DataFrame
        One row per task key present in every run (per task prefix when the
        runs share no key): its duration in each run and the spread (max − min),
        largest spread first.
    """
    runs = _runs(pags)
    summary = pd.DataFrame([run_summary(pag, run_id) for pag, run_id in runs],
                           columns=["run_id", "makespan", "wcp_length", "wcp_steps",
                                    *CATEGORIES])
    durations = {run_id[:8]: compute_durations(pag, run_id) for pag, run_id in runs}
    table = pd.DataFrame({r: d.groupby("key")["seconds"].sum() for r, d in durations.items()})
    table = table.dropna()
    if table.empty:  # the runs share no key: compare task prefixes instead
        table = pd.DataFrame({r: d.groupby("prefix")["seconds"].sum()
                              for r, d in durations.items()}).dropna()
    table = table.assign(spread=table.max(axis=1) - table.min(axis=1))
    table = table.sort_values("spread", ascending=False, kind="stable")
    return summary, table.rename_axis("step").reset_index()
