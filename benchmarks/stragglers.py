"""How well the what-if at the group's median predicts a run without the hot key.

A frame where one key holds half the rows is shuffled by key into four
partitions, each visited in proportion to its rows (``tests/test_groups.py``'s
``walked``); the partition of the hot key holds five times the rows of the
others.  Each round records a run of it on a fresh LocalCluster of 2 workers
× 1 thread, predicts with ``pag.what_if(stragglers="median")``, then runs, on
the same cluster and interleaved, the same data without the hot key and the
recorded data again.  Printed per round and as medians: the change predicted
(predicted makespan over the unchanged replay's), the change measured
(median of the runs without the hot key over the median of those with it),
and the error.

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


def round_(runs: int) -> tuple[float, float]:
    """One recording and its interleaved re-runs: the change predicted and measured."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        walked(hot=False).compute()  # warm, as the runs it is compared with are
        crux_dask.attach(client)
        walked(hot=True).compute()
        predicted = crux_dask.get_pag(client).what_if(stragglers="median")
        walls: dict[bool, list[float]] = {True: [], False: []}
        for hot in (False, True) * runs:
            began = time.perf_counter()
            walked(hot=hot).compute()
            walls[hot].append(time.perf_counter() - began)
    return (predicted.makespan / predicted.baseline,
            statistics.median(walls[False]) / statistics.median(walls[True]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    errors = []
    for i in range(args.rounds):
        predicted, measured = round_(args.runs)
        errors.append(predicted / measured - 1)
        print(f"round {i}: change predicted x{predicted:.2f}, measured x{measured:.2f}, "
              f"error {errors[-1]:+.1%}")
    print(f"median error {statistics.median(errors):+.1%}, "
          f"median absolute error {statistics.median(map(abs, errors)):.1%}   "
          "[target within 15 %]")


if __name__ == "__main__":
    main()
