"""What recording the files tasks open costs a task that opens many of them.

Two LocalClusters of one worker process × one thread run side by side, one
without Crux and one with it (files recorded, the default).  In interleaved
rounds, each runs the same task: open and read ``--files`` small files.  The
task times itself (the cost of noting each open is paid in its thread); the round's
wall time is how much later its result reaches the client (the completion is
sent before the files' sizes are taken: a task that opened this many has
them taken in a thread of the worker, and sent after it).  Each round ends
when everything is recorded (``crux_dask.flush``, not timed), so that one
round's sizing never overlaps the next round's task; the worker process's
CPU seconds over the round, that flush included, are the whole cost.
Medians are printed side by side, with their ratio.  The target: the task
at most 5 % slower with Crux.

Usage: ``python benchmarks/files.py [--files N] [--rounds R]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import psutil
from distributed import Client, LocalCluster

import crux_dask


def read_all(paths: list[str]) -> tuple[float, int]:
    """Open and read every file; the seconds it took and the bytes read."""
    started = time.perf_counter()
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            total += len(f.read())
    return time.perf_counter() - started, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as directory:
        paths = []
        for i in range(args.files):
            path = Path(directory) / f"part-{i:05d}.txt"
            path.write_bytes(b"x" * 100)
            paths.append(str(path))
        clusters = {name: LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                       dashboard_address=":0") for name in ("none", "crux")}
        clients = {name: Client(cluster) for name, cluster in clusters.items()}
        crux_dask.attach(clients["crux"])
        task: dict[str, list[float]] = {name: [] for name in clients}
        wall: dict[str, list[float]] = {name: [] for name in clients}
        cpu: dict[str, list[float]] = {name: [] for name in clients}
        workers = {name: psutil.Process(next(iter(client.run(os.getpid).values())))
                   for name, client in clients.items()}
        try:
            for client in clients.values():  # warm up: imports, the page cache
                client.submit(read_all, paths, pure=False).result()
            for round_ in range(args.rounds):
                order = list(clients) if round_ % 2 == 0 else list(reversed(clients))
                for name in order:
                    before = sum(workers[name].cpu_times()[:2])
                    started = time.perf_counter()
                    seconds, total = clients[name].submit(read_all, paths, pure=False).result()
                    wall[name].append(time.perf_counter() - started)
                    if name == "crux":
                        crux_dask.flush(clients[name])
                    cpu[name].append(sum(workers[name].cpu_times()[:2]) - before)
                    task[name].append(seconds)
                    assert total == 100 * args.files
            pag = crux_dask.get_pag(clients["crux"])
            recorded = int(pag.states["location"].str.startswith("file@").sum())
        finally:
            for client in clients.values():
                client.close()
            for cluster in clusters.values():
                cluster.close()

    print(f"one task opening {args.files:,} files of 100 bytes, {args.rounds} rounds, "
          f"medians (s):")
    print(f"{'':<12}{'no plugin':>12}{'crux':>12}{'crux/none':>12}")
    for label, values in (("task", task), ("round wall", wall), ("worker CPU", cpu)):
        none, crux = statistics.median(values["none"]), statistics.median(values["crux"])
        ratio = f"{crux / none:>12.3f}" if none > 0 else f"{'-':>12}"  # CPU below a tick
        print(f"{label:<12}{none:>12.4f}{crux:>12.4f}{ratio}")
    print(f"file states recorded: {recorded:,} (one per file)")


if __name__ == "__main__":
    main()
