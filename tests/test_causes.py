"""Causes besides data: tasks that waited for a thread or a queue slot, on real clusters.

Contention is built so that the answer is known: tasks that queue for one
thread must form the path; on Dask's own collections, the time no recorded
interval explains stays small.  Dask's task stream is the independent witness
of what ran where and when.
"""

from __future__ import annotations

import math
import time

import dask
import dask.array as da
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.task_stream import TaskStreamPlugin

import crux_dask
from crux_dask import PAGBuilder
from crux_dask.load import stage_loads
from crux_dask.path import CATEGORIES, PARTS

A = "tcp://10.0.0.1:1"
B = "tcp://10.0.0.2:1"


def work(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i


def gather(*parts: int) -> int:
    return sum(parts)


def fan_in(n: int, seconds, name: str = "work"):
    """``n`` independent tasks of ``seconds(i)`` each, summed by one task."""
    parts = [dask.delayed(work)(i, seconds(i), dask_key_name=f"{name}-{i}") for i in range(n)]
    return dask.delayed(gather)(*parts, dask_key_name=f"{name}-total")


def add_task_stream(dask_scheduler) -> None:
    dask_scheduler.add_plugin(TaskStreamPlugin(dask_scheduler), name="test-task-stream")


def task_stream(dask_scheduler) -> list[dict]:
    return list(dask_scheduler.plugins["test-task-stream"].buffer)


def check_breakdown(path) -> None:
    assert set(path.breakdown) == set(CATEGORIES)
    assert sum(path.breakdown.values()) == pytest.approx(path.length, abs=1e-6)
    # Only wait may be a little negative: each worker converts its times with its own
    # estimate of the scheduler's clock, so a step from one worker's task to another's
    # can come out milliseconds short.
    assert all(seconds >= -1e-9 for category, seconds in path.breakdown.items()
               if category != "wait"), path.breakdown
    assert path.breakdown["wait"] >= -0.01 * len(path)


def check_stages(pag, path) -> None:
    """Each step's parts add up to its cost, and each stage of its scheduling lies between
    the two moments recorded for it (from the graph's moments table)."""
    steps = path.to_frame()
    parts = steps["busy"] + steps[list(PARTS)].sum(axis=1)
    assert (parts - steps["cost"]).abs().max() <= 1e-3
    moments = pag.moments.set_index("state_id").reindex(pd.concat([steps["src"],
                                                                    steps["dst"]]).unique())
    at = {name: moments[name].reindex(steps["dst"]).to_numpy() for name in moments}
    src_time = steps["stop"] - steps["cost"]
    announced = moments["announced"].reindex(steps["src"]).to_numpy()
    # A gather's report ends at the client's request where the scheduler's learning of
    # the task was not recorded (the client's copy came from another worker).
    gathered = (steps["destination"] == "client").to_numpy()
    reported = np.where(gathered & np.isnan(announced), at["requested"], announced)
    bounds = {
        "report": reported - src_time,
        "scheduler": at["requested"] - src_time,
        "dispatch": at["received"] - at["requested"],
        "worker": steps["start"] - at["received"],
    }
    for stage, most in bounds.items():
        most = pd.Series(most, index=steps.index)
        assert (steps[stage][most.isna()] == 0).all(), stage  # no moments, no stage
        assert (steps[stage] <= most.clip(lower=0) + 1e-9)[most.notna()].all(), stage


def warm_up(client: Client) -> None:
    """Every worker has run this module's code once: the first task on a fresh
    worker imports the module, which would count as its dispatch."""
    for worker in client.scheduler_info()["workers"]:
        client.submit(work, 0, 0.0, workers=[worker], pure=False).result()


@pytest.fixture(scope="module")
def one_thread():
    # The scheduler sends every task at once (it queues none), so that each waits for
    # the thread alone, however loaded the machine: with a queue, a task sent late is
    # released by the task that freed its slot instead, and the thread chain breaks.
    with dask.config.set({"distributed.scheduler.worker-saturation": float("inf")}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                         dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        client.run_on_scheduler(add_task_stream)
        warm_up(client)
        yield client


def test_tasks_queued_for_one_thread_are_the_path(one_thread):
    client = one_thread
    fan_in(10, lambda i: 0.12).compute()
    path = crux_dask.get_wcp(client)
    steps = path.to_frame()
    works = steps[steps["key"].str.match(r"work-\d+$") & (steps["category"] == "compute")]
    # Dask's task stream: the order the ten ran in on the thread, and when.
    stream = {r["key"]: r for r in client.run_on_scheduler(task_stream)}

    def ran(key: str) -> tuple[float, float]:
        compute = next(s for s in stream[key]["startstops"] if s["action"] == "compute")
        return compute["start"], compute["stop"]

    order = sorted((f"work-{i}" for i in range(10)), key=ran)
    # Back from the last, each task waited for the one before it on the thread as long
    # as it could run before that one finished (on a loaded machine, a task may reach
    # its worker late): that chain, all ten as a rule, is the path.
    # (Crux's times: each worker's own estimate of the scheduler's clock, which the
    # task stream's, the worker's heartbeat's, differ from.)
    pag = crux_dask.get_pag(client)
    moments = pag.moments.merge(pag.states[["state_id", "key"]], on="state_id")
    runnable = moments.drop_duplicates("key").set_index("key")["runnable"]
    computed = pag.states[pag.states["thread"].notna()]
    stopped = computed.drop_duplicates("key").set_index("key")["time"]
    chain = [order[-1]]
    for before, after in zip(order[-2::-1], order[:0:-1]):
        if not runnable[after] < stopped[before]:
            break
        chain.insert(0, before)
    assert len(chain) >= 5
    assert list(works["key"]) == chain
    assert (works["via"].iloc[1:] == "thread").all()
    assert path.breakdown["wait"] <= 0.1 * path.length
    check_breakdown(path)
    for step in works.itertuples():  # the same runs, as long, in the two clocks
        start, stop = ran(step.key)
        assert step.stop - step.start == pytest.approx(stop - start, abs=1e-6)
        assert step.start == pytest.approx(start, abs=0.25)


def test_reads_of_more_files_than_threads_wait_for_the_reads_before_them(one_thread,
                                                                          tmp_path):
    # Eight files for one thread: each read waits for the thread the task before it
    # held, and the path walks through them, not through one long wait of a read.
    client = one_thread
    for i in range(8):
        pd.DataFrame({"x": np.random.default_rng(i).random(800_000)}).to_parquet(
            tmp_path / f"part.{i}.parquet")
    dd.read_parquet(tmp_path).x.sum().compute()
    path = crux_dask.get_wcp(client)
    check_breakdown(path)
    check_stages(crux_dask.get_pag(client), path)
    steps = path.to_frame()
    # Which of a partition's tasks a thread step reaches depends on the order the
    # worker ran them in (a read may run before the task before it ends); that the path
    # walks through the partitions, one thread after another, does not.
    ran = steps[(steps["category"] == "compute") & (steps["kind"] != "APPEND")]  # tasks
    partitions = {key.rsplit(",", 1)[-1] for key in ran["key"]}
    assert steps["label"].str.startswith("read_parquet").any(), steps.to_string()
    assert len(partitions) >= 3 and (steps["via"] == "thread").sum() >= 4, steps.to_string()
    # The first file's content into memory waited only for its task's arrival: far
    # less than the tasks after it held the thread.
    first = steps[steps["category"] == "io"].iloc[0]
    tasks = steps[steps["category"] == "compute"]
    held = (tasks["busy"] + tasks["io"]).iloc[1:].sum()
    assert first["cost"] <= 0.5 * held, steps.to_string()
    # Dask's task stream: the tasks on the path ran in the path's order.  (Their start
    # and stop carry the worker's clock offset, which a heartbeat between two tasks
    # may move by a millisecond: the order is what a stream on one thread proves.)
    stream = {str(r["key"]): r for r in client.run_on_scheduler(task_stream)}
    starts = [next(s["start"] for s in stream[key]["startstops"] if s["action"] == "compute")
              for key in ran["key"]]
    assert starts == sorted(starts), starts


def test_a_graph_without_contention_has_no_thread_cause(one_thread):
    client = one_thread
    chain = dask.delayed(work)(0, 0.05, dask_key_name="alone-0")
    for i in range(1, 4):
        chain = dask.delayed(work)(chain, 0.05, dask_key_name=f"alone-{i}")
    chain.compute()
    path = crux_dask.get_wcp(client)
    assert set(path.to_frame()["via"]) == {"data"}  # each task waited for its input only
    assert path.breakdown["compute"] >= 0.6 * path.length
    check_breakdown(path)


@pytest.fixture(scope="module")
def two_by_two():
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        warm_up(client)
        yield client


def test_two_workers_one_thread_each_chain_on_one_worker():
    # As on one thread: every task is sent at once, four to each worker, and each
    # waits for its thread alone (the queue slots are checked in test_queue.py); no
    # stealing, which on a loaded machine moves a waiting task to the other worker.
    with dask.config.set({"distributed.scheduler.worker-saturation": float("inf"),
                          "distributed.scheduler.work-stealing": False}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        warm_up(client)
        fan_in(8, lambda i: 0.12).compute()
        path = crux_dask.get_wcp(client)
    steps = path.to_frame()
    works = steps[steps["key"].str.match(r"work-\d+$") & (steps["category"] == "compute")]
    # At least half the tasks, one after another on one thread.
    assert len(works) >= 4
    assert works["destination"].nunique() == 1
    assert (works["via"].iloc[1:] == "thread").all()
    assert path.breakdown["compute"] >= 0.8 * path.length
    check_breakdown(path)


def test_the_thread_of_the_slow_task_is_the_path(two_by_two):
    client = two_by_two
    fan_in(16, lambda i: 0.6 if i == 5 else 0.05, name="mixed").compute()
    path = crux_dask.get_wcp(client)
    steps = path.to_frame()
    assert "mixed-5" in set(steps["key"])
    assert path.breakdown["compute"] >= 0.6 * path.length
    check_breakdown(path)


def frame(seed: int = 1) -> dd.DataFrame:
    return dask.datasets.timeseries(start="2000-01-01", end="2000-01-05", freq="10s",
                                    partition_freq="1D", seed=seed).reset_index()


def tree():
    def inc(x: int) -> int:
        time.sleep(0.01)
        return x + 1

    layer = [dask.delayed(inc)(i) for i in range(32)]
    while len(layer) > 1:
        layer = [dask.delayed(gather)(a, b) for a, b in zip(layer[::2], layer[1::2])]
    return layer[0]


COLLECTIONS = {
    "array matmul": lambda: (lambda x: (x @ x.T).sum())(
        da.random.random((2000, 2000), chunks=(500, 500))),
    "array rechunk": lambda: da.random.random((3000, 3000), chunks=(300, 3000))
    .T.rechunk((3000, 300)).sum(),
    "bag foldby": lambda: db.from_sequence(range(200_000), npartitions=16).foldby(
        lambda x: x % 10, lambda a, x: a + x, 0, lambda a, b: a + b, 0),
    "delayed tree": tree,
    "p2p groupby": lambda: frame().groupby("name").x.mean(split_out=4, shuffle_method="p2p"),
    "p2p hash join": lambda: frame().merge(frame(2), on="id", shuffle_method="p2p").size,
}


@pytest.mark.parametrize("name", list(COLLECTIONS))
def test_every_second_of_a_real_collection_has_a_cause(two_by_two, name):
    client = two_by_two
    dask.compute(COLLECTIONS[name]())
    path = crux_dask.get_wcp(client)
    check_breakdown(path)
    check_stages(crux_dask.get_pag(client), path)
    # Every stage over a tenth of the path carries the load it ran under.
    loads = stage_loads(path.to_frame(), crux_dask.get_load(client))
    long = loads[loads["seconds"] >= 0.1 * path.length]
    assert (long["samples"] > 0).all() and long[["cpu", "lag"]].notna().all().all()
    steps = path.to_frame()[["via", "kind", "key", "busy", *PARTS]]
    # Every second of the path's scheduling is a stage of its own.
    assert path.breakdown["wait"] + path.breakdown["scheduling"] <= 0.1 * path.length, \
        f"{path.summary()}\n{steps.to_string()}"
    assert len(path) >= 3


def test_the_client_fetching_a_result_is_client_time_from_when_the_scheduler_saw_it(
        two_by_two):
    # The worker records the gather, not when the client asked: the scheduler's moment
    # of the task's end splits the time before it, checked against its own story.
    client = two_by_two
    fan_in(4, lambda i: 0.05, name="fetched").compute()
    path = crux_dask.get_wcp(client)
    before, last = path.to_frame().iloc[-2], path.to_frame().iloc[-1]
    assert (last["key"], last["kind"], last["destination"]) == (
        "fetched-total", "TRANSFER", "client")
    moments = crux_dask.get_pag(client).moments.set_index("state_id")
    requested = moments.loc[last["dst"], "requested"]
    finished = client.run_on_scheduler(lambda dask_scheduler: [
        at for _, start, finish, *_, at in dask_scheduler.story("fetched-total")
        if (start, finish) == ("processing", "memory")][-1])
    assert requested == pytest.approx(finished, abs=0.005)
    # Each worker converts its times with its own estimate of the scheduler's clock: the
    # task may seem to end after the scheduler saw it end.
    assert last["client"] == pytest.approx(last["start"] - max(requested, before["stop"]),
                                           abs=1e-6)
    assert last["client"] > 0
    assert last["wait"] == pytest.approx(0.0, abs=1e-6)
    check_breakdown(path)


def test_when_the_scheduler_learnt_a_task_finished_is_in_its_own_story(two_by_two):
    # The announced moment is the scheduler's transition of the task to memory: its
    # transition log is the independent witness.
    client = two_by_two
    fan_in(8, lambda i: 0.02, name="announced").compute()
    pag = crux_dask.get_pag(client)
    moments = pag.moments.set_index("state_id")["announced"].dropna()
    keys = pag.states.set_index("state_id").loc[moments.index, "key"]
    learnt = dict(zip(keys, moments))
    finished = client.run_on_scheduler(lambda dask_scheduler: {
        key: at for key, start, finish, *_, at in dask_scheduler.story(*learnt)
        if (start, finish) == ("processing", "memory")})
    ours = {key: at for key, at in learnt.items() if key.startswith("announced")}
    assert len(ours) == 9  # every task of the graph, and the total
    for key, at in ours.items():
        assert at == pytest.approx(finished[key], abs=0.005), key


# -- the rules, on events built by hand --------------------------------------------
def test_a_task_runnable_before_its_thread_was_free_waited_for_the_task_before():
    b = PAGBuilder()
    b.root(0.0)
    first = b.compute("first", A, 7, 0.0, 1.0, 8, (), sent=0.0, received=0.0, runnable=0.0)
    second = b.compute("second", A, 7, 1.0, 2.0, 8, (), sent=0.0, received=0.0,
                       runnable=0.0)
    third = b.compute("third", A, 7, 3.0, 4.0, 8, (), sent=2.5, received=2.9, runnable=2.9)
    causes = b.pag().causes
    assert causes[["src", "dst", "kind"]].values.tolist() == [[first, second, "THREAD"]]
    path = b.pag().wcp(end=second)
    assert path.to_frame()["via"].tolist() == ["data", "thread"]
    # The third task was not there yet when the thread freed: no cause.
    assert third not in set(causes["dst"])


def test_a_slot_cause_reported_before_the_task_that_freed_it_waits_for_it():
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0.0, 0.5, 8, ())
    # The queued task's report comes first; its releaser waits for a fetch of x.
    queued = ("compute", "queued", B, 2, 1.2, 2.0, 8, (), -1, None, None, None, None, None,
              None, 1.1, 1.15, 1.15, "freer", B)
    assert b.apply(queued) is None
    freer = b.compute("freer", B, 1, 0.6, 1.0, 8, ("x",))
    assert freer is None  # waits for the fetch of x to B
    b.transfer("x", f"memory@{A}", f"memory@{B}", 0.5, 0.6)
    causes = b.pag().causes
    states = b.pag().states.set_index("state_id")
    (row,) = causes.itertuples()
    assert (states.loc[row.src, "key"], states.loc[row.dst, "key"], row.kind) == (
        "freer", "queued", "SLOT")
    assert b.pag().wcp().to_frame()["via"].iloc[-1] == "slot"


def test_a_releaser_never_reported_leaves_the_task_without_a_cause():
    b = PAGBuilder()
    b.root(0.0)
    b.apply(("compute", "queued", B, 2, 1.2, 2.0, 8, (), -1, None, None, None, None, None,
             None, 1.1, 1.15, 1.15, "gone", A))
    assert b.n_parked == 1
    assert b.resolve_parked() == 1
    assert len(b.pag().causes) == 0
    path = b.pag().wcp()
    assert path.to_frame()["via"].tolist() == ["data"]
    check_breakdown(path)


@pytest.mark.parametrize(("moments", "parts"), [
    ({}, {"wait": 1.0}),  # nothing recorded: nothing explained
    ({"sent": 0.5}, {"scheduler": 0.5, "scheduling": 0.5}),  # its arrival not recorded
    ({"sent": 0.5, "received": 0.7}, {"scheduler": 0.5, "dispatch": 0.2, "worker": 0.3}),
])
def test_the_time_before_a_task_is_the_stages_its_moments_bound(moments, parts):
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 1.0, 2.0, 8, (), **moments)
    path = b.pag().wcp()
    gaps = {part: path.breakdown[part] for part in PARTS if path.breakdown[part]}
    assert gaps == pytest.approx(parts)
    assert path.breakdown["compute"] == pytest.approx(1.0)


@pytest.mark.parametrize(("announced", "parts"), [
    (2.1, {"report": 0.1, "scheduler": 0.2, "dispatch": 0.05, "worker": 0.15}),
    # Not recorded: the worker's message and the scheduler's decision are one.
    (None, {"scheduling": 0.3, "dispatch": 0.05, "worker": 0.15}),
])
def test_a_task_waits_for_its_input_to_be_reported_then_to_be_sent(announced, parts):
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 1.0, 2.0, 8, (), sent=0.5, received=0.6, announced=announced)
    b.compute("y", A, 1, 2.5, 3.0, 8, ("x",), sent=2.3, received=2.35)
    steps = b.pag().wcp().to_frame()
    last = steps.iloc[-1]
    assert last["key"] == "y"
    gaps = {part: last[part] for part in PARTS if abs(last[part]) > 1e-9}
    assert gaps == pytest.approx(parts)


