"""What-if predictions against real re-runs of real code, not the simulator's atoms.

Five workloads whose tasks are ordinary Python, numpy and pandas: 16
delayed tasks each spinning a pure-Python loop for about 0.12 s (a loop count
calibrated once per benchmark run, not a sleep), summed by one task;
``(x @ x.T).sum()`` of a 2000×2000 ``dask.array`` in 500×500 chunks; a
``dask.dataframe`` of 400,000 rows in 8 partitions, ``groupby("k").apply`` of
a function that loops over each group's rows in Python; and TPC-H Q1 and Q3
(``tests/tpch.py``) over scale factor 0.2 in 8 Parquet files, generated once
per benchmark run in a temporary directory.

Each workload is recorded with Crux attached (:func:`whatif_validation.record`:
a fresh LocalCluster of worker processes, warmed up by one run first) on
1 worker × 1 thread, and changed to ``threads=2`` (run on 1×2) and to
``workers=2`` (run on 2×1); and recorded on 1×2, changed to ``threads=1``
(run on 1×1).  Each changed configuration is really run ``--reruns`` times,
each on a fresh cluster, the configurations interleaved so that the
machine's drift falls on all alike; the measured makespan is the median of
their recorded makespans (graph root to the result at the client, from each
run's PAG).  Unlike the atoms, real tasks may hold the GIL (the pure-Python
loop, the per-group function) or not (BLAS, most of pandas and Arrow), and
their seconds may change with the threads that share the two cores of this
machine: the model has to tell.  Where it cannot, the prediction carries a
``range`` (low, high seconds), printed with whether the measured makespan
falls in it.

The model is compared with two naive predictions: ``work/threads``, the
recorded makespan scaled by recorded over changed total threads (workers ×
threads), and ``critical path``, the compute seconds on the recorded run's
observed critical path (what no change of workers or threads can remove).

Targets: every point prediction within ±15 % of the measured makespan, the
median absolute error at most 10 %, a Spearman rank correlation of at
least 0.8 between the predicted and the measured change (changed over
recorded makespan) across cases, and on every recording free transfers and
one more worker never predicted slower than the unchanged replay.

Usage: ``python benchmarks/whatif_realcode.py [--reruns N] [--quick]
[--workloads python,numpy,pandas,q1,q3]``
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import pandas as pd

import crux_dask

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from tpch import generate, q1, q3
from whatif_validation import never_slower, print_never_slower, record

POINT_TARGET = 0.15
MEDIAN_TARGET = 0.10
RANK_TARGET = 0.8
RERUNS = 5
SPIN_SECONDS = 0.12  # each pure-Python task
SCALE, PARTS = 0.2, 8  # TPC-H

Config = tuple[int, int]  # workers, threads per worker


def _spin(loops: int) -> int:
    """``loops`` rounds of pure-Python integer arithmetic (holds the GIL throughout)."""
    total = 0
    for i in range(loops):
        total += i * i % 7
    return total


def calibrate(seconds: float = SPIN_SECONDS) -> int:
    """The loop count of :func:`_spin` that takes about ``seconds`` here, median of five."""
    loops = 200_000
    typical = statistics.median(_timed(_spin, loops) for _ in range(5))
    return max(1, round(loops * seconds / typical))


def _timed(function: Callable[[int], Any], argument: int) -> float:
    began = time.perf_counter()
    function(argument)
    return time.perf_counter() - began


def python_workload(loops: int, **_: Any) -> Any:
    """16 delayed pure-Python loops of ``loops`` rounds, summed by one final task."""
    # Keys of their own each call (``pure=False``): a result left in memory by the
    # run before, not yet released, would otherwise be reused.
    parts = [dask.delayed(_spin, pure=False)(loops) for _ in range(16)]
    return dask.delayed(sum, pure=False)(parts)


def numpy_workload(**_: Any) -> Any:
    """``(x @ x.T).sum()`` of a 2000×2000 random array in 500×500 chunks."""
    import dask.array as da

    x = da.random.random((2000, 2000), chunks=500)
    return (x @ x.T).sum()


def _per_group(group: pd.DataFrame) -> pd.Series:
    """A running score over the group's rows, row by row in Python."""
    score = peak = 0.0
    above = 0
    for row in group.itertuples(index=False):
        score = 0.9 * score + math.sqrt(row.v * row.w + 1.0)
        peak = max(peak, score)
        above += row.v > row.w
    return pd.Series({"rows": float(len(group)), "peak": peak, "above": float(above)})


def pandas_workload(rows: int = 400_000, keys: int = 50, **_: Any) -> Any:
    """8 partitions of ``rows`` in all, ``groupby("k").apply`` of a per-row Python loop."""
    import dask.dataframe as dd
    import numpy as np

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"k": rng.integers(0, keys, rows), "v": rng.random(rows),
                          "w": rng.random(rows)})
    return dd.from_pandas(frame, npartitions=8).groupby("k").apply(
        _per_group, meta={"rows": "f8", "peak": "f8", "above": "f8"})


