"""Units of tasks: what a large run's scaling replays, against the replay of every task."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from test_whatif import GAP, A, B, Cluster

import crux_dask
from crux_dask.recording import extract
from crux_dask.scaling import ENOUGH, scaling
from crux_dask.units import SPARE, units_of


def layers(width: int, depth: int, seconds: float) -> crux_dask.PAG:
    """``depth`` layers of ``width`` tasks of ``seconds``, each reading two of the layer
    before, alternating over two workers, then one task reading the last layer."""
    cluster = Cluster([A, B])
    previous: list[str] = []
    for layer in range(depth):
        current = [f"layer{layer}-{i}" for i in range(width)]
        for i, key in enumerate(current):
            inputs = tuple(sorted({previous[i], previous[(i * 7 + 1) % width]})) \
                if previous else ()
            cluster.task(key, (A, B)[i % 2], seconds, inputs, label=f"layer{layer}",
                         priority=layer * width + i)
        previous = current
    cluster.task("end", A, 0.001, tuple(previous), label="end", priority=depth * width)
    return cluster.gather("end")


def test_units_keep_every_task_its_seconds_bytes_and_inputs():
    pag = layers(width=128, depth=3, seconds=0.05)
    run = extract(pag.stores[0], pag.ends[0])
    units = units_of(run, threads=4, most=run.n_tasks // 4)
    assert units is not None and units_of(run, threads=4, most=run.n_tasks // 4) is units
    joined = units.run
    # Each task in one unit, each unit of one label; seconds and bytes add up.
    assert np.bincount(units.of).tolist() == units.tasks.tolist()
    assert (run.label == joined.label[units.of]).all()
    assert joined.duration.sum() == pytest.approx(run.duration.sum())
    assert joined.size.sum() == run.size.sum()
    # A unit needs exactly the units of its tasks' inputs, never itself.
    for u in range(joined.n_tasks):
        mine = np.flatnonzero(units.of == u)
        inputs = {int(units.of[d]) for t in mine
                  for d in run.deps[run.dep_ptr[t]:run.dep_ptr[t + 1]]}
        assert set(joined.deps[joined.dep_ptr[u]:joined.dep_ptr[u + 1]].tolist()) == inputs
        assert u not in inputs
    # Every layer keeps at least SPARE units a thread; "end" stays a task.
    per_label = np.bincount(joined.label)
    assert per_label[joined.label[units.of[-1]]] == 1
    assert (per_label[per_label > 1] >= SPARE * 4).all()
    assert joined.n_tasks < run.n_tasks / 3


def test_tasks_shorter_than_the_round_trip_stay_tasks():
    pag = layers(width=128, depth=3, seconds=GAP / 4)
    run = extract(pag.stores[0], pag.ends[0])
    assert run.gaps.local == pytest.approx(GAP, rel=0.01)
    units = units_of(run, threads=4, most=run.n_tasks // 4)
    assert units is not None and units.run.n_tasks == run.n_tasks


def test_a_run_small_enough_is_replayed_task_by_task():
    pag = layers(width=16, depth=2, seconds=0.05)
    run = extract(pag.stores[0], pag.ends[0])
    assert units_of(run, threads=4, most=run.n_tasks) is None


def test_the_scaling_of_units_is_the_scaling_of_tasks_on_a_real_run():
    import dask
    from distributed import Client, LocalCluster

    def nap(*_: object) -> None:
        time.sleep(0.03)

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.run(lambda: None)
        crux_dask.attach(client)
        first = [dask.delayed(nap)(i, dask_key_name=f"first-{i}") for i in range(160)]
        second = [dask.delayed(nap)(first[i], first[(7 * i + 1) % 160],
                                    dask_key_name=f"second-{i}") for i in range(160)]
        dask.compute(second)
        pag = crux_dask.get_pag(client)
    store, end = pag.stores[-1], pag.ends[-1]
    run = extract(store, end)
    shapes = ((1, 2, 4), (1, 2))
    units = units_of(run, threads=8, most=run.n_tasks // 8)
    assert units is not None and units.run.n_tasks <= run.n_tasks / 2, run.gaps
    every = scaling(store, end, *shapes, run=run, most=math.inf)
    joined = scaling(store, end, *shapes, run=run, most=run.n_tasks // 8)
    # A group of units over the threads rounds up by one unit at most: 1 / SPARE of its
    # time, where a thread has SPARE units (on 24 shapes of a layered graph of 454,545
    # tasks, units of 6 tasks erred by under 0.05 %; here the units are 2 tasks each).
    error = joined.table["predicted"] / every.table["predicted"] - 1
    assert error.abs().max() < 1 / SPARE, error.tolist()
    named = every.table[(every.table["workers"] == joined.enough[0])
                        & (every.table["threads"] == joined.enough[1])]
    assert named["high"].item() <= (1 + ENOUGH + 1 / SPARE) * every.table["high"].min()
