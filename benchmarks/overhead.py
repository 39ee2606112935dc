"""What recording costs a running workflow.

Two graphs on a LocalCluster of 2 worker processes (1 thread each): 20,000 tiny
tasks, and 2,000 tasks of about 10 ms.  Each repetition runs, in rotating
order, a fresh cluster with nothing attached, with Crux attached, and with
Dask's own ``TaskStreamPlugin``; the median makespans are compared side by
side, measured in this run.

Usage: ``python benchmarks/overhead.py [--repeats N] [--tiny N] [--busy N]``
"""

from __future__ import annotations

import argparse
import statistics
import time

from distributed import Client, LocalCluster

import crux_dask

VARIANTS = ("none", "crux", "task-stream")


def tiny(x: int) -> int:
    return x + 1


def busy(x: int) -> int:
    end = time.perf_counter() + 0.010
    while time.perf_counter() < end:
        pass
    return x + 1


def total(values: list[int]) -> int:
    return sum(values)


def add_task_stream(dask_scheduler) -> None:
    from distributed.diagnostics.task_stream import TaskStreamPlugin

    dask_scheduler.add_plugin(TaskStreamPlugin(dask_scheduler))


#: The scheduler's own accounting of Crux's work, per run with Crux attached.
SCHEDULER_COST: list[tuple[int, float]] = []


def makespan(variant: str, func, n: int) -> float:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        if variant == "crux":
            crux_dask.attach(client)
        elif variant == "task-stream":
            client.run_on_scheduler(add_task_stream)
        client.submit(tiny, 0).result()  # warm up the workers
        started = time.perf_counter()
        parts = client.map(func, range(n), pure=False)
        client.submit(total, parts).result()
        elapsed = time.perf_counter() - started
        if variant == "crux":
            stats = crux_dask.get_stats(client)
            if stats["events_failed"] or stats["hook_errors"]:
                raise RuntimeError(f"Crux reported errors: {stats}")
            crux_dask.flush(client)
            stats = crux_dask.get_stats(client)
            SCHEDULER_COST.append((stats["events_received"],
                                   stats["seconds_receiving"] + stats["seconds_applying"]))
    return elapsed


def compare(name: str, func, n: int, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    SCHEDULER_COST.clear()
    for i in range(repeats):
        order = VARIANTS[i % 3:] + VARIANTS[: i % 3]
        for variant in order:
            times[variant].append(makespan(variant, func, n))
    medians = {v: statistics.median(t) for v, t in times.items()}
    base = medians["none"]
    crux_cost = medians["crux"] - base
    stream_cost = medians["task-stream"] - base
    print(f"{name}: median makespan none {base:.2f} s, crux {medians['crux']:.2f} s, "
          f"task-stream {medians['task-stream']:.2f} s ({repeats} runs each)")
    print(f"  crux / none = {medians['crux'] / base:.3f}   "
          f"task-stream / none = {medians['task-stream'] / base:.3f}   "
          f"crux cost / task-stream cost = "
          f"{crux_cost / stream_cost if stream_cost > 0 else float('nan'):.2f}")
    events = sum(e for e, _ in SCHEDULER_COST)
    seconds = sum(s for _, s in SCHEDULER_COST)
    print(f"  scheduler time on Crux: {seconds / events * 1e6:.2f} us per event received "
          f"({events / seconds:,.0f} events per second of it; {events // repeats:,} events "
          "a run)")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", type=int, default=20_000)
    parser.add_argument("--busy", type=int, default=2_000)
    args = parser.parse_args()
    compare(f"{args.tiny:,} tiny tasks", tiny, args.tiny, args.repeats)
    compare(f"{args.busy:,} tasks of 10 ms", busy, args.busy, args.repeats)


if __name__ == "__main__":
    main()
