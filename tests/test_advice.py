"""Advice on constructed cases with a known answer, on real clusters: thousands of tiny
tasks, a scheduler slowed by a plugin, and (in :mod:`test_load`) an oversubscribed
worker.  Each case's stages say where the time went, and the advice names the fix."""

from __future__ import annotations

import time

import dask.bag as db
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin

import crux_dask
from crux_dask.advice import advise

#: Seconds the slow plugin burns in the scheduler's event loop at each transition: a
#: task's transitions cost more than its run (:func:`rest`), on two threads.
BURN = 0.02


def nap(x: int) -> int:
    """A millisecond that does not hold the GIL."""
    time.sleep(0.001)
    return x


def rest(x: int) -> int:
    """Fifty milliseconds that do not hold the GIL."""
    time.sleep(0.05)
    return x


class SlowScheduler(SchedulerPlugin):
    """A scheduler plugin whose transition hook burns CPU (in the event loop)."""

    name = "slow-scheduler"

    def transition(self, *args, **kwargs) -> None:
        started = time.perf_counter()
        while time.perf_counter() - started < BURN:
            pass


def stages_of(path) -> dict[str, float]:
    return {stage: path.breakdown[stage]
            for stage in ("report", "scheduler", "dispatch", "worker")}


@pytest.fixture
def one_worker():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        yield client


def test_thousands_of_tiny_tasks_are_told_to_be_larger(one_worker):
    client = one_worker
    db.from_sequence(range(2000), npartitions=1000).map(nap).map(nap).sum().compute()
    path = crux_dask.get_wcp(client)
    stages = stages_of(path)
    steps = path.to_frame()
    tasks = steps[steps["category"] == "compute"]
    # Scheduling each task costs more than running it, stage by stage.
    assert sum(stages.values()) > path.breakdown["compute"], path.summary()
    assert tasks[list(stages)].sum(axis=1).median() > tasks["busy"].median()
    advice = advise(path, crux_dask.get_load(client))
    # Advice the load supports besides may rank first (the GIL the worker's two threads
    # waited for, on a busy machine); larger tasks is given, for more of the path than
    # its tasks computed.
    larger = advice[advice["advice"].str.contains("larger tasks")]
    assert len(larger) == 1, advice.to_string()
    assert "median task computes" in larger["why"].iloc[0]
    assert larger["share"].iloc[0] > path.breakdown["compute"] / path.length


def test_a_slowed_scheduler_is_told_to_have_fewer_tasks(one_worker):
    client = one_worker
    client.register_plugin(SlowScheduler())
    db.from_sequence(range(60), npartitions=60).map(rest).sum().compute()
    path = crux_dask.get_wcp(client)
    load = crux_dask.get_load(client)
    # Every transition burns the scheduler's loop: what it takes part in (the reports
    # it reads, its decisions, the dispatches it sends) is most of the path.
    stages = stages_of(path)
    assert stages["report"] + stages["scheduler"] + stages["dispatch"] > (
        0.5 * path.length), path.summary()
    scheduler = load[load["process"] == "scheduler"]
    assert scheduler["cpu"].max() >= 0.75 or scheduler["lag"].max() >= 0.05
    advice = advise(path, load)
    assert "fewer tasks for the scheduler" in advice["advice"].iloc[0], advice.to_string()
    assert "the scheduler's CPU was up to" in advice["why"].iloc[0]
