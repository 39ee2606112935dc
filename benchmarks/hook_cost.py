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

``--compare-with DIR`` measures the Crux in ``DIR`` too (an importable
``crux_dask`` package, as ``overhead.py`` takes it), each run in a process of
its own, the two versions alternating, and prints each kind's cost in both and
their ratio: a change to a hook, measured against the code before it.

Usage: ``python benchmarks/hook_cost.py [--tasks N] [--repeats N] [--compare-with DIR]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
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


def medians(runs: list[tuple[Timings, float]], cost: float
            ) -> tuple[dict[tuple[str, str, str], tuple[float, float]], float]:
    """For each kind of transition, the median calls and net CPU seconds over ``runs``
    (``cost`` taken off each call); and the median CPU seconds of the process."""
    kinds = {kind for timings, _ in runs for kind in timings}
    table = {}
    for kind in kinds:
        entries = [t.get(kind, [0, 0.0]) for t, _ in runs]
        table[kind] = (statistics.median(n for n, _ in entries),
                       statistics.median(max(sec - n * cost, 0.0) for n, sec in entries))
    return table, statistics.median(p for _, p in runs)


def measured_apart(tasks: int, other: Path | None) -> tuple[Timings, float]:
    """:func:`measure` in a process of its own, of the Crux in ``other`` if given."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    with tempfile.TemporaryDirectory() as workdir:
        if other is not None:  # ahead of an editable install's own finder
            site = Path(workdir)
            (site / "sitecustomize.py").write_text(overhead._DROP_EDITABLE_FINDER)
            env["PYTHONPATH"] = os.pathsep.join(
                [str(site), str(other), *filter(None, [os.environ.get("PYTHONPATH")])])
        out = subprocess.run([sys.executable, __file__, "--one", "--tasks", str(tasks)],
                             env=env, cwd=workdir, check=True, capture_output=True,
                             text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {tuple(k.split("|")): v for k, v in result["timings"].items()}, result["process"]


def print_table(table: dict, process: float, cost: float, tasks: int, repeats: int) -> None:
    print(f"{tasks:,} tiny tasks, a scheduler and 2 workers of one thread in one "
          f"process; medians of {repeats} runs; timing a call costs "
          f"{cost * 1e6:.2f} µs, taken off")
    print(f"  {'hook':<10} {'transition':<26} {'calls':>7} {'µs a call':>10} {'ms in all':>10}")
    for (side, start, finish), (calls, seconds) in sorted(
            table.items(), key=lambda item: -item[1][1]):
        per_call = seconds / calls * 1e6 if calls else 0.0
        print(f"  {side:<10} {start + ' -> ' + finish:<26} {calls:>7.0f} "
              f"{per_call:>10.2f} {seconds * 1e3:>10.2f}")
    for side in ("scheduler", "worker"):
        seconds = sum(sec for kind, (_, sec) in table.items() if kind[0] == side)
        print(f"  {side} hooks in all: {seconds * 1e3:.1f} ms")
    total = sum(sec for _, sec in table.values())
    print(f"  all hooks: {total * 1e3:.1f} ms = {total / process:.2%} of the process's "
          f"{process:.2f} CPU s (the scheduler's, the workers' and the client's)")


def print_comparison(this: dict, other: dict, cost: float, tasks: int,
                     repeats: int) -> None:
    print(f"{tasks:,} tiny tasks; medians of {repeats} runs of each version, alternating; "
          f"timing a call costs {cost * 1e6:.2f} µs, taken off")
    print(f"  {'hook':<10} {'transition':<26} {'µs a call':>10} {'other':>8} {'/ other':>8}")
    for kind in sorted(this, key=lambda k: -this[k][1]):
        calls, seconds = this[kind]
        other_calls, other_seconds = other.get(kind, (0, 0.0))
        mine = seconds / calls * 1e6 if calls else 0.0
        theirs = other_seconds / other_calls * 1e6 if other_calls else 0.0
        ratio = f"{mine / theirs:.3f}" if theirs else "-"
        side, start, finish = kind
        print(f"  {side:<10} {start + ' -> ' + finish:<26} {mine:>10.2f} {theirs:>8.2f} "
              f"{ratio:>8}")
    for side in ("scheduler", "worker"):
        mine = sum(sec for kind, (_, sec) in this.items() if kind[0] == side)
        theirs = sum(sec for kind, (_, sec) in other.items() if kind[0] == side)
        print(f"  {side} hooks in all: {mine * 1e3:.1f} ms, other {theirs * 1e3:.1f} ms"
              + (f" ({mine / theirs:.3f})" if theirs else ""))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-with", type=Path, default=None)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # one run, for a parent process: its timings as JSON
        timings, process = measure(args.tasks)
        print(json.dumps({"timings": {"|".join(k): v for k, v in timings.items()},
                          "process": process}))
        return
    cost = statistics.median(timing_cost() for _ in range(3))
    if args.compare_with is None:
        table, process = medians([measure(args.tasks) for _ in range(args.repeats)], cost)
        print_table(table, process, cost, args.tasks, args.repeats)
        return
    runs: dict[str, list[tuple[Timings, float]]] = {"this": [], "other": []}
    for i in range(2 * args.repeats):
        version = ("this", "other")[i % 2] if i // 2 % 2 == 0 else ("other", "this")[i % 2]
        runs[version].append(measured_apart(
            args.tasks, args.compare_with.resolve() if version == "other" else None))
    this, _ = medians(runs["this"], cost)
    other, _ = medians(runs["other"], cost)
    print_comparison(this, other, cost, args.tasks, args.repeats)


if __name__ == "__main__":
    main()