def test_a_fetch_that_waited_for_transfer_capacity_is_queued():
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0.0, 1.0, 8, (), sent=0.0)
    b.transfer("x", f"memory@{A}", f"memory@{B}", 1.5, 1.7, 8)  # no request time: wait
    b.apply(("transfer", "x", f"memory@{A}", f"memory@{B}", 2.5, 2.8, 8, 1.2))
    steps = b.pag().wcp().to_frame()
    fetch = steps.iloc[-1]
    assert (fetch["scheduling"], fetch["queued"], fetch["busy"]) == pytest.approx(
        (0.2, 1.3, 0.3))
    assert math.isclose(fetch["wait"], 0.0, abs_tol=1e-12)


def test_a_fetch_from_a_copy_has_no_report_of_that_copy():
    # x made on A (its announcement not recorded), fetched to B, released on A, then
    # fetched back from B's copy: the scheduler learns of a copy from the worker that
    # fetched it, which is no moment to wait for, so the way back is all scheduler.
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0.0, 1.0, 8, (), sent=0.0, received=0.1)
    b.apply(("transfer", "x", f"memory@{A}", f"memory@{B}", 1.1, 1.2, 8, 1.05))
    b.delete("x", f"memory@{A}", 1.3)
    b.apply(("transfer", "x", f"memory@{B}", f"memory@{A}", 2.0, 2.1, 8, 1.9))
    fetch = b.pag().wcp().to_frame().iloc[-1]
    assert fetch["source"] == f"memory@{B}" and fetch["destination"] == f"memory@{A}"
    assert (fetch["scheduler"], fetch["queued"], fetch["busy"]) == pytest.approx(
        (0.7, 0.1, 0.1))
    assert fetch["scheduling"] == 0.0 and fetch["report"] == 0.0
    # The first fetch's source is x's own state: its report went unrecorded.
    first = b.pag().wcp().to_frame().iloc[-2]
    assert (first["scheduling"], first["queued"]) == pytest.approx((0.05, 0.05))


