"""The load of the scheduler and its workers, sampled on real clusters, and the load each
stage of a path ran under.

An oversubscribed worker (eight threads on this machine's cores, tasks that
hold the GIL) is the case with a known answer: its busy threads outnumber its
host's cores, its threads wait for the GIL, and the stages of the path that
ran in it say so.  Dask's task stream is the independent witness of how many
tasks ran at once.
"""

from __future__ import annotations

import os

import dask
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from test_causes import add_task_stream, task_stream

import crux_dask
from crux_dask.advice import advise
from crux_dask.load import LOAD_COLUMNS, SCHEDULER, LoadLog, describe, load_frame, stage_loads
from crux_dask.path import STAGES

THREADS = 8


def spin(i: int, n: int = 600_000) -> int:
    """Pure Python: holds the GIL for all its run."""
    total = 0
    for j in range(n):
        total += j ^ i
    return total


def layered(width: int = 24, depth: int = 3):
    layer = [dask.delayed(spin)(i, dask_key_name=f"spin-0-{i}") for i in range(width)]
    for d in range(1, depth):
        layer = [dask.delayed(spin)(x % 7, dask_key_name=f"spin-{d}-{i}")
                 for i, x in enumerate(layer)]
    return dask.delayed(sum)(layer, dask_key_name="spin-total")


@pytest.fixture(scope="module")
def oversubscribed():
    with dask.config.set({"distributed.admin.system-monitor.gil.enabled": True}), \
            LocalCluster(n_workers=1, threads_per_worker=THREADS, processes=True,
                         dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        client.run_on_scheduler(add_task_stream)
        # 72 tasks of about 30 ms: two seconds of work, so that several of the system
        # monitor's half-second windows of GIL contention fall inside the run.
        dask.compute(layered())
        yield client


def test_the_load_of_every_process_is_sampled(oversubscribed):
    client = oversubscribed
    load = crux_dask.get_load(client)
    assert list(load.columns) == list(LOAD_COLUMNS)
    (worker,) = client.scheduler_info()["workers"]
    assert set(load["process"]) == {SCHEDULER, worker}
    mine = load[load["process"] == worker]
    assert len(mine) >= 2
    assert (mine["threads"] == THREADS).all()
    # Dask's count of the cores, from the first heartbeat after the plugin's start.
    cores = mine["cores"].dropna()
    assert len(cores) and (cores == len(os.sched_getaffinity(0))).all()
    assert mine["busy"].between(0, THREADS).all()
    assert mine["gil"].between(0, 1).all() and mine["gil"].max() > 0
    assert load.groupby("process")["time"].apply(lambda t: t.is_monotonic_increasing).all()
    # The task stream: more tasks ran at once than there are cores, and the samples saw
    # as much (a task is busy from its submission to the thread pool to its end
    # handled, a little longer than its run).
    stream = client.run_on_scheduler(task_stream)
    runs = [(s["start"], s["stop"]) for r in stream for s in r["startstops"]
            if s["action"] == "compute"]
    at_once = max(sum(start <= t < stop for start, stop in runs) for t, _ in runs)
    assert at_once > cores.iloc[0] and mine["busy"].max() > cores.iloc[0]


def test_each_stage_of_the_path_carries_the_load_it_ran_under(oversubscribed):
    client = oversubscribed
    path = crux_dask.get_wcp(client)
    loads = stage_loads(path.to_frame(), crux_dask.get_load(client))
    assert set(loads["stage"]) <= set(STAGES) and len(loads)
    steps = path.to_frame().set_index("step")
    assert (loads["seconds"] == [steps.loc[s, stage] for s, stage in
                                 zip(loads["step"], loads["stage"])]).all()
    carried = loads[loads["samples"] > 0]
    assert len(carried) == len(loads)  # the nearest sample where none fell within
    assert carried[["cpu", "lag"]].notna().all().all()
    (worker,) = client.scheduler_info()["workers"]
    on_worker = loads[loads["process"] == worker]
    # Eight threads busy on fewer cores: oversubscribed, and the line says so.
    assert (on_worker["host_busy"] > on_worker["cores"]).any()
    line = describe(on_worker.sort_values("host_busy").iloc[-1])
    assert "busy threads on its host's" in line and "GIL contention" in line


def test_the_load_is_exported_and_read_back(oversubscribed, tmp_path):
    client = oversubscribed
    dataset = crux_dask.export_parquet(client, tmp_path / "run")
    exported = crux_dask.read_load(dataset)
    later = crux_dask.get_load(client)  # sampling goes on after the export
    assert len(exported) >= 2
    pd.testing.assert_frame_equal(exported, later.iloc[:len(exported)])


def test_an_oversubscribed_worker_is_told_to_have_fewer_threads(oversubscribed):
    client = oversubscribed
    path = crux_dask.get_wcp(client)
    # The stages in the worker (its reports, the dispatches it received, its start of
    # each task) outweigh the scheduler's decisions.
    worker_side = sum(path.breakdown[s] for s in ("report", "dispatch", "worker"))
    assert worker_side > 5 * path.breakdown["scheduler"], path.summary()
    advice = advise(path, crux_dask.get_load(client))
    said = advice["advice"].tolist()
    assert "fewer threads or workers per host" in said, advice.to_string()
    assert "more worker processes, fewer threads each" in said  # the GIL, measured
    why = advice.set_index("advice").loc["fewer threads or workers per host", "why"]
    assert f"on {len(os.sched_getaffinity(0))} cores" in why


def test_the_advice_on_the_cluster_s_shape_carries_the_what_if_s_prediction(oversubscribed):
    client = oversubscribed
    load = crux_dask.get_load(client)
    pag = crux_dask.get_pag(client)
    table = pag.suggest(load=load).set_index("change")
    fewer = table.loc["fewer threads or workers per host"]
    processes = table.loc["more worker processes, fewer threads each"]
    assert fewer["why"].endswith(f"predicted for 1 worker × {THREADS // 2} threads")
    assert processes["why"].endswith(f"predicted for {THREADS} workers × 1 thread")
    half = pag.what_if(threads=THREADS // 2, load=load)
    apart = pag.what_if(workers=THREADS, threads=1, load=load)
    assert fewer["predicted"] == pytest.approx(half.makespan)
    assert processes["predicted"] == pytest.approx(apart.makespan)
    assert processes["saved"] == pytest.approx(apart.saved)
    # Pure Python in one process takes turns on the GIL: processes, on the host's two
    # cores (the workers added join them: a local cluster grows on its machine), run
    # twice as many at once.  Against the recorded run: the unchanged replay of eight
    # threads taking turns on one GIL erred from -31 % to +34 % between runs, so what
    # a change saves against it moves as much.
    assert apart.makespan < 0.85 * apart.recorded, apart.summary()


def test_the_log_keeps_the_newest_samples_in_columns():
    log = LoadLog(most=100)
    for i in range(250):
        log.add(SCHEDULER if i % 2 else "tcp://10.0.0.1:1", float(i), cpu=i / 250)
    frame = log.frame()
    assert 100 <= len(frame) < 110 and log.dropped == 250 - len(frame)
    assert frame["time"].tolist() == [float(i) for i in range(250 - len(frame), 250)]
    assert (frame["process"] == SCHEDULER).tolist() == [t % 2 == 1 for t in frame["time"]]
    assert frame["lag"].isna().all() and list(frame.columns) == list(LOAD_COLUMNS)
    assert load_frame(log.columns()).equals(frame) and load_frame(None).empty
