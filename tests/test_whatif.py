"""What-if replay: cases known by construction, bad input, the command line, a real run."""

from __future__ import annotations

import math
import random
import time

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import crux_dask
from crux_dask import PAGBuilder
from crux_dask.cli import main
from crux_dask.predicted import predicted_pag
from crux_dask.provenance import write_dataset
from crux_dask.wcp import CriticalPath

A = "tcp://127.0.0.1:1001"
B = "tcp://127.0.0.1:1002"
GAP = 0.002  # scheduler's round trip in the constructed runs
DISPATCH = 0.0005  # a worker's start of a task it holds


class Cluster:
    """Writes the events of a run as Dask would schedule it, worker by worker, thread by thread."""

    def __init__(self, workers: list[str]) -> None:
        self.builder = PAGBuilder()
        self.root = self.builder.root(0.0)
        self.free = {w: 0.0 for w in workers}  # one thread each
        self.done: dict[str, tuple[str, float]] = {}  # key -> (worker, stop)

    def task(self, key: str, worker: str, seconds: float, inputs: tuple[str, ...] = (),
             label: str | None = None, nbytes: int = 1000,
             priority: float | None = None) -> None:
        released = max([self.done[k][1] for k in inputs], default=0.0)
        received = released + GAP
        ready = received
        for name in inputs:
            where, _ = self.done[name]
            if where != worker:  # fetch the input first
                self.builder.transfer(name, f"memory@{where}", f"memory@{worker}", received,
                                      received + 0.001, nbytes)
                ready = max(ready, received + 0.001)
        start = max(ready, self.free[worker]) + DISPATCH
        stop = start + seconds
        self.builder.compute(key, worker, 1, start, stop, nbytes, inputs, self.root, label,
                             sent=released, received=received, runnable=ready,
                             priority=priority)
        self.free[worker] = stop
        self.done[key] = (worker, stop)

    def gather(self, key: str) -> crux_dask.PAG:
        where, stop = self.done[key]
        self.builder.transfer(key, f"memory@{where}", "client", stop + GAP, stop + GAP + 0.001)
        return self.builder.pag()


def independent_tasks(n: int = 16, seconds: float = 0.1) -> crux_dask.PAG:
    """``n`` tasks of ``seconds`` alternating over two workers, then their sum on the first."""
    cluster = Cluster([A, B])
    for i in range(n):
        cluster.task(f"work-{i}", (A, B)[i % 2], seconds, label="work")
    cluster.task("sum", A, 0.001, tuple(f"work-{i}" for i in range(n)), label="sum")
    return cluster.gather("sum")


def main_and_side() -> crux_dask.PAG:
    """A chain of long ``main`` tasks on A, short ``side`` tasks on B, joined at the end."""
    cluster = Cluster([A, B])
    cluster.task("main-0", A, 0.5, label="main")
    cluster.task("side-0", B, 0.1, label="side")
    cluster.task("main-1", A, 0.5, ("main-0",), label="main")
    cluster.task("side-1", B, 0.1, ("side-0",), label="side")
    cluster.task("join", A, 0.01, ("main-1", "side-1"), label="join")
    return cluster.gather("join")


def random_graph(seed: int) -> crux_dask.PAG:
    """Layers of tasks, each reading one to three of the layer before, over two workers."""
    rng = random.Random(seed)
    cluster = Cluster([A, B])
    previous: list[str] = []
    for layer in range(4):
        current = []
        for i in range(6):
            key = f"layer{layer}-{i}"
            inputs = tuple(sorted(set(rng.sample(previous, rng.randint(1, 3))))) if previous \
                else ()
            cluster.task(key, rng.choice((A, B)), rng.uniform(0.01, 0.1), inputs,
                         label=f"layer{layer}", nbytes=rng.randint(1, 10) * 10**6)
            current.append(key)
        previous = current
    cluster.task("end", A, 0.001, tuple(previous), label="end")
    return cluster.gather("end")


def test_an_unchanged_replay_of_a_constructed_run_matches_it():
    pag = independent_tasks()
    result = pag.what_if()
    assert result.recorded == pytest.approx(pag.wcp().length)
    assert abs(result.replay_error) < 0.03
    assert result.makespan == pytest.approx(result.baseline)


