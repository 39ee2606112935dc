"""How well the what-if at the group's median predicts a run without the hot key.

A frame where one key holds half the rows is shuffled by key into four
partitions, each visited in proportion to its rows (``tests/test_groups.py``'s
``walked``); the partition of the hot key holds five times the rows of the
others.  Each round records a run of it on a fresh LocalCluster of 2 workers
× 4 threads (every walk can run at once wherever its partition is, as in the
test), predicts with ``pag.what_if(stragglers="median")``, then runs, on
the same cluster and interleaved, the same data without the hot key and the
recorded data again.  Printed per round and as medians: the change predicted
(predicted makespan over the unchanged replay's), with the run's load (so the
replay shares the host's cores, :mod:`crux_dask.machine`) and without it, the
change measured (median of the runs without the hot key over the median of
those with it), and the errors.

Usage: ``python benchmarks/stragglers.py [--rounds N] [--runs N]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from distributed import Client, LocalCluster

import crux_dask

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_groups import walked


def round_(runs: int) -> tuple[float, float, float]:
    """One recording and its interleaved re-runs: the change predicted with the load and
    without, and the change measured."""
    with LocalCluster(n_workers=2, threads_per_worker=4, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        walked(hot=False).compute()  # warm, as the runs it is compared with are
        crux_dask.attach(client)
        walked(hot=True).compute()
        pag = crux_dask.get_pag(client)
        predicted = [pag.what_if(stragglers="median", load=load)
                     for load in (crux_dask.get_load(client), None)]
        walls: dict[bool, list[float]] = {True: [], False: []}
        for hot in (False, True) * runs:
            began = time.perf_counter()
            walked(hot=hot).compute()
            walls[hot].append(time.perf_counter() - began)
    return (*(p.makespan / p.baseline for p in predicted),
            statistics.median(walls[False]) / statistics.median(walls[True]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    errors: dict[str, list[float]] = {"with the load": [], "without": []}
    for i in range(args.rounds):
        *predicted, measured = round_(args.runs)
        for found, change in zip(errors.values(), predicted):
            found.append(change / measured - 1)
        print(f"round {i}: measured x{measured:.2f}; predicted with the load "
              f"x{predicted[0]:.2f} ({errors['with the load'][-1]:+.1%}), without "
              f"x{predicted[1]:.2f} ({errors['without'][-1]:+.1%})")
    for name, found in errors.items():
        print(f"{name}: median error {statistics.median(found):+.1%}, median absolute "
              f"error {statistics.median(map(abs, found)):.1%}   [target within 15 %]")


if __name__ == "__main__":
    main()