def q1_workload(data: Path, **_: Any) -> Any:
    """TPC-H Q1 (``tests/tpch.py``)."""
    return q1(data)


def q3_workload(data: Path, **_: Any) -> Any:
    """TPC-H Q3 (``tests/tpch.py``)."""
    return q3(data)


WORKLOADS: dict[str, Callable[..., Any]] = {
    "python": python_workload, "numpy": numpy_workload, "pandas": pandas_workload,
    "q1": q1_workload, "q3": q3_workload}

#: recorded on, change, really run on
CASES: list[tuple[Config, dict[str, int], Config]] = [
    ((1, 1), {"threads": 2}, (1, 2)),
    ((1, 1), {"workers": 2}, (2, 1)),
    ((1, 2), {"threads": 1}, (1, 1)),
]


@dataclass
class Row:
    """One case: the prediction, the measured makespan and the naive predictions."""

    workload: str
    recorded_on: Config
    change: dict[str, int]
    result: Any  # crux_dask.whatif.WhatIf
    measured: float
    work_threads: float  # naive: recorded makespan × recorded / changed total threads
    critical_path: float  # naive: compute seconds on the recorded observed critical path

    @property
    def error(self) -> float:
        return self.result.makespan / self.measured - 1

    @property
    def range(self) -> tuple[float, float] | None:
        return self.result.range

    def naive_error(self, which: str) -> float:
        return getattr(self, which) / self.measured - 1


def path_compute(pag: crux_dask.PAG) -> float:
    """Compute seconds on the observed critical path of ``pag``'s run."""
    steps = pag.wcp().to_frame()
    return float(steps.loc[steps["category"] == "compute", "busy"].sum())


def run_workload(name: str, reruns: int, params: dict[str, Any], slower: list[float]
                 ) -> list[Row]:
    """Record ``name`` on 1×1 and 1×2, re-run each changed configuration; its cases' rows.
    Each recording's :func:`~whatif_validation.never_slower` changes go in ``slower``."""
    workload = WORKLOADS[name]
    began = time.perf_counter()
    pags = {config: record(workload, *config, **params)
            for config in dict.fromkeys(case[0] for case in CASES)}
    for config, (pag, load) in pags.items():
        print(f"  {name}: recorded on {_on(config)}: {pag.what_if().recorded:.3f} s "
              f"({time.perf_counter() - began:.0f} s)", flush=True)
        checked = never_slower(pag, load)
        slower.extend(checked.values())
        print_never_slower(f"{name} on {_on(config)}", checked)
    measured: dict[Config, list[float]] = {c[2]: [] for c in CASES}
    for i in range(reruns):
        for config, makespans in measured.items():
            try:
                makespans.append(record(workload, *config, **params)[0].what_if().recorded)
            except Exception as error:  # the median is then of the other re-runs
                print(f"  {name}: re-run {i + 1}/{reruns} on {_on(config)} failed: {error!r}",
                      flush=True)
                continue
            print(f"  {name}: re-run {i + 1}/{reruns} on {_on(config)}: {makespans[-1]:.3f} s"
                  f" ({time.perf_counter() - began:.0f} s)", flush=True)
    rows = []
    for recorded_on, change, changed in CASES:
        pag, load = pags[recorded_on]
        if not measured[changed]:
            print(f"  {name}: no re-run on {_on(changed)}: {_change(change)} left out", flush=True)
            continue
        try:
            result = pag.what_if(load=load, **change)
        except Exception as error:  # report it and go on with the other cases
            print(f"  {name}: what_if({_change(change)}) failed: {error!r}", flush=True)
            continue
        rows.append(Row(name, recorded_on, change, result, statistics.median(measured[changed]),
                        result.recorded * math.prod(recorded_on) / math.prod(changed),
                        path_compute(pag)))
        print_case(rows[-1])
    return rows


def print_case(row: Row) -> None:
    """The case's prediction against its measured makespan, and the naive predictions'."""
    result = row.result
    print(f"{row.workload:<7} {_on(row.recorded_on)} {_change(row.change):<10} "
          f"recorded {result.recorded:6.3f} s  replay error {result.replay_error:+6.1%}  "
          f"predicted {result.makespan:6.3f} s  measured {row.measured:6.3f} s  "
          f"error {row.error:+6.1%}", flush=True)
    if row.range is not None:
        low, high = row.range
        inside = "inside" if low <= row.measured <= high else "OUTSIDE"
        print(f"{'':18} range {low:.3f}–{high:.3f} s: measured {inside}", flush=True)
    print(f"{'':18} naive work/threads {row.work_threads:6.3f} s "
          f"({row.naive_error('work_threads'):+6.1%}), critical path "
          f"{row.critical_path:6.3f} s ({row.naive_error('critical_path'):+6.1%})", flush=True)


