"""What each of Crux's transition hooks costs, call by call, where it runs.

``overhead.py`` measures all that Crux costs, in CPU seconds side by side, which
vary by a few per cent from round to round; ``own_share.py`` the share of
samples that fall in Crux's frames.  This measures the hooks alone, for each
kind of transition: a cluster in this process (a scheduler
and two workers of one thread, Crux attached) runs ``overhead.py``'s graph of
tiny tasks, and every call of the scheduler's and the workers' transition hook
is timed with the CPU clock of its thread (:func:`time.thread_time`: what other
threads and processes run meanwhile is not counted).  What reading the clock
and the timing itself cost, measured the same way around a hook that does
nothing, is taken off each call.  The garbage collector is off meanwhile, so
that no hook is charged with a collection its allocations happened to start.

A hook costs several times here what the same code costs in a loop
(``timeit``): between two calls distributed's own work takes its code and data
out of the processor's caches.  The cost of a call moves with the machine's
load, as any CPU time does (by a third between two runs while other work ran);
the hooks' share of the process's CPU moves much less: compare shares, or runs
made one after the other on a quiet machine.

Usage: ``python benchmarks/hook_cost.py [--tasks N] [--repeats N]``
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster

import crux_dask
from crux_dask.plugins.scheduler import CruxSchedulerPlugin
from crux_dask.plugins.worker import CruxWorkerPlugin

sys.path.insert(0, str(Path(__file__).parent))
import overhead

#: CPU seconds and calls of each hook, by (side, start, finish).
Timings = dict[tuple[str, str, str], list[float]]


def timed(hook: Callable[..., None], side: str, timings: Timings) -> Callable[..., None]:
    """``hook``, counting the calls and the CPU seconds of each kind of transition."""
    clock = time.thread_time

    def transition(self: Any, key: Any, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        began = clock()
        hook(self, key, start, finish, *args, **kwargs)
        entry = timings[side, start, finish]
        entry[0] += 1
        entry[1] += clock() - began

    return transition


def timing_cost(calls: int = 100_000) -> float:
    """CPU seconds that timing a call of a hook that does nothing adds to it."""
    timings: Timings = defaultdict(lambda: [0, 0.0])

    class Nothing:
        transition = timed(lambda self, *args, **kwargs: None, "-", timings)

    nothing = Nothing()
    for _ in range(calls):
        nothing.transition("x", "memory", "released", stimulus_id="s", worker="w")
    count, seconds = timings["-", "memory", "released"]
    return seconds / count


def measure(tasks: int) -> tuple[Timings, float]:
    """The hooks' timings and the process's CPU seconds for one run of ``tasks``."""
    timings: Timings = defaultdict(lambda: [0, 0.0])
    originals = CruxSchedulerPlugin.transition, CruxWorkerPlugin.transition
    CruxSchedulerPlugin.transition = timed(originals[0], "scheduler", timings)
    CruxWorkerPlugin.transition = timed(originals[1], "worker", timings)
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            crux_dask.attach(client)
            overhead.run_tiny(client, 300)  # warm up
            crux_dask.flush(client)
            timings.clear()
            gc.collect()
            gc.disable()
            try:
                began = time.process_time()
                overhead.run_tiny(client, tasks)
                crux_dask.flush(client)
                process = time.process_time() - began
            finally:
                gc.enable()
    finally:
        CruxSchedulerPlugin.transition, CruxWorkerPlugin.transition = originals
    return dict(timings), process


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    cost = statistics.median(timing_cost() for _ in range(3))
    runs = [measure(args.tasks) for _ in range(args.repeats)]
    kinds = sorted({kind for timings, _ in runs for kind in timings})
    net = {kind: [max(t[kind][1] - t[kind][0] * cost, 0.0) if kind in t else 0.0
                  for t, _ in runs] for kind in kinds}
    calls = {kind: statistics.median(t.get(kind, [0, 0.0])[0] for t, _ in runs)
             for kind in kinds}
    process = statistics.median(p for _, p in runs)
    print(f"{args.tasks:,} tiny tasks, a scheduler and 2 workers of one thread in one "
          f"process; medians of {args.repeats} runs; timing a call costs "
          f"{cost * 1e6:.2f} µs, taken off")
    print(f"  {'hook':<10} {'transition':<26} {'calls':>7} {'µs a call':>10} {'ms in all':>10}")
    total = 0.0
    for kind in sorted(kinds, key=lambda k: -statistics.median(net[k])):
        seconds = statistics.median(net[kind])
        total += seconds
        side, start, finish = kind
        per_call = seconds / calls[kind] * 1e6 if calls[kind] else 0.0
        print(f"  {side:<10} {start + ' -> ' + finish:<26} {calls[kind]:>7.0f} "
              f"{per_call:>10.2f} {seconds * 1e3:>10.2f}")
    for side in ("scheduler", "worker"):
        seconds = sum(statistics.median(net[k]) for k in kinds if k[0] == side)
        print(f"  {side} hooks in all: {seconds * 1e3:.1f} ms")
    print(f"  all hooks: {total * 1e3:.1f} ms = {total / process:.2%} of the process's "
          f"{process:.2f} CPU s (the scheduler's, the workers' and the client's)")


if __name__ == "__main__":
    main()
