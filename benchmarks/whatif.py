"""Speed of the what-if replay on a synthetic run of about a million states.

The layered workflow of :mod:`benchmarks.core_scale` (16 workers, each task
merging three outputs of the layer before, one input in ten fetched from
another worker, every replica released) is built through the real builder,
then replayed: the recorded run read once (``extract``), an unchanged replay
and a replay on twice the workers, each timed on its own.

Target: a replay of a million states in seconds.

Usage: ``python benchmarks/whatif.py [--states N]``
"""

from __future__ import annotations

import argparse
import time

from core_scale import build

from crux_dask.recording import extract
from crux_dask.whatif import what_if


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=1_000_000,
                        help="about how many states the run has")
    args = parser.parse_args()
    # core_scale's workflow makes about 2.2 states per task (its copies and tombstones).
    builder, _, _, _ = build(int(args.states / 2.2))
    store, end = builder.store, builder.pag().ends[0]
    print(f"run: {store.n_states:,} states, {store.n_mutations:,} mutations")
    t0 = time.perf_counter()
    run = extract(store, end)
    t1 = time.perf_counter()
    print(f"extract: {run.n_tasks:,} tasks, {len(run.deps):,} inputs in {t1 - t0:.2f} s")
    for change in ({}, {"workers": 2 * len(run.workers)}):
        t0 = time.perf_counter()
        result = what_if(store, end, run=run, **change)
        spent = time.perf_counter() - t0
        print(f"replay {change or 'unchanged'}: {spent:.2f} s (the unchanged replay is "
              f"computed once and kept); predicted {result.makespan:.3f} s, recorded "
              f"{result.recorded:.3f} s, replay error {result.replay_error:+.1%}")
    print("The synthetic run is not a schedule Dask made (its events are serial in time),"
          " so only the seconds matter here, not the replay error.")
    print("target: a replay of 1M states in seconds")


if __name__ == "__main__":
    main()