def test_a_task_sent_again_was_rescheduled_from_its_first_sending_to_its_last():
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0.0, 1.0, 8, (), sent=0.0)
    b.compute("y", A, 1, 3.0, 4.0, 8, ("x",), sent=2.5, first_requested=1.2)
    step = b.pag().wcp().to_frame().iloc[-1]
    # From x (1.0) to y's first sending (1.2), and from its last (2.5) to its start (3.0).
    assert (step["scheduling"], step["rescheduled"], step["busy"]) == pytest.approx(
        (0.7, 1.3, 1.0))
    check_breakdown(b.pag().wcp())


def test_data_of_an_earlier_computation_waited_for_the_client_before_the_scheduler():
    # x computed by the first graph; a second graph, submitted an hour later, uses it.
    b = PAGBuilder()
    first = b.root(0.0)
    b.compute("x", A, 1, 1.0, 2.0, 8, root=first, sent=0.5, received=0.6, runnable=0.6)
    second = b.root(3602.0)
    b.compute("y", A, 1, 3603.0, 3604.0, 8, ("x",), root=second, sent=3602.5,
              received=3602.6, runnable=3602.6)
    path = b.pag().wcp()
    assert path.states["key"].tolist()[-2:] == ["x", "y"]
    step = path.to_frame().iloc[-1]
    assert step["client"] == pytest.approx(3600.0)  # from x's stop to the second graph
    # From then to y's start: sent (x's report not recorded), received, started.
    assert [step[part] for part in ("scheduling", "dispatch", "worker")] == pytest.approx(
        [0.5, 0.1, 0.4])
    assert path.breakdown["client"] == pytest.approx(3600.0)
    check_breakdown(path)
    # A task of the graph that made its input waited for no client.
    assert path.to_frame().iloc[0]["client"] == 0.0