def test_twice_the_workers_halves_independent_tasks():
    pag = independent_tasks()
    result = pag.what_if(workers=4)
    assert result.makespan / result.recorded == pytest.approx(0.5, rel=0.15)
    # The predicted path: the naps that held the queue and the threads, one after another.
    path = result.path
    assert path.breakdown["compute"] >= 0.8 * path.length
    assert pag.what_if(threads=2).makespan == pytest.approx(result.makespan, rel=0.05)


def replayed_order(result) -> list[str]:
    """The keys of a replay's tasks, by start."""
    run = result.run
    keys = np.asarray(run.store.keys.values, dtype=object)[
        run.store.column("state_key", run.state)]
    return keys[np.argsort(result.schedule.start, kind="stable")].tolist()


@pytest.mark.parametrize("recorded", [True, False])
def test_one_worker_runs_the_tasks_in_dask_priority_order(recorded):
    """Recorded on two workers; on one, Dask's priorities decide who goes first.

    Without recorded priorities the replay keeps the recorded start order.
    """
    cluster = Cluster([A, B])
    for i in range(2):
        for worker, name, priority in ((A, "late", 10 + i), (B, "early", i)):
            cluster.task(f"{name}-{i}", worker, 0.1, label=name,
                         priority=float(priority) if recorded else None)
    pag = cluster.gather("late-1")
    order = replayed_order(pag.what_if(workers=1))
    if recorded:
        assert order == ["early-0", "early-1", "late-0", "late-1"]
    else:
        assert order == ["late-0", "early-0", "late-1", "early-1"]


def test_speeding_up_a_prefix_off_the_path_saves_almost_nothing():
    pag = main_and_side()
    side = pag.what_if(speedup={"side": 2.0})
    assert abs(side.saved) < 0.01 * side.baseline
    main_ = pag.what_if(speedup={"main": 2.0})
    assert main_.saved == pytest.approx(0.5, rel=0.05)  # two main tasks of 0.5 s each


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_free_transfers_never_make_a_run_slower(seed):
    pag = random_graph(seed)
    result = pag.what_if(transfer_speedup=math.inf)
    assert result.makespan <= result.baseline + 1e-9
    assert pag.what_if(transfer_speedup=4.0).makespan <= result.baseline + 1e-9


def test_the_predicted_path_is_a_critical_path_of_the_predicted_run():
    result = main_and_side().what_if(speedup={"main": 2.0})
    path = result.path
    assert isinstance(path, CriticalPath)
    assert path.length == pytest.approx(result.makespan, abs=1e-6)
    compute = path.to_frame().query("category == 'compute'")
    assert compute.groupby("label")["busy"].sum()["main"] == pytest.approx(0.5, rel=0.01)


def test_a_predicted_run_ends_through_the_output_computed_last():
    cluster = Cluster([A, B])
    for i in range(8):
        cluster.task(f"work-{i}", (A, B)[i % 2], 0.1 + 0.01 * i, label="work")
    # The client gathers them all at the end, the first computed last.
    end = max(stop for _, stop in cluster.done.values())
    for i in range(8):
        where, _ = cluster.done[f"work-{i}"]
        cluster.builder.transfer(f"work-{i}", f"memory@{where}", "client", end + GAP,
                                 end + GAP + 0.001 * (8 - i))
    result = cluster.builder.pag().what_if(workers=1)
    path = result.path
    assert path.length == pytest.approx(result.makespan, abs=1e-6)
    assert path.breakdown["wait"] == pytest.approx(0.0, abs=1e-6)
    assert path.breakdown["compute"] >= 0.9 * path.length
    # One thread, two queue slots (saturation 1.1): the six others each left the queue
    # when a task before them ended, and the predicted graph says which.
    pag = predicted_pag(result.run, result.schedule)
    assert (pag.causes["kind"] == "SLOT").sum() == 6


