"""What watching costs: CPU seconds of the scheduler and the workers, with and without Crux.

Three configurations side by side: nothing attached (``none``), Dask's own
``TaskStreamPlugin`` on the scheduler (``task-stream``, what the dashboard's
task stream costs), and Crux preloaded on the scheduler and every worker
through dask's configuration (``crux``).  Each round starts, for each
configuration in rotating order, a scheduler and two worker processes of one
thread each (``dask scheduler`` and ``dask worker --no-nanny`` subprocesses,
so that this process -- the client -- is measured in none of them), warms
them up, and runs three workloads:

``tiny``
    about 18,000 tiny tasks in three layers, each task of the upper layers
    reading two of the layer below (so that about half its inputs travel
    between the workers), then a tree sum;
``shuffle``
    a P2P shuffle of a dask.dataframe (``shuffle_method="p2p"``);
``array``
    a dask.array sum of a random array and its transpose (every block of the
    transpose comes from another block, often on the other worker), and a
    reduction of it.

For each workload it records the wall time and the CPU seconds (user +
system, from :func:`psutil.Process.cpu_times`) the scheduler process and the
worker processes spent from just before it was submitted until the cluster
was idle again with every event Crux recorded applied (the other
configurations make the same round trips), and apart from them the CPU seconds
of the processes the scheduler started: Crux's graph process, which builds the
graph, and the fork server it is forked from.  It prints the medians over the
rounds and their ratios to ``none``, the same ratios for the least CPU any
round took (what a configuration costs at least: CPU time grows when other
processes share the cores), and the ratio of each round to the ``none`` run of
the same round.  It also counts the garbage collections the scheduler and
the workers made meanwhile (young and full, and the CPU seconds they took):
counts that vary little from round to round, where CPU seconds vary by a few
per cent.

Target: Crux costs at most +2 % of the scheduler's CPU and +2 % of the
workers' CPU over ``none``.

On a shared machine the same work takes a varying number of CPU seconds: a
fixed loop of pure Python took 0.25-0.27 s most seconds here, and 0.4-0.53 s
in slow spells of one or two seconds.  The variation is one-sided -- spells
only slow the work down -- so the least CPU and the lower quartile of the
rounds are printed besides the medians.  The spells are of one processor:
two such loops run at once, one on each processor, slowed down in different
seconds.  ``--together`` takes them out of the comparison: each round it starts
a cluster of every configuration, binds all their schedulers and workers to the
last processor (the client and Crux's graph process run on the others), and
runs each workload on all the clusters at the same time, so that every
configuration runs through the same spells.  The graph submitted first runs
alone for a moment, and the last to finish runs alone at its end, which moved
a configuration's CPU by up to 3 %: the configurations take each place in
turn, so give ``--repeats`` as a multiple of their number.  With clusters kept
for every round, no plugin came out 1-4 % dearer than both the others in every
round of a run, though every cluster hashes alike (``PYTHONHASHSEED``): what a
cluster costs depends on the cluster too, for its life, so each round starts
new ones.  Sharing the processor, each
runs about as many times slower in wall time as there are configurations, so
costs that come per second (a worker's batch, the scheduler's apply tick)
weigh that much more against those that come per task than in a run alone.

``--apart`` (with ``--together``) binds every scheduler and the client to the
first processor and every worker and Crux's graph process to the last: a
scheduler then shares its processor with no worker, as on a machine of its own,
while the configurations still go through the same spells.  On one processor,
what the workers spend moves what the scheduler spends: plugins whose worker
hook burnt 60 us a task, and whose scheduler hook did nothing, cost the
scheduler +1.9 %.

``--empty`` adds a configuration of plugins whose transition hooks do nothing
(``empty``), on the scheduler and on every worker: what being called for every
transition costs, and what this method of measuring makes of a plugin that
costs nothing else.

``--quiet-hooks`` adds Crux with its transition hooks, on the scheduler and on
every worker, replaced by functions that do nothing (``crux-quiet``):
everything else of Crux runs -- its graph process, the workers' periodic
sends (which still read the data clients gathered from the workers' transfer
logs), the watching of files, spill and shuffles, the dashboard.  With
``--empty``, the rounds split what Crux costs into being called for every
transition (``empty``), the rest of its machinery (``crux-quiet`` over
``empty``) and the work its hooks do (``crux`` over ``crux-quiet``).

``--quiet-worker-hooks`` adds Crux with only the workers' transition hooks
replaced (``crux-scheduler``): no task is reported by its worker, so the
scheduler's hook records each from what the scheduler itself knows (its
compute and transfer intervals, thread, size and inputs), as it does for a task
whose worker has no Crux -- what Crux would cost recording tasks on the
scheduler alone, without the moments only a worker sees (when a task reached
it and when it could run) and the workers' deletes and fetches.

``--compare-with DIR`` adds a configuration, ``crux-other``: Crux
preloaded from another version of its code, an importable ``crux_dask``
package in ``DIR`` (put first on the processes' ``PYTHONPATH``), to compare
two versions of Crux side by side in the same rounds.  ``--other-config KEY=VALUE
...`` runs ``crux-other`` with these dask config settings (this version of
Crux, unless ``--compare-with`` is given too): ``crux-dask.capture.files=False``
measures what recording the files tasks open costs.

Usage: ``python benchmarks/overhead.py [--repeats N] [--tiny N] [--partitions N]
[--rows N] [--array N] [--workloads W ...] [--together] [--empty] [--quiet-hooks]
[--compare-with DIR]
[--other-config KEY=VALUE ...] [--json FILE]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import operator
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import psutil
from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

CONFIGS = ("none", "task-stream", "crux")
#: The configurations added on demand (``--empty``, ``--quiet-hooks``,
#: ``--quiet-worker-hooks``, ``--compare-with``).
EXTRA_CONFIGS = ("empty", "crux-quiet", "crux-scheduler", "crux-other")
WORKLOADS = ("tiny", "shuffle", "array")
TARGET = 1.02

#: The configuration that preloads Crux on the scheduler and every worker.
PRELOAD = {
    "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": '["crux_dask.plugins"]',
    "DASK_DISTRIBUTED__WORKER__PRELOAD": '["crux_dask.plugins"]',
}


# -- workloads --------------------------------------------------------------------
def tiny_graph(n: int) -> tuple[dict, Any]:
    """About ``n`` tiny tasks: three layers of ``n // 3`` and a tree sum of the last.

    Tasks of the second and third layers add two tasks of the layer below, one
    of them far away in the layer, so that many inputs travel between workers.
    Only builtins and ``operator`` functions: nothing is pickled by value.
    """
    width = max(n // 3, 2)
    dsk: dict[Any, Any] = {}
    for i in range(width):
        dsk[("a", i)] = (operator.neg, i)
    for i in range(width):
        dsk[("b", i)] = (operator.add, ("a", i), ("a", (i + 1) % width))
    for i in range(width):
        dsk[("c", i)] = (operator.add, ("b", i), ("b", (i + width // 2) % width))
    level, keys = 0, [("c", i) for i in range(width)]
    while len(keys) > 1:
        parents = []
        for j in range(0, len(keys), 50):
            key = ("s", level, j)
            dsk[key] = (sum, keys[j:j + 50])
            parents.append(key)
        level, keys = level + 1, parents
    return dsk, keys[0]


def run_tiny(client: Client, n: int) -> None:
    dsk, key = tiny_graph(n)
    client.get(dsk, key)


def make_partition(i: int, rows: int) -> Any:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(i)
    return pd.DataFrame({"k": rng.integers(0, 1_000_000, rows), "v": rng.random(rows)})


def partition_digest(df: Any) -> Any:
    import pandas as pd

    # Depends on which rows landed in which partition: the shuffle cannot be skipped.
    return pd.Series([int(df["k"].min()) if len(df) else 0])


def run_shuffle(client: Client, partitions: int, rows: int) -> None:
    import dask.dataframe as dd

    df = dd.from_map(make_partition, range(partitions), rows=rows)
    shuffled = df.shuffle("k", shuffle_method="p2p", npartitions=partitions)
    client.compute(shuffled.map_partitions(partition_digest, meta=(None, "int64")).sum(),
                   sync=True)


def run_array(client: Client, size: int) -> None:
    import dask.array as da

    x = da.random.default_rng(0).random((size, size), chunks=size // 20)
    y = x + x.T
    client.compute((y - y.mean(axis=0)).std(), sync=True)


# -- clusters -----------------------------------------------------------------------
def add_task_stream(dask_scheduler: Any) -> None:
    from distributed.diagnostics.task_stream import TaskStreamPlugin

    dask_scheduler.add_plugin(TaskStreamPlugin(dask_scheduler))


class EmptySchedulerPlugin(SchedulerPlugin):
    """A scheduler plugin whose transition hook does nothing (``--empty``)."""

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        return None


class EmptyWorkerPlugin(WorkerPlugin):
    """A worker plugin whose transition hook does nothing (``--empty``)."""

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        return None


def add_empty(dask_scheduler: Any) -> None:
    dask_scheduler.add_plugin(EmptySchedulerPlugin(), name="empty")


async def add_empty_worker(dask_worker: Any) -> None:
    await dask_worker.plugin_add(EmptyWorkerPlugin(), name="empty")


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """What Crux's transition hooks are replaced by in ``crux-quiet``."""
    return None


