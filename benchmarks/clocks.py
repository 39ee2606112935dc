"""How far each worker's estimate of the scheduler's clock is from the truth.

On one machine every process reads the same clock, so the true offset from a
worker's clock to the scheduler's is 0 and any estimate's error is the estimate
itself.  This runs Dask's own collections (a dask.array matmul, and tasks that
hold the GIL) on a LocalCluster of worker processes, optionally beside processes
that burn CPU as other work on a shared machine would, and every 50 ms reads
each worker's two estimates: distributed's (``Worker.scheduler_delay``, from
its latest heartbeat), which Dask's task stream is in, and Crux's (from the
round trips of its sends, :mod:`crux_dask.plugins.clock`), which Crux's times
are in, with the bound Crux gives it.  Side by side, from the same readings.

Usage: ``python benchmarks/clocks.py [--rounds N] [--load N]``
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import threading

import dask.array as da
import numpy as np
from distributed import Client, LocalCluster

import crux_dask
from crux_dask.plugins.protocol import PLUGIN_NAME


def hold_the_gil(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def estimates(dask_worker) -> tuple[float, float, float]:
    """distributed's offset, Crux's, and Crux's bound, in seconds."""
    clock = dask_worker.plugins[PLUGIN_NAME].clock
    return dask_worker.scheduler_delay, clock.offset, clock.bound


def run(rounds: int) -> list[tuple[float, float, float]]:
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        readings: list[tuple[float, float, float]] = []
        done = threading.Event()

        def read() -> None:
            while not done.wait(0.05):
                readings.extend(client.run(estimates).values())

        reader = threading.Thread(target=read)
        reader.start()
        try:
            for r in range(rounds):
                client.gather(client.map(hold_the_gil, [2_000_000 + 10 * r + i
                                                        for i in range(40)]))
                x = da.random.random((4000, 4000), chunks=500)
                (x @ x.T).sum().compute()
        finally:
            done.set()
            reader.join()
        return readings


def summary(errors: np.ndarray) -> str:
    errors = np.abs(errors) * 1000
    p50, p99 = np.percentile(errors, [50, 99])
    return f"|error| median {p50:6.2f} ms, 99th {p99:6.2f} ms, largest {errors.max():6.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=0,
                        help="processes burning CPU beside the cluster (default: 0)")
    args = parser.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.load)]
    try:
        readings = np.array(run(args.rounds))
    finally:
        for burner in burners:
            burner.kill()
    distributed_, crux, bound = readings.T
    bounded = np.isfinite(bound)
    print(f"{len(readings)} readings of 2 workers, {args.rounds} rounds, "
          f"{args.load} processes burning CPU beside them; the true offset is 0")
    print(f"  distributed (its latest heartbeat): {summary(distributed_)}")
    print(f"  Crux (its round trips):             {summary(crux)}")
    if bounded.any():
        print(f"  Crux's bound: median {np.median(bound[bounded]) * 1000:.2f} ms; the "
              f"truth within it in {np.mean(np.abs(crux[bounded]) <= bound[bounded]):.1%} "
              f"of readings; no round trip yet in {np.mean(~bounded):.1%}")
    ratio = np.abs(distributed_).max() / max(np.abs(crux).max(), math.ulp(1.0))
    print(f"  largest error, distributed / Crux: {ratio:.1f}")


if __name__ == "__main__":
    main()
