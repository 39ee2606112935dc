"""Advice a user can act on, each backed by the figures of the path and the load that
triggered it.

Each rule reads the stages of a path (:data:`~crux_dask.costs.STAGES`) and the
load they ran under (:func:`~crux_dask.load.stage_loads`):

* **larger tasks**: the path's tasks are short against what each costs to
  schedule (its report, the scheduler's decision, its dispatch and its
  worker's start), beyond the stages a busy scheduler explains (the next
  rule but one): bigger chunks or partitions make fewer of them;
* **fewer threads**: the stages that ran in a worker whose host had more busy
  threads than cores: fewer threads or workers per host;
* **processes, not threads**: a worker whose threads waited for the GIL:
  more worker processes with fewer threads each;
* **a busy scheduler**: the scheduler's stages ran while its CPU was full
  or its event loop late: fewer tasks, or one graph instead of many;
* **skew**: the path goes through stragglers whose bytes explain them
  (:mod:`crux_dask.groups`): repartition, or salt the hot key;
* **a slow task**: the path goes through stragglers with their group's bytes:
  look at the worker or the file behind them.

Advice on the shape of the cluster (fewer threads; processes, not threads)
carries the what-if replay's prediction of that shape (:func:`what_to_fix`),
which shares cores and the GIL (:mod:`crux_dask.sharing`) but not the
scheduler's own cost; the what-if changes listed after it
(:func:`crux_dask.whatif.suggest`: more workers, more threads, the stragglers
at their group's median) carry theirs.  :func:`fixes` adds how many workers
are enough (:mod:`crux_dask.scaling`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.groups import describe_straggler
from crux_dask.load import SCHEDULER, stage_loads
from crux_dask.path import STAGES

if TYPE_CHECKING:
    import pandas as pd

    from crux_dask.machine import Machine
    from crux_dask.path import CriticalPath
    from crux_dask.runs import Run
    from crux_dask.scaling import Scaling
    from crux_dask.store import PAGStore

__all__ = ["ADVICE_COLUMNS", "SCALING_SHAPES", "SUGGESTION_COLUMNS", "advise", "fixes",
           "fixes_apart", "what_to_fix"]

#: The columns of :func:`advise`'s table.
ADVICE_COLUMNS = ("advice", "why", "share")
#: The columns of :func:`what_to_fix`'s table.
SUGGESTION_COLUMNS = ("kind", "change", "why", "path_share", "predicted", "low", "high",
                      "saved", "saved_share", "replay_error", "path_then")
#: The cluster shapes :func:`fixes` (and the report) predict: these workers × threads.
SCALING_SHAPES = ((1, 2, 4, 8), (1, 2))
#: The least share of a path a rule's stages must hold for it to advise.
LEAST_SHARE = 0.1
#: GIL contention past which a worker's threads are said to wait for it.
GIL_CONTENDED = 0.2
#: CPU (of one core) past which the scheduler is said to be busy, and event loop
#: lag (seconds) past which it is said to be late.
SCHEDULER_BUSY, SCHEDULER_LATE = 0.75, 0.05


def advise(path: CriticalPath, load: pd.DataFrame) -> pd.DataFrame:
    """The advice the path and the load support, most of the path first.

    Parameters
    ----------
    path : CriticalPath
    load : DataFrame
        The run's load table (:data:`~crux_dask.load.LOAD_COLUMNS`), possibly empty:
        then only the advice the path alone supports.

    Returns
    -------
    DataFrame
        One row per advice: ``advice``, ``why`` (the figures behind it) and
        ``share`` (of the path's length, held by the stages that triggered it).
    """
    import pandas as pd

    steps = path.to_frame()
    loads = stage_loads(steps, load)
    crowded = loads[(loads["process"] != SCHEDULER) & (loads["host_busy"] > loads["cores"])]
    contended = loads[(loads["process"] != SCHEDULER) & (loads["gil"] > GIL_CONTENDED)]
    busy = loads[(loads["process"] == SCHEDULER) & ((loads["cpu"] >= SCHEDULER_BUSY)
                                                   | (loads["lag"] >= SCHEDULER_LATE))]
    rows = [row for row in (_larger_tasks(path, steps, busy),
                            _backed(path, crowded, "crowded"),
                            _backed(path, contended, "contended"), _backed(path, busy, "busy"),
                            *_stragglers(path))
            if row is not None and row["share"] >= LEAST_SHARE]
    table = pd.DataFrame(rows, columns=list(ADVICE_COLUMNS))
    return table.sort_values("share", ascending=False, kind="stable").reset_index(drop=True)


def what_to_fix(store: PAGStore, end: int, path: CriticalPath,
                load: pd.DataFrame | dict | None, run: Run | None = None,
                machine: Machine | None = None) -> pd.DataFrame:
    """The advice of :func:`advise`, then the what-if changes of
    :func:`crux_dask.whatif.suggest`: the table of :meth:`crux_dask.PAG.suggest`.

    ``load`` is a load table, or its columns as the scheduler keeps them
    (:meth:`~crux_dask.load.LoadLog.columns`), or None; ``run`` and ``machine``
    are passed on to :func:`~crux_dask.whatif.suggest`.

    Raises
    ------
    ValueError
        If the run has no tasks or timing to replay.
    """
    import pandas as pd

    from crux_dask.load import load_frame
    from crux_dask.machine import machine_of
    from crux_dask.recording import extract
    from crux_dask.whatif import suggest

    load = load_frame(load)
    run = extract(store, end) if run is None else run
    machine = machine_of(run, load) if machine is None else machine
    advice = advise(path, load).rename(columns={"advice": "change", "share": "path_share"})
    predicted = [_predicted(store, end, run, machine, change) for change in advice["change"]]
    advice = pd.concat([advice, pd.DataFrame(predicted, index=advice.index,
                                             columns=list(SUGGESTION_COLUMNS[4:]))], axis=1)
    for i, change in enumerate(advice["change"]):
        if change in _SHAPES:
            workers, threads = _SHAPES[change](len(run.workers), run.threads)
            advice.loc[i, "why"] += (f"; predicted for {workers} worker{'s' * (workers > 1)}"
                                     f" × {threads} thread{'s' * (threads > 1)}")
    changes = suggest(store, end, path, load, run, machine)
    table = pd.concat([advice.assign(kind="advice"), changes.assign(kind="what-if")],
                      ignore_index=True)[list(SUGGESTION_COLUMNS)]
    # Without advice, its empty columns have no type, and would make the figures objects.
    return table.astype(dict.fromkeys(SUGGESTION_COLUMNS[3:-1], float))


def _predicted(store: PAGStore, end: int, run: Run, machine: Machine, advice: str
               ) -> dict[str, Any]:
    """The what-if figures of the cluster shape ``advice`` stands for (:data:`_SHAPES`),
    NaN for advice on something else."""
    from crux_dask.whatif import suggestion_row, what_if

    if advice not in _SHAPES:
        return dict.fromkeys(SUGGESTION_COLUMNS[4:], np.nan) | {"path_then": ""}
    workers, threads = _SHAPES[advice](len(run.workers), run.threads)
    return suggestion_row(what_if(store, end, workers=workers, threads=threads, run=run,
                                  machine=machine))


def fixes(store: PAGStore, end: int, load: pd.DataFrame | dict | None
          ) -> tuple[pd.DataFrame, Scaling]:
    """What to fix on the observed path to ``end`` (:func:`what_to_fix`), and how many
    workers are enough (:func:`~crux_dask.scaling.scaling` on
    :data:`SCALING_SHAPES`): what the dashboard's "What to fix" shows.

    Raises
    ------
    ValueError
        If the run has no tasks or timing to replay.
    """
    from crux_dask.load import load_frame
    from crux_dask.machine import machine_of
    from crux_dask.recording import extract
    from crux_dask.scaling import scaling
    from crux_dask.wcp import critical_path

    load = load_frame(load)
    run = extract(store, end)  # read once, and its unchanged replay played once for both
    machine = machine_of(run, load)
    table = what_to_fix(store, end, critical_path(store, default_end=end), load, run=run,
                        machine=machine)
    return table, scaling(store, end, *SCALING_SHAPES, load, run=run, machine=machine)


def fixes_apart(pieces: Any, end: int, niceness: int, answer: Any,
                load: dict | None = None) -> None:
    """:func:`fixes` for the store :meth:`~crux_dask.store.PAGStore.to_pieces` cut, with
    the ``load`` columns, sent on the connection ``answer`` as ``(fixes, None)``, or
    ``(None, error)`` for a ``ValueError``.  The pieces come on the connection
    ``pieces``, one per message, until an empty one.

    What a process of its own runs, ``niceness`` less favoured than its
    parent, for a server whose event loop must not wait for it: a replay
    allocates millions of small objects, and a thread would hold the
    interpreter for every garbage collection they cause.
    """
    from crux_dask.store import PAGStore

    os.nice(niceness)
    store = PAGStore.from_pieces(list(iter(pieces.recv_bytes, b"")))
    try:
        answer.send((fixes(store, end, load), None))
    except ValueError as error:  # a run without tasks or timing
        answer.send((None, error))


def _larger_tasks(path: CriticalPath, steps: pd.DataFrame, busy: pd.DataFrame
                  ) -> dict | None:
    """The path's tasks are shorter than what scheduling each costs on it, beyond the
    stages the scheduler was ``busy`` in."""
    tasks = steps[steps["category"] == "compute"].set_index("step")
    if len(tasks) < 2 or path.length <= 0:
        return None
    tasks = tasks.copy()
    for step, stage in busy[["step", "stage"]].drop_duplicates().itertuples(index=False):
        if step in tasks.index:
            tasks.loc[step, stage] = 0.0
    overhead = tasks[list(STAGES)].sum(axis=1)
    task, cost = float(tasks["busy"].median()), float(overhead.median())
    if cost <= task:
        return None
    parts = ", ".join(f"{stage} {tasks[stage].median() * 1e3:.1f}" for stage in STAGES
                      if tasks[stage].median() > 0)
    return {"advice": "fewer, larger tasks (bigger chunks or partitions)",
            "why": f"the path's median task computes {task * 1e3:.1f} ms and waits "
                   f"{cost * 1e3:.1f} ms to be scheduled ({parts} ms), over "
                   f"{len(tasks)} tasks",
            "share": float(overhead.sum()) / path.length}


def _crowded(crowded: pd.DataFrame) -> str:
    worst = crowded.loc[(crowded["host_busy"] - crowded["cores"]).idxmax()]
    return (f"their host had more busy threads than cores, up to {worst['host_busy']:.0f} "
            f"on {worst['cores']:.0f} cores")


def _contended(waiting: pd.DataFrame) -> str:
    return (f"their worker's threads waited for the GIL {np.nanmean(waiting['gil']):.0%} "
            f"of the time on average")


def _busy(busy: pd.DataFrame) -> str:
    return (f"the scheduler's CPU was up to {busy['cpu'].max():.0%} and its event loop up "
            f"to {busy['lag'].max() * 1e3:.0f} ms late")


#: The cluster shape (workers, threads per worker) the advice on a run of ``workers``
#: × ``threads`` stands for, for a prediction: half the threads, else half the workers;
#: as many worker processes as there were threads, one thread each.
_SHAPES = {
    "fewer threads or workers per host": lambda workers, threads: (
        (workers, threads // 2) if threads > 1 else (max(workers // 2, 1), 1)),
    "more worker processes, fewer threads each": lambda workers, threads: (
        workers * threads, 1),
}
#: The advice the load supports: what it says, and how it says why.
_LOAD_ADVICE = {
    "crowded": ("fewer threads or workers per host", _crowded),
    "contended": ("more worker processes, fewer threads each", _contended),
    "busy": ("fewer tasks for the scheduler (larger chunks, one graph instead of many, no "
             "costly scheduler plugins)", _busy),
}


def _backed(path: CriticalPath, loads: pd.DataFrame, rule: str) -> dict | None:
    """The advice ``rule`` of :data:`_LOAD_ADVICE`, backed by the stages of ``loads``;
    None without any."""
    if loads.empty:
        return None
    advice, why = _LOAD_ADVICE[rule]
    seconds = float(loads["seconds"].sum())
    return {"advice": advice,
            "why": f"{seconds:.3f} s of the path's stages ran while {why(loads)} "
                   f"({_names(loads)})",
            "share": seconds / path.length}


#: What to do about the stragglers of each kind.
_STRAGGLER_ADVICE = {
    "skew": "repartition, or salt the hot key, so that no partition holds many times "
            "its siblings' bytes",
    "slow": "look at the worker or the file behind the slow task: it had its siblings' "
            "bytes",
}


def _stragglers(path: CriticalPath) -> list[dict]:
    """The advice for the path's stragglers of each kind, the worst three named."""
    flagged = path.stragglers()
    rows = []
    for kind, advice in _STRAGGLER_ADVICE.items():
        these = flagged[flagged["straggler"] == kind]
        if len(these):
            rows.append({"advice": advice,
                         "why": "; ".join(f"{describe_straggler(row)}, on {row.destination}"
                                          for row in these.head(3).itertuples(index=False)),
                         "share": float(these["share"].sum())})
    return rows


def _names(loads: pd.DataFrame) -> str:
    """The stages of ``loads`` and their seconds, most first."""
    seconds = loads.groupby("stage")["seconds"].sum().sort_values(ascending=False)
    return ", ".join(f"{stage} {value:.3f} s" for stage, value in seconds.items())