def quiet_hooks(dask_scheduler: Any = None, dask_worker: Any = None) -> bool:
    """Replace the transition hook of this process's Crux plugin by :func:`do_nothing`
    (an attribute of the plugin itself, which distributed finds before its method)."""
    server = dask_scheduler if dask_scheduler is not None else dask_worker
    plugin = server.plugins.get("crux")
    if plugin is None:
        return False
    plugin.transition = do_nothing
    return True


def has_plugin(name: str, dask_scheduler: Any = None, dask_worker: Any = None) -> bool:
    server = dask_scheduler if dask_scheduler is not None else dask_worker
    return name in server.plugins


def idle(dask_scheduler: Any) -> bool:
    return not dask_scheduler.tasks


def noop() -> None:
    return None


def count_collections(dask_scheduler: Any = None, dask_worker: Any = None) -> None:
    """Count this process's garbage collections from now on: how many of each
    generation, and the CPU seconds they took (see :func:`collections_so_far`)."""
    import gc
    import time

    if any(getattr(callback, "counts", None) is not None for callback in gc.callbacks):
        return
    counts = {"young": 0, "middle": 0, "full": 0, "seconds": 0.0}
    started = [0.0]
    names = ("young", "middle", "full")

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            counts[names[info["generation"]]] += 1
            counts["seconds"] += time.thread_time() - started[0]

    note.counts = counts  # type: ignore[attr-defined]
    gc.callbacks.append(note)


