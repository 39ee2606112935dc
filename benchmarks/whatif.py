"""Speed of the what-if replay on a synthetic run of about a million states.

The layered workflow of :mod:`benchmarks.core_scale` (16 workers, each task
merging three outputs of the layer before, one input in ten fetched from
another worker, every replica released) is built through the real builder,
then replayed: the recorded run read once (``extract``), an unchanged replay
and a replay on twice the workers, each timed on its own; then the
prediction over cluster shapes (``PAG.scaling``'s default: 1–8 workers ×
1, 2 or 4 threads, 24 replays).

With ``--cpu`` every task's seconds are CPU seconds and a load table gives
each worker's host two cores, so the replays share cores as those of a run
recorded with Crux's CPU clocks do (:mod:`crux_dask.sharing`); without it the
run has no CPU seconds, as an export of an older schema, and tasks compete for
nothing.

Targets: a replay of a million states in seconds; the scaling in ≤ 30 s.

Usage: ``python benchmarks/whatif.py [--states N] [--cpu]``
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
from core_scale import WORKERS, workflow_events

from crux_dask.events import Compute
from crux_dask.graph.builder import PAGBuilder
from crux_dask.load import LOAD_COLUMNS, SCHEDULER
from crux_dask.recording import extract
from crux_dask.scaling import scaling
from crux_dask.whatif import what_if

CPU = Compute._fields.index("cpu")


def build(n_tasks: int, cpu: bool) -> PAGBuilder:
    """The synthetic run, its tasks all CPU where ``cpu``."""
    builder = PAGBuilder()
    for chunk in workflow_events(n_tasks):
        if cpu:
            chunk = [_with_cpu(event) if event[0] == "compute" else event for event in chunk]
        builder.apply_many(chunk)
    return builder


def _with_cpu(event: tuple) -> tuple:
    fields = list(event) + [None] * (len(Compute._fields) - len(event))
    fields[CPU], fields[CPU + 1] = event[5] - event[4], 0.0  # cpu, cpu_wait
    return tuple(fields)


def two_cores(origin: float) -> pd.DataFrame:
    """A load table: a sample of each worker, on a host of two cores, and the scheduler's."""
    rows = [{"process": p, "time": origin + 1.0, "cpu": 0.5, "lag": 0.0, "busy": 0.0,
             "threads": 1.0, "cores": 2.0, "gil": float("nan")} for p in [*WORKERS, SCHEDULER]]
    return pd.DataFrame(rows).astype(LOAD_COLUMNS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=1_000_000,
                        help="about how many states the run has")
    parser.add_argument("--cpu", action="store_true",
                        help="tasks of CPU seconds, on hosts of two cores")
    args = parser.parse_args()
    # core_scale's workflow makes about 2.2 states per task (its copies and tombstones).
    builder = build(int(args.states / 2.2), args.cpu)
    store, end = builder.store, builder.pag().ends[0]
    print(f"run: {store.n_states:,} states, {store.n_mutations:,} mutations"
          f"{', tasks of CPU seconds on hosts of two cores' if args.cpu else ''}")
    t0 = time.perf_counter()
    run = extract(store, end)
    t1 = time.perf_counter()
    print(f"extract: {run.n_tasks:,} tasks, {len(run.deps):,} inputs in {t1 - t0:.2f} s")
    load = two_cores(run.origin) if args.cpu else None
    for change in ({}, {"workers": 2 * len(run.workers)}):
        t0 = time.perf_counter()
        result = what_if(store, end, run=run, load=load, **change)
        spent = time.perf_counter() - t0
        print(f"replay {change or 'unchanged'}: {spent:.2f} s (the unchanged replay is "
              f"computed once and kept); predicted {result.makespan:.3f} s, recorded "
              f"{result.recorded:.3f} s, replay error {result.replay_error:+.1%}")
    t0 = time.perf_counter()
    shapes = scaling(store, end, range(1, 9), (1, 2, 4), load)
    spent = time.perf_counter() - t0
    print(f"scaling over {len(shapes.table)} shapes: {spent:.2f} s; {shapes.summary()}")
    print("The synthetic run is not a schedule Dask made (its events are serial in time),"
          " so only the seconds matter here, not the replay error.")
    print("targets: a replay of 1M states in seconds; the scaling in <= 30 s")


if __name__ == "__main__":
    main()
