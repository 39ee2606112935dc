"""Where the critical path's time goes, with and without causes besides data.

Real workloads built by Dask's own collections run on a LocalCluster of 2
worker processes × 2 threads with Crux attached, among them four of
distributed's P2P shuffles (a dataframe shuffle, a groupby, a hash join and
an array rechunk), whose shards are data states of their own.  For each, the recorded
graph's observed critical path is printed twice, measured in the same run:

* **data only**: the graph read back without its causes and moments (what the
  path said before they were recorded): the time before each operation is
  ``wait``;
* **with causes**: the walk follows freed threads and queue slots too, and
  the time before each operation is ``scheduling`` or ``queued`` where its
  moments were recorded.

with the path's length, the share of each category and the number of causes
in the graph.  The target: unexplained ``wait`` at most 10 % of the path.

Usage: ``python benchmarks/causes.py [--scale N]``
"""

from __future__ import annotations

import argparse
import operator
import time

import dask
import dask.array as da
import dask.bag as db
import dask.datasets
from distributed import Client, LocalCluster

import crux_dask
from crux_dask import PAG
from crux_dask.path import CATEGORIES


def inc(x: int) -> int:
    time.sleep(0.01)
    return x + 1


def sleep(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i


def workloads(scale: int) -> dict:
    def matmul():
        x = da.random.random((2000 * scale, 2000 * scale), chunks=(500 * scale, 500 * scale))
        return (x @ x.T).sum()

    def rechunk():
        x = da.random.random((3000 * scale, 3000 * scale), chunks=(300 * scale, 3000 * scale))
        return x.T.rechunk((3000 * scale, 300 * scale)).sum()

    def foldby():
        bag = db.from_sequence(range(50_000 * scale), npartitions=16)
        return bag.foldby(lambda x: x % 10, lambda a, x: a + x, 0, lambda a, b: a + b, 0)

    def tree():
        layer = [dask.delayed(inc)(i) for i in range(64 * scale)]
        while len(layer) > 1:
            layer = [dask.delayed(operator.add)(a, b) for a, b in zip(layer[::2], layer[1::2])]
        return layer[0]

    def queued():
        parts = [dask.delayed(sleep)(i, 0.05) for i in range(40 * scale)]
        return dask.delayed(sum)(parts)

    def frame(seed: int = 1, freq: str = "1s"):
        return dask.datasets.timeseries(start="2000-01-01", end=f"2000-01-{1 + 8 * scale:02d}",
                                        freq=freq, partition_freq="1D", seed=seed)

    def p2p_shuffle():
        return frame().shuffle("id", shuffle_method="p2p").x.sum()

    def p2p_groupby():
        return frame().groupby("name").x.mean(split_out=4, shuffle_method="p2p")

    def p2p_join():
        left, right = frame().reset_index(), frame(2, "10s").reset_index()
        return left.merge(right, on="timestamp", shuffle_method="p2p").size

    def p2p_rechunk():
        x = da.random.random((3000 * scale, 3000 * scale), chunks=(300 * scale, 3000 * scale))
        return x.rechunk((3000 * scale, 300 * scale), method="p2p").sum()

    return {"array matmul": matmul, "array rechunk": rechunk, "bag foldby": foldby,
            "delayed tree": tree, "40 sleeps of 50 ms": queued,
            "p2p dataframe shuffle": p2p_shuffle, "p2p groupby": p2p_groupby,
            "p2p hash join": p2p_join, "p2p array rechunk": p2p_rechunk}


def shares(path) -> str:
    length = path.length or 1.0
    return " ".join(f"{c} {path.breakdown[c] / length:6.1%}" for c in CATEGORIES
                    if c not in ("delete",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1)
    args = parser.parse_args()
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        dask.compute(workloads(1)["delayed tree"]())  # workers warm up
        print(f"{'workload':<22}{'walk':<14}{'path':>8}{'steps':>7}{'causes':>8}  shares")
        for name, make in workloads(args.scale).items():
            started = time.perf_counter()
            dask.compute(make())
            makespan = time.perf_counter() - started
            pag = crux_dask.get_pag(client)
            data_only = PAG.from_frames(pag.states, pag.mutations)
            for walk, graph in (("data only", data_only), ("with causes", pag)):
                path = graph.wcp()
                n_causes = len(graph.causes) if graph is pag else 0
                print(f"{name:<22}{walk:<14}{path.length:8.3f}{len(path):7d}{n_causes:8d}  "
                      f"{shares(path)}")
            wait = pag.wcp().breakdown["wait"] / (pag.wcp().length or 1.0)
            print(f"{'':<22}makespan {makespan:.3f} s; unexplained wait {wait:.1%} "
                  f"[target <= 10%]")


if __name__ == "__main__":
    main()