def collections_so_far(dask_scheduler: Any = None, dask_worker: Any = None
                       ) -> dict[str, float]:
    """The counts of :func:`count_collections` in this process."""
    import gc

    for callback in gc.callbacks:
        counts = getattr(callback, "counts", None)
        if counts is not None:
            return dict(counts)
    return {}


def scheduler_activity(dask_scheduler: Any) -> dict[str, int]:
    """What the scheduler did so far that the timing of the workers can change: its
    transitions, the tasks its work stealing moved, and the batches of messages it sent
    the workers (and the messages in them)."""
    stealing = dask_scheduler.extensions.get("stealing")
    streams = dask_scheduler.stream_comms.values()
    return {"transitions": dask_scheduler.transition_counter,
            "steals": getattr(stealing, "count", 0),
            "batches": sum(stream.batch_count for stream in streams),
            "messages": sum(stream.message_count for stream in streams)}


def worker_activity(dask_worker: Any) -> dict[str, int]:
    """The batches of messages this worker sent the scheduler so far, and the messages in
    them: each batch costs the scheduler a read and a decoding."""
    stream = dask_worker.batched_stream
    return {"batches": stream.batch_count, "messages": stream.message_count}


def counters_so_far(dask_scheduler: Any = None, dask_worker: Any = None) -> dict[str, int]:
    """This process's garbage collections and its work counted so far, in one call
    (``run`` passes a scheduler or a worker as both arguments)."""
    from distributed import Scheduler

    server = dask_scheduler if dask_scheduler is not None else dask_worker
    activity = (scheduler_activity(server) if isinstance(server, Scheduler)
                else worker_activity(server))
    return {**collections_so_far(dask_scheduler, dask_worker), **activity}


#: Run at start-up of the ``crux-other`` processes: forget the finder of an
#: editable install of crux_dask, so that the other version is imported.
_DROP_EDITABLE_FINDER = """import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable___crux_dask")]
"""


