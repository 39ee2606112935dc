"""The share of the scheduler's and the workers' Python time spent in Crux's own code.

CPU seconds measured side by side (``overhead.py``) hold everything Crux
costs, its effects on distributed's own work included, but on a small shared
machine they vary by more than the few per cent to be told apart.  This
measures the direct part alone, in one run: a sampling profiler (py-spy,
``pip install py-spy``) takes the stack of the thread holding the
interpreter's lock, ``--rate`` times a second, in the scheduler and in each
worker while they run :func:`overhead.run_tiny`'s graph of tiny tasks, or
with ``--workload array`` :func:`overhead.run_array` ``--times`` times (with
Crux preloaded, started as ``overhead.py`` starts them); a sample counts as
Crux's if any frame of its stack is in Crux's code.  The same is done with
Dask's ``TaskStreamPlugin`` instead, whose share is that of its module.

What it leaves out: work distributed does because of Crux (serializing what
the mark a worker adds to a task's metadata, collecting Crux's garbage) and what
Crux's graph process, on another core, takes from the machine.  Time spent
without the lock (in system calls, waiting) is not sampled: the shares are
of the time the process ran Python.

A share is a ratio of samples of the same process and run, so it hardly
moves with how fast the machine runs that minute, where CPU seconds measured
side by side vary by several per cent from round to round.
``--compare-with DIR`` measures the Crux in ``DIR`` (an importable ``crux_dask``
package, as ``overhead.py`` takes it) too, ``--repeats`` times, interleaved with
this one, and prints the medians of both.

Usage: ``python benchmarks/own_share.py [--workload tiny|array] [--tasks N]
[--array N] [--times N] [--rate HZ] [--repeats N] [--compare-with DIR]``
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import cloudpickle
from distributed import Client

sys.path.insert(0, str(Path(__file__).parent))
import overhead

# The functions overhead.py runs on the cluster go by value: the scheduler and the
# workers do not import it.
cloudpickle.register_pickle_by_value(overhead)

#: Functions printed per process, most samples first.
SHOWN = 5


def own_directories(config: str, other: Path | None = None) -> list[str]:
    """Where the code of ``config`` is: Crux's packages (those in ``other`` for
    ``crux-other``), or Dask's task stream module."""
    if config == "task-stream":
        from distributed.diagnostics import task_stream

        return [task_stream.__file__]
    if config == "crux-other":
        package = Path(other, "crux_dask").resolve()
        return [f"{package}/", f"{package}/plugins/", f"{package}/dashboard/"]
    import crux_dask
    import crux_dask.dashboard
    import crux_dask.plugins

    return [str(Path(module.__file__).parent) + "/"
            for module in (crux_dask, crux_dask.plugins, crux_dask.dashboard)]


def read_samples(path: Path, own: list[str]) -> tuple[int, int, collections.Counter]:
    """Samples in all, those with a frame in ``own``, and the outermost such frame's
    function of each (with the function that called it)."""
    total = mine = 0
    where: collections.Counter = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        frames = stack.split(";")
        for depth, frame in enumerate(frames):
            if any(f"({place}" in frame for place in own):
                mine += int(count)
                caller = frames[depth - 1].split(" (")[0] if depth else "-"
                where[f"{frame.split(' (')[0]} <- {caller}"] += int(count)
                break
    return total, mine, where


def workload(args: argparse.Namespace) -> tuple[str, Callable[[Client], None],
                                                 Callable[[Client], None]]:
    """What is run: its description, the sampled run and a warm-up run."""
    if args.workload == "array":
        def run(client: Client) -> None:
            for _ in range(args.times):
                overhead.run_array(client, args.array)

        return (f"{args.times} x array {args.array} x {args.array} in 20 x 20 chunks",
                run, lambda client: overhead.run_array(client, args.array))
    return (f"{args.tasks:,} tiny tasks", lambda client: overhead.run_tiny(client, args.tasks),
            lambda client: overhead.run_tiny(client, args.tasks // 4))


def measure(config: str, work: tuple[str, Callable, Callable], rate: int, py_spy: str,
            other: Path | None = None) -> dict[str, float]:
    """Run ``work`` on a cluster of ``config``, sampled; print each process's
    share and where it went, and return the shares (per cent) by process."""
    own = own_directories(config, other)
    shares = {}
    with tempfile.TemporaryDirectory() as directory:
        workdir = Path(directory)
        cluster = overhead.Cluster(config, workdir, other=other)
        try:
            cluster.settle()
            work[2](cluster.client)  # warm: imports, first connections
            cluster.settle()
            processes = {"scheduler": cluster.scheduler.pid,
                         **{f"worker {i}": w.pid for i, w in enumerate(cluster.workers)}}
            samplers = {name: subprocess.Popen(
                [py_spy, "record", "--pid", str(pid), "--rate", str(rate), "--gil",
                 "--nonblocking", "--full-filenames", "--format", "raw",
                 "-o", str(workdir / f"{pid}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for name, pid in processes.items()}
            work[1](cluster.client)
            cluster.settle()
            for sampler in samplers.values():
                sampler.send_signal(signal.SIGINT)
            for sampler in samplers.values():
                sampler.wait(timeout=60)
            for name, pid in processes.items():
                total, mine, where = read_samples(workdir / f"{pid}.txt", own)
                shares[name] = 100 * mine / max(total, 1)
                print(f"  {config:<12} {name:<9} {mine:5d} of {total:6d} samples = "
                      f"{100 * mine / max(total, 1):5.2f} %")
                for function, count in where.most_common(SHOWN):
                    print(f"      {count:5d}  {function}")
        finally:
            cluster.close()
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("tiny", "array"), default="tiny")
    parser.add_argument("--tasks", type=int, default=9000, help="tiny tasks (about)")
    parser.add_argument("--array", type=int, default=4000, help="side of the array")
    parser.add_argument("--times", type=int, default=5, help="array runs sampled")
    parser.add_argument("--rate", type=int, default=500, help="samples a second")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--compare-with", type=Path, default=None, metavar="DIR",
                        help="another version of Crux: an importable crux_dask in DIR")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if py_spy is None:
        raise SystemExit("this needs py-spy: pip install py-spy")
    work = workload(args)
    print(f"{work[0]}, 2 worker processes of one thread; samples of the thread "
          f"holding the interpreter's lock, {args.rate} a second:")
    configs = ("crux", "crux-other") if args.compare_with else ("crux",)
    shares: dict[str, list[dict[str, float]]] = {config: [] for config in configs}
    for _ in range(args.repeats):
        for config in configs:
            shares[config].append(
                measure(config, work, args.rate, py_spy, args.compare_with))
    measure("task-stream", work, args.rate, py_spy)
    if args.repeats > 1 or args.compare_with:
        print(f"medians of {args.repeats} runs (per cent of each process's samples):")
        for config, runs in shares.items():
            workers = [statistics.median(run[name] for name in run if name != "scheduler")
                       for run in runs]
            scheduler = [run["scheduler"] for run in runs]
            print(f"  {config:<12} scheduler {statistics.median(scheduler):5.2f} %  "
                  f"workers {statistics.median(workers):5.2f} %  (each run: scheduler "
                  + " ".join(f"{share:.2f}" for share in scheduler) + ", workers "
                  + " ".join(f"{share:.2f}" for share in workers) + ")")


if __name__ == "__main__":
    main()
