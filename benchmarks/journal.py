"""What the graph process's journal costs, and how long a killed graph process takes to resume.

A LocalCluster (two worker processes, one thread each) runs ``--tasks`` tiny
tasks with Crux attached.  Printed: the events recorded, the journal's bytes
on disk (and per event), the graph process's CPU seconds, then how long a
graph process killed with SIGKILL takes until the one that resumes from the
journal has every state again (its first answer to a drain), beside the
states it rebuilt.  Run twice with ``--repeats`` for the spread.

    python benchmarks/journal.py --tasks 20000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path

import dask
import dask.bag as db
from distributed import Client, LocalCluster
from distributed.utils_test import poll_for

import crux_dask
from crux_dask.plugins.worker import flush_worker


def journal_bytes(spool_dir: str) -> int:
    return sum(p.stat().st_size for p in (Path(spool_dir) / "journal").rglob("*") if p.is_file())


def one(tasks: int, spool_dir: str) -> dict[str, float]:
    with dask.config.set({"crux-dask.spool-dir": spool_dir}), \
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        crux_dask.attach(client)
        host = cluster.scheduler.plugins["crux"].host
        db.range(tasks, npartitions=tasks).map(lambda x: x + 1).sum().compute()
        client.run(flush_worker)
        crux_dask.flush(client)
        stats = crux_dask.get_stats(client)
        states = stats["states"]
        figures = {"events": stats["events_received"], "states": states,
                   "journal_bytes": journal_bytes(spool_dir),
                   "child_cpu": stats["graph_process"]["cpu_seconds"]}
        pid = host.remote["pid"]
        started = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        poll_for(lambda: host.restarts == 1, timeout=60)
        crux_dask.flush(client)
        figures["resume_seconds"] = time.perf_counter() - started
        figures["states_after"] = crux_dask.get_stats(client)["states"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'events':>8} {'states':>8} {'journal MB':>11} {'B/event':>8} "
          f"{'child CPU s':>12} {'resume s':>9} {'states again':>13}")
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="crux-journal-") as spool:
            f = one(args.tasks, spool)
        print(f"{f['events']:>8} {f['states']:>8} {f['journal_bytes'] / 1e6:>11.2f} "
              f"{f['journal_bytes'] / f['events']:>8.1f} {f['child_cpu']:>12.2f} "
              f"{f['resume_seconds']:>9.2f} {f['states_after']:>13}")


if __name__ == "__main__":
    main()