class Cluster:
    """A scheduler and worker processes started as subprocesses, so each can be measured.

    Parameters
    ----------
    config : str
        One of :data:`CONFIGS` or :data:`EXTRA_CONFIGS`.
    other : Path, optional
        For ``crux-other``: the folder the other version of ``crux_dask`` is in.
    other_config : dict, optional
        For ``crux-other``: environment variables of dask config settings.
    workdir : Path
        Where the scheduler file and the workers' local directories go.
    n_workers : int
        Worker processes.
    threads : int
        Threads of each worker.
    """

    def __init__(self, config: str, workdir: Path, n_workers: int = 2,
                 other: Path | None = None, other_config: dict[str, str] | None = None,
                 threads: int = 1) -> None:
        self.config = config
        self.crux = config.startswith("crux")
        env = {k: v for k, v in os.environ.items() if k not in PRELOAD}
        if self.crux:
            env.update(PRELOAD)
        if config == "crux-other":
            env.update(other_config or {})
        if config == "crux-other" and other is not None:
            # Ahead of the package installed here, which an editable install
            # would otherwise serve first (a meta path finder of its own).
            site_dir = workdir / "other-site"
            site_dir.mkdir(exist_ok=True)
            (site_dir / "sitecustomize.py").write_text(_DROP_EDITABLE_FINDER)
            env["PYTHONPATH"] = os.pathsep.join(
                [str(site_dir), str(other), *filter(None, [os.environ.get("PYTHONPATH")])])
        env["PYTHONWARNINGS"] = "ignore"
        # The same hashes in every configuration: the order of a set of keys or workers,
        # and so which worker a task goes to, does not differ by configuration.
        env["PYTHONHASHSEED"] = "0"
        # One thread per worker process, numpy's included (a nanny would set these).
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        scheduler_file = workdir / f"scheduler-{config}-{time.time_ns()}.json"
        python = sys.executable
        # Started in the work directory, so that no crux_dask in the current one shadows
        # the version meant.
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.scheduler = subprocess.Popen(
            [python, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", "0", "--dashboard-address", ":0", "--scheduler-file",
             str(scheduler_file)], env=env, cwd=workdir, **quiet)
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            if time.monotonic() > deadline or self.scheduler.poll() is not None:
                self.close()
                raise RuntimeError("the scheduler did not start")
            time.sleep(0.05)
        self.workers = [subprocess.Popen(
            [python, "-m", "distributed.cli.dask_worker", "--scheduler-file",
             str(scheduler_file), "--nthreads", str(threads), "--no-nanny", "--name", f"w{i}",
             "--local-directory", str(workdir / f"w{i}"), "--dashboard-address", ":0"],
            env=env, cwd=workdir, **quiet) for i in range(n_workers)]
        self.client = Client(scheduler_file=str(scheduler_file))
        self.client.wait_for_workers(n_workers, timeout=60)
        if config == "task-stream":
            self.client.run_on_scheduler(add_task_stream)
        if config == "empty":
            self.client.run_on_scheduler(add_empty)
            self.client.run(add_empty_worker)
            if not (self.client.run_on_scheduler(has_plugin, "empty")
                    and all(self.client.run(has_plugin, "empty").values())):
                self.close()
                raise RuntimeError("the empty plugins are not on every process")
        crux = [self.client.run_on_scheduler(has_plugin, "crux"),
                *self.client.run(has_plugin, "crux").values()]
        if any(crux) != self.crux or (self.crux and not all(crux)):
            self.close()
            raise RuntimeError(f"Crux on the scheduler and workers: {crux} in {config!r}")
        if config == "crux-quiet" and not (self.client.run_on_scheduler(quiet_hooks)
                                           and all(self.client.run(quiet_hooks).values())):
            self.close()
            raise RuntimeError("Crux's hooks could not be replaced on every process")
        if config == "crux-scheduler" and not all(self.client.run(quiet_hooks).values()):
            self.close()
            raise RuntimeError("Crux's hooks could not be replaced on every worker")
        pid = self.client.run_on_scheduler(os.getpid)
        worker_pids = sorted(self.client.run(os.getpid).values())
        if pid != self.scheduler.pid or worker_pids != sorted(w.pid for w in self.workers):
            self.close()
            raise RuntimeError("the processes measured are not the cluster's")
        self.scheduler_process = psutil.Process(pid)
        self.worker_processes = [psutil.Process(p) for p in worker_pids]
        self.client.run_on_scheduler(count_collections)
        self.client.run(count_collections)

    def cpu(self) -> tuple[float, float, float]:
        """CPU seconds (user + system) so far: the scheduler's, all workers' together, and
        the processes the scheduler started (Crux's graph process, and the fork server
        it comes from)."""
        def seconds(process: psutil.Process) -> float:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                return 0.0
            return times.user + times.system

        helpers = self.scheduler_process.children(recursive=True)
        return (seconds(self.scheduler_process),
                sum(seconds(p) for p in self.worker_processes),
                sum(seconds(p) for p in helpers))

    def kernel(self) -> dict[str, float]:
        """What the kernel counted so far of the scheduler and of all workers together:
        the CPU seconds spent in it (sending and receiving among them), and context
        switches -- the voluntary ones count how often a process waited for something (a
        message, a lock, the next timer), the others how often the processor was taken
        from it."""
        counts = dict.fromkeys([f"{name} {part}" for name in ("scheduler", "workers")
                                for part in ("system", "waits", "preempted")], 0.0)
        for name, processes in (("scheduler", [self.scheduler_process]),
                                ("workers", self.worker_processes)):
            for process in processes:
                with contextlib.suppress(psutil.NoSuchProcess):
                    switched = process.num_ctx_switches()
                    counts[f"{name} system"] += process.cpu_times().system
                    counts[f"{name} waits"] += switched.voluntary
                    counts[f"{name} preempted"] += switched.involuntary
        return counts

    def counters(self) -> tuple[dict[str, float], dict[str, float]]:
        """The garbage collections so far, and the work counted by
        :func:`scheduler_activity` and :func:`worker_activity`: the scheduler's, and all
        workers' together."""
        workers: dict[str, float] = {}
        for counts in self.client.run(counters_so_far).values():
            for name, value in counts.items():
                workers[name] = workers.get(name, 0) + value
        return self.client.run_on_scheduler(counters_so_far), workers

    def settle(self) -> None:
        """Wait until the scheduler holds no task and every event Crux recorded is applied.

        The configurations without Crux make the same round trips to the
        workers and the scheduler.
        """
        client = self.client
        deadline = time.monotonic() + 60
        while not client.run_on_scheduler(idle):
            if time.monotonic() > deadline:
                raise RuntimeError("the scheduler still holds tasks")
            time.sleep(0.02)
        if self.crux:
            import crux_dask

            crux_dask.flush(client)
        else:
            client.run(noop)
            client.run_on_scheduler(noop)

    def measure(self, work: Callable[[Client], None]) -> dict[str, float]:
        """Wall time and CPU seconds of the scheduler and of the workers for ``work``."""
        self.settle()
        begun = self.begin()
        return self.end(begun, timed(work, self.client))

    def begin(self) -> tuple[Any, dict[str, float], tuple[float, float, float]]:
        """What :meth:`end` counts from: the garbage collections, what the kernel
        counted and the CPU seconds so far."""
        return self.counters(), self.kernel(), self.cpu()

    def end(self, begun: tuple[Any, dict[str, float], tuple[float, float, float]],
            wall: float) -> dict[str, float]:
        """Once the cluster is idle again: ``wall``, and the CPU seconds and garbage
        collections since :meth:`begin` returned ``begun``."""
        self.settle()
        collected, counted, before = begun
        after = self.cpu()
        result = {"wall": wall, "scheduler": after[0] - before[0],
                  "workers": after[1] - before[1], "helpers": after[2] - before[2]}
        result.update({name: count - counted[name]
                       for name, count in self.kernel().items()})
        for process, (old, new) in zip(("scheduler", "workers"),
                                       zip(collected, self.counters(), strict=True),
                                       strict=True):
            result.update({f"{process} {name}": new[name] - old[name] for name in new})
        return result

    def crux_stats(self) -> dict[str, Any]:
        import crux_dask

        return crux_dask.get_stats(self.client)

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        for process in [*getattr(self, "workers", []), self.scheduler]:
            process.terminate()
        for process in [*getattr(self, "workers", []), self.scheduler]:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- the comparison ----------------------------------------------------------------