def summarize(rows: list[Row]) -> None:
    """The table of all cases, the median errors, per-workload wins and the rank correlation."""
    print("\n| workload | recorded on | change | recorded | replay error | predicted | range |"
          " measured | error | work/threads (error) | critical path (error) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        r = row.result
        span = "–" if row.range is None else (
            f"{row.range[0]:.3f}–{row.range[1]:.3f} s "
            f"({'in' if row.range[0] <= row.measured <= row.range[1] else 'out'})")
        print(f"| {row.workload} | {_on(row.recorded_on)} | {_change(row.change)} | "
              f"{r.recorded:.3f} s | {r.replay_error:+.1%} | {r.makespan:.3f} s | {span} | "
              f"{row.measured:.3f} s | {row.error:+.1%} | {row.work_threads:.3f} s "
              f"({row.naive_error('work_threads'):+.1%}) | {row.critical_path:.3f} s "
              f"({row.naive_error('critical_path'):+.1%}) |")
    if not rows:
        return
    model = statistics.median(abs(row.error) for row in rows)
    naive = {which: statistics.median(abs(row.naive_error(which)) for row in rows)
             for which in ("work_threads", "critical_path")}
    within = sum(abs(row.error) <= POINT_TARGET for row in rows)
    print(f"\npoint predictions within ±{POINT_TARGET:.0%}: {within}/{len(rows)}")
    print(f"median abs error: model {model:.1%} (target ≤{MEDIAN_TARGET:.0%}), "
          f"work/threads {naive['work_threads']:.1%}, "
          f"critical path {naive['critical_path']:.1%}")
    worst = max(rows, key=lambda row: abs(row.result.replay_error))
    print(f"worst unchanged replay error {worst.result.replay_error:+.1%} "
          f"({worst.workload} on {_on(worst.recorded_on)})")
    for name in dict.fromkeys(row.workload for row in rows):
        mine = [row for row in rows if row.workload == name]
        errors = {"model": statistics.fmean(abs(row.error) for row in mine)} | {
            which: statistics.fmean(abs(row.naive_error(which)) for row in mine)
            for which in ("work_threads", "critical_path")}
        beats = errors["model"] < min(errors["work_threads"], errors["critical_path"])
        print(f"  {name:<7} mean abs error: model {errors['model']:.1%}, work/threads "
              f"{errors['work_threads']:.1%}, critical path {errors['critical_path']:.1%}: "
              f"model beats both: {'yes' if beats else 'no'}")
    predicted = pd.Series([row.result.makespan / row.result.recorded for row in rows])
    measured = pd.Series([row.measured / row.result.recorded for row in rows])
    # Spearman's rho as Pearson's of the ranks: Series.corr(method="spearman") needs scipy.
    rho = predicted.rank().corr(measured.rank())
    print(f"Spearman rank correlation of predicted and measured change over {len(rows)} "
          f"cases: {rho:.2f} (target ≥{RANK_TARGET})")


def _on(config: Config) -> str:
    return f"{config[0]}×{config[1]}"


def _change(change: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in change.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reruns", type=int, default=RERUNS,
                        help="real runs of each changed configuration (their median is measured)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    parser.add_argument("--quick", action="store_true", help="one re-run (for development)")
    args = parser.parse_args()
    names = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    reruns = 1 if args.quick else args.reruns
    # The in-process scheduler's P2P shuffle warns at each shuffle's start and end.
    logging.getLogger("distributed.shuffle._scheduler_plugin").setLevel(logging.ERROR)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="whatif-tpch-") as directory:
        params: dict[str, Any] = {}
        if "python" in names:
            params["loops"] = calibrate()
            print(f"pure-Python loop: {params['loops']:,} rounds ≈ {SPIN_SECONDS} s", flush=True)
        if {"q1", "q3"} & set(names):
            params["data"] = generate(Path(directory), SCALE, PARTS)
            print(f"TPC-H sf {SCALE} in {PARTS} files generated "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
        rows: list[Row] = []
        slower: list[float] = []
        for name in names:
            try:
                rows += run_workload(name, reruns, params, slower)
            except Exception as error:  # a failed run: report it, go on with the others
                print(f"  {name}: failed: {error!r}", flush=True)
    print("\nMakespan: graph root (arrival at the scheduler) to the result at the client, from"
          f" each run's PAG; measured: median of {reruns} re-run(s), each on a fresh cluster.")
    summarize(rows)
    print(f"free transfers or one more worker at worst {max(slower, default=0.0):+.1%} against"
          " the unchanged replay (target: never slower)")
    print(f"{time.perf_counter() - started:.0f} s in all", flush=True)


if __name__ == "__main__":
    main()