def test_suggestions_rank_the_prefix_on_the_path_first():
    table = main_and_side().suggest()
    assert list(table.columns) == ["kind", "change", "why", "path_share", "predicted", "low",
                                   "high", "saved", "saved_share", "replay_error", "path_then"]
    assert set(table["kind"]) == {"what-if"}  # no moments, no load: no advice
    # The figures are numbers even without advice (whose empty columns have no type).
    figures = ["path_share", "predicted", "low", "high", "saved", "saved_share", "replay_error"]
    assert all(pd.api.types.is_float_dtype(table[column]) for column in figures)
    assert table["change"].iloc[0] == "main 2x faster"
    assert table["saved"].is_monotonic_decreasing
    side = table.set_index("change").loc["side 2x faster", "saved"] if (
        "side 2x faster" in set(table["change"])) else 0.0
    assert side < 0.01


def test_spill_time_is_charged_and_can_be_removed():
    cluster = Cluster([A])
    cluster.task("x", A, 0.1, label="x", nbytes=10**6)
    cluster.builder.transfer("x", f"memory@{A}", f"disk@{A}", 0.2, 0.5)
    cluster.builder.delete("x", f"memory@{A}", 0.5)
    cluster.builder.transfer("x", f"disk@{A}", f"memory@{A}", 0.5, 0.8)
    cluster.free[A] = 0.8
    cluster.task("y", A, 0.1, ("x",), label="y")
    pag = cluster.gather("y")
    result = pag.what_if(spill=False)
    assert result.saved == pytest.approx(0.6, rel=0.05)  # 0.3 s out, 0.3 s back in


@pytest.mark.parametrize("change, message", [
    ({"speedup": {"nope": 2.0}}, "unknown task prefix 'nope'"),
    ({"workers": 0}, "workers must be"),
    ({"threads": -1}, "threads must be"),
    ({"speedup": {"work": 0.0}}, "speedup of work must be"),
    ({"transfer_speedup": 0.0}, "transfer_speedup must be"),
])
def test_bad_changes_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        independent_tasks(4).what_if(**change)


def test_a_run_without_tasks_or_timing_is_refused():
    builder = PAGBuilder()
    builder.root(0.0)
    builder.transfer("data", "client", f"memory@{A}", 0.0, 0.1)
    with pytest.raises(ValueError, match="no tasks"):
        builder.pag().what_if()
    pag = independent_tasks(4)
    states, mutations = pag.states, pag.mutations
    states["time"] = np.nan
    mutations["start"] = np.nan
    with pytest.raises(ValueError, match="no timing"):
        crux_dask.PAG.from_frames(states, mutations).what_if()


def test_whatif_and_report_on_an_exported_run(tmp_path):
    write_dataset(tmp_path / "runs", main_and_side())
    runner = CliRunner()
    result = runner.invoke(main, ["whatif", str(tmp_path / "runs"), "--speedup", "main=2",
                                  "--workers", "3", "--transfer-speedup", "inf"])
    assert result.exit_code == 0, result.output
    assert "predicted" in result.output and "Workflow critical path" in result.output
    bad = runner.invoke(main, ["whatif", str(tmp_path / "runs"), "--speedup", "nope=2"])
    assert bad.exit_code == 2 and "unknown task prefix" in bad.output
    report = runner.invoke(main, ["report", str(tmp_path / "runs")])
    assert report.exit_code == 0, report.output
    assert "main 2x faster" in report.output.split("What if")[1]


def test_a_real_run_on_twice_the_workers_takes_half_as_long():
    import dask
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.run(lambda: None)
        crux_dask.attach(client)
        tasks = [dask.delayed(time.sleep)(0.1, dask_key_name=f"nap-{i}") for i in range(16)]
        dask.compute(tasks)
        pag = crux_dask.get_pag(client)
    result = pag.what_if(workers=4)
    assert abs(result.replay_error) < 0.10
    assert result.makespan / result.recorded == pytest.approx(0.5, rel=0.15)
    # The predicted path: the naps that held the queue and the threads, one after another.
    path = result.path
    assert path.breakdown["compute"] >= 0.8 * path.length
    labels = pd.Series(result.run.label_names).unique().tolist()
    assert labels == ["nap"]