def workloads(args: argparse.Namespace) -> dict[str, tuple[str, Callable, Callable]]:
    """Each workload: its description, the full run and a small warm-up run."""
    table = {
        "tiny": (f"{len(tiny_graph(args.tiny)[0]):,} tiny tasks",
                 lambda c: run_tiny(c, args.tiny), lambda c: run_tiny(c, 300)),
        "shuffle": (f"P2P shuffle of {args.partitions} x {args.rows:,} rows",
                    lambda c: run_shuffle(c, args.partitions, args.rows),
                    lambda c: run_shuffle(c, 4, 1000)),
        "array": (f"array {args.array} x {args.array} in 20 x 20 chunks: x + x.T, std",
                  lambda c: run_array(c, args.array), lambda c: run_array(c, 200)),
    }
    return {name: table[name] for name in args.workloads}


def config_environment(settings: list[str]) -> dict[str, str]:
    """The environment variables that give dask the config ``KEY=VALUE`` settings."""
    env = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"--other-config expects KEY=VALUE, got {setting!r}")
        env["DASK_" + "__".join(part.upper().replace("-", "_") for part in key.split("."))] = value
    return env


def run(args: argparse.Namespace) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Every measurement: ``results[workload][config]`` is one dict per round."""
    chosen = workloads(args)
    configs = CONFIGS + (("empty",) if args.empty else ()) + (
        ("crux-quiet",) if args.quiet_hooks else ()) + (
        ("crux-scheduler",) if args.quiet_worker_hooks else ()) + (
        ("crux-other",) if args.compare_with or args.other_config else ())
    results: dict[str, dict[str, list]] = {w: {c: [] for c in configs} for w in chosen}
    crux_rounds: dict[str, list[dict[str, Any]]] = {w: [] for w in chosen}

    def start(config: str, scratch: str) -> Cluster:
        cluster = Cluster(config, Path(scratch), other=args.compare_with,
                          other_config=config_environment(args.other_config),
                          threads=args.threads)
        for _, _, warm in chosen.values():
            warm(cluster.client)
        return cluster

    def measured(name: str, cluster: Cluster, result: dict[str, float],
                 before: dict[str, Any] | None, round_: int) -> None:
        results[name][cluster.config].append(result)
        if before is not None:
            crux_rounds[name].append(crux_account(before, cluster.crux_stats()))
        print(f"  round {round_ + 1} {cluster.config:<14} {name:<8} "
              f"wall {result['wall']:6.2f} s  scheduler CPU "
              f"{result['scheduler']:6.2f} s  workers CPU "
              f"{result['workers']:6.2f} s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="crux-overhead-") as scratch:
        if args.together:
            together(args, configs, start, measured, scratch)
            return finish(results, crux_rounds)
        for round_ in range(args.repeats):
            turn = round_ % len(configs)
            for config in configs[turn:] + configs[:turn]:
                cluster = start(config, scratch)
                try:
                    for name, (_, work, _) in chosen.items():
                        before = cluster.crux_stats() if config == "crux" else None
                        measured(name, cluster, cluster.measure(work), before, round_)
                finally:
                    cluster.close()
    return finish(results, crux_rounds)


def together(args: argparse.Namespace, configs: tuple[str, ...],
             start: Callable[[str, str], Cluster], measured: Callable[..., None],
             scratch: str) -> None:
    """The rounds of ``--together``: each round, a cluster of every configuration, its
    scheduler and workers bound to the last processor (the client to the others), and
    each workload run on all of them at the same time."""
    *others, last = sorted(os.sched_getaffinity(0))
    if not others:
        raise SystemExit("--together needs two processors at least")
    # Where the schedulers, the workers and the helpers go; the client runs with the
    # schedulers apart, else on the processors no cluster has.
    schedulers, workers, helpers = ([others[0]], [last], [last]) if args.apart else (
        [last], [last], others)
    os.sched_setaffinity(0, schedulers if args.apart else others)
    with ThreadPoolExecutor(len(configs)) as pool:
        for round_ in range(args.repeats):
            # Submitted first, a graph runs alone a moment; the last to finish runs
            # alone at the end: each configuration takes each place in turn.
            turn = round_ % len(configs)
            order: list[Cluster] = []
            try:
                for config in configs[turn:] + configs[:turn]:
                    order.append(start(config, scratch))
                    order[-1].scheduler_process.cpu_affinity(schedulers)
                    for process in order[-1].worker_processes:
                        process.cpu_affinity(workers)
                    for helper in order[-1].scheduler_process.children(recursive=True):
                        helper.cpu_affinity(helpers)
                for name, (_, work, _) in workloads(args).items():
                    for cluster in order:
                        cluster.settle()
                    before = [cluster.crux_stats() if cluster.config == "crux" else None
                              for cluster in order]
                    starts = [cluster.begin() for cluster in order]
                    walls = list(pool.map(partial(timed, work), [c.client for c in order]))
                    for cluster, begun, wall, stats in zip(order, starts, walls, before,
                                                           strict=True):
                        measured(name, cluster, cluster.end(begun, wall), stats, round_)
            finally:
                for cluster in order:
                    cluster.close()


def timed(work: Callable[[Client], None], client: Client) -> float:
    """Run ``work`` on ``client``; the seconds it took."""
    started = time.perf_counter()
    work(client)
    return time.perf_counter() - started


def finish(results: dict[str, dict[str, list]],
           crux_rounds: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, list]]:
    """``results`` with Crux's own account of each round of each workload added."""
    for name, rounds in crux_rounds.items():
        for part in ("events", "applying", "longest_slice", "waited", "own"):
            results[name][part] = [r[part] for r in rounds]
    return results


def crux_account(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What Crux's stats tell of a workload run between ``before`` and ``after``: events
    received, seconds applying them, the longest slice so far, events that waited for
    a late report, and its own CPU on the scheduler; raises if it reported a failure."""
    check_crux(after)
    return {"events": after["events_received"] - before["events_received"],
            "applying": after["seconds_applying"] - before["seconds_applying"],
            "longest_slice": after["longest_slice_seconds"],
            "waited": after["events_parked_total"] - before["events_parked_total"],
            "own": own_seconds(before, after)}


def own_seconds(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """The scheduler's CPU seconds Crux measured itself spending between two of its stats:
    its handler taking the workers' batches, its writer thread sending the queue to
    the graph process, and its event loop reading the graph process's rows back."""
    def process(stats: dict[str, Any], name: str) -> float:
        return (stats.get("graph_process") or {}).get(name, 0.0)

    return {"receiving": after["seconds_receiving"] - before["seconds_receiving"],
            "sending": process(after, "seconds_sending") - process(before, "seconds_sending"),
            "reading": process(after, "seconds_reading") - process(before, "seconds_reading")}


def check_crux(stats: dict[str, Any]) -> None:
    """Raise if Crux reported a failure on the scheduler or a worker."""
    problems = {k: stats.get(k) for k in ("events_failed", "hook_errors") if stats.get(k)}
    for worker, counts in stats.get("workers", {}).items():
        for k in ("hook_errors", "send_failures", "events_dropped"):
            if counts.get(k):
                problems[f"{worker} {k}"] = counts[k]
    if problems:
        raise RuntimeError(f"Crux reported problems: {problems}")


def median_of(rounds: list[dict[str, float]], measure: str) -> float:
    """The median of ``measure`` over ``rounds`` (0 where it was not measured)."""
    return statistics.median(r.get(measure, 0) for r in rounds)


def report(args: argparse.Namespace, results: dict) -> None:
    """Medians per workload and configuration, and their ratios to ``none``."""
    chosen = workloads(args)
    print(f"{args.repeats} rounds; 2 worker processes x {args.threads} thread(s); scheduler "
          "and workers in their own processes; CPU = user + system seconds")
    for name, (title, _, _) in chosen.items():
        print()
        events = results[name]["events"]
        print(f"{name}: {title}" + (f"  (crux: {statistics.median(events):,.0f} events "
                                    "from the workers' and the scheduler's hooks)"
                                    if events else ""))
        print(f"  {'config':<14} {'wall s':>8} {'sched CPU s':>12} {'workers CPU s':>14} "
              f"{'wall/none':>10} {'sched/none':>11} {'workers/none':>13} "
              f"{'graph process CPU s':>20}")
        medians = {c: {m: statistics.median(r.get(m, 0.0) for r in results[name][c])
                       for m in ("wall", "scheduler", "workers", "helpers")}
                   for c in results[name] if c in (*CONFIGS, *EXTRA_CONFIGS)}
        base = medians["none"]
        for config, m in medians.items():
            print(f"  {config:<14} {m['wall']:>8.2f} {m['scheduler']:>12.2f} "
                  f"{m['workers']:>14.2f} {m['wall'] / base['wall']:>10.3f} "
                  f"{m['scheduler'] / base['scheduler']:>11.3f} "
                  f"{m['workers'] / base['workers']:>13.3f} {m['helpers']:>20.2f}")
        minima = {c: {m: min(r[m] for r in results[name][c]) for m in ("scheduler", "workers")}
                  for c in medians}
        low = minima["none"]
        print("  least CPU of any round, / none: " + "; ".join(
            f"{c} scheduler {m['scheduler'] / low['scheduler']:.3f} workers "
            f"{m['workers'] / low['workers']:.3f}" for c, m in minima.items() if c != "none"))
        if args.repeats >= 4:
            quartiles = {c: {m: statistics.quantiles([r[m] for r in results[name][c]], n=4)[0]
                             for m in ("scheduler", "workers")} for c in medians}
            low = quartiles["none"]
            print("  lower quartile of the rounds, / none: " + "; ".join(
                f"{c} scheduler {m['scheduler'] / low['scheduler']:.3f} workers "
                f"{m['workers'] / low['workers']:.3f}"
                for c, m in quartiles.items() if c != "none"))
        print("  garbage collections, medians (young, full; CPU s in all): " + "; ".join(
            f"{c} " + ", ".join(
                f"{process} {median_of(results[name][c], f'{process} young'):.0f}, "
                f"{median_of(results[name][c], f'{process} full'):.0f}; "
                f"{median_of(results[name][c], f'{process} seconds'):.3f} s"
                for process in ("scheduler", "workers")) for c in medians))
        print("  activity, medians (the scheduler's transitions and steals; the workers' "
              "batches to the scheduler and messages in them): " + "; ".join(
                  f"{c} " + ", ".join(f"{median_of(results[name][c], key):.0f}" for key in (
                      "scheduler transitions", "scheduler steals", "workers batches",
                      "workers messages")) for c in medians))
        print("  the scheduler's batches to the workers and messages in them, medians: "
              + "; ".join(f"{c} " + ", ".join(
                  f"{median_of(results[name][c], key):.0f}" for key in (
                      "scheduler batches", "scheduler messages")) for c in medians))
        print("  in the kernel, medians (the scheduler's system CPU s, context switches "
              "waiting and preempted; the workers'): " + "; ".join(
                  f"{c} " + ", ".join(f"{median_of(results[name][c], key):.{digits}f}"
                                      for process in ("scheduler", "workers")
                                      for key, digits in ((f"{process} system", 2),
                                                          (f"{process} waits", 0),
                                                          (f"{process} preempted", 0)))
                  for c in medians))
        rounds = {c: [(r["scheduler"] / b["scheduler"], r["workers"] / b["workers"])
                      for r, b in zip(results[name][c], results[name]["none"], strict=True)]
                  for c in medians if c != "none"}
        for config, ratios in rounds.items():
            print(f"  {config} / none, each round: scheduler "
                  + " ".join(f"{a:.3f}" for a, _ in ratios) + "; workers "
                  + " ".join(f"{b:.3f}" for _, b in ratios)
                  + "; geometric means (each place in the round as often, with --together "
                  "and whole turns): scheduler "
                  f"{statistics.geometric_mean(a for a, _ in ratios):.3f} workers "
                  f"{statistics.geometric_mean(b for _, b in ratios):.3f}")
        if "crux" in medians:
            crux = medians["crux"]
            applying = statistics.median(results[name]["applying"])
            where = ("its graph process" if crux["helpers"] else
                     f"the scheduler ({applying / crux['scheduler']:.1%} of its CPU)")
            print(f"  crux's own account: applying events took {applying:.3f} CPU s of "
                  f"{where}; events that "
                  f"waited for a late report {statistics.median(results[name]['waited']):,.0f}"
                  f"; longest stretch of the scheduler's event loop "
                  f"{max(results[name]['longest_slice']) * 1000:.1f} ms")
            parts = {part: statistics.median(r[part] for r in results[name]["own"])
                     for part in ("receiving", "sending", "reading")}
            spent = sum(parts.values())
            print(f"  crux's own CPU on the scheduler (measured by crux, hooks not included): "
                  f"{spent * 1000:.0f} ms = {spent / crux['scheduler']:.2%} of its CPU ("
                  + ", ".join(f"{part} {value * 1000:.0f} ms" for part, value in parts.items())
                  + ")")
            if "crux-other" in medians:
                pairs = [(r["scheduler"] / o["scheduler"], r["workers"] / o["workers"])
                         for r, o in zip(results[name]["crux"], results[name]["crux-other"],
                                         strict=True)]
                other = medians["crux-other"]
                print(f"  crux / crux-other: medians scheduler "
                      f"{crux['scheduler'] / other['scheduler']:.3f} workers "
                      f"{crux['workers'] / other['workers']:.3f}; each round: scheduler "
                      + " ".join(f"{a:.3f}" for a, _ in pairs) + "; workers "
                      + " ".join(f"{b:.3f}" for _, b in pairs))
            if "crux-quiet" in medians:
                pairs = [(r["scheduler"] / q["scheduler"], r["workers"] / q["workers"])
                         for r, q in zip(results[name]["crux"], results[name]["crux-quiet"],
                                         strict=True)]
                print("  crux / crux-quiet (the work of Crux's hooks), geometric means of the "
                      f"rounds: scheduler {statistics.geometric_mean(a for a, _ in pairs):.3f}"
                      f" workers {statistics.geometric_mean(b for _, b in pairs):.3f}")
            ok = all(statistics.geometric_mean(ratio[i] for ratio in rounds["crux"]) <= TARGET
                     for i in (0, 1))
            print(f"  target crux <= +{(TARGET - 1) * 100:.0f} % scheduler and workers CPU "
                  f"over none (geometric means of the rounds' ratios): "
                  f"{'met' if ok else 'NOT met'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds (default: %(default)s)")
    parser.add_argument("--tiny", type=int, default=18_000,
                        help="tasks of the tiny workload (default: %(default)s)")
    parser.add_argument("--partitions", type=int, default=40,
                        help="partitions of the shuffle (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=250_000,
                        help="rows per partition of the shuffle (default: %(default)s)")
    parser.add_argument("--array", type=int, default=4000,
                        help="side of the square array, in 20 x 20 chunks "
                             "(default: %(default)s)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--compare-with", type=Path, metavar="DIR",
                        help="also run Crux from the crux_dask package in DIR (crux-other)")
    parser.add_argument("--other-config", nargs="+", default=[], metavar="KEY=VALUE",
                        help="dask config settings of crux-other, e.g. "
                             "crux-dask.capture.files=False")
    parser.add_argument("--together", action="store_true",
                        help="run the configurations at the same time, on one processor "
                             "(see above)")
    parser.add_argument("--apart", action="store_true",
                        help="with --together, the schedulers on one processor and the "
                             "workers on another (see above)")
    parser.add_argument("--empty", action="store_true",
                        help="add a configuration of plugins whose hooks do nothing")
    parser.add_argument("--quiet-hooks", action="store_true",
                        help="add Crux with transition hooks that do nothing (crux-quiet)")
    parser.add_argument("--quiet-worker-hooks", action="store_true",
                        help="add Crux whose workers' transition hooks do nothing, so that "
                             "the scheduler records every task (crux-scheduler)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of each of the two workers (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args(argv)
    if args.apart and not args.together:
        parser.error("--apart goes with --together")
    results = run(args)
    report(args, results)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) if isinstance(v, Path) else v
                                                  for k, v in vars(args).items()},
                                         "results": results}, indent=1))


if __name__ == "__main__":
    main()
