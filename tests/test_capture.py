"""Capture on real clusters: the PAG against what Dask itself reports."""

from __future__ import annotations

import time

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
from dask.core import flatten
from distributed import Event, Worker, get_task_stream, wait
from distributed.utils_test import async_poll_for, gen_cluster, inc, poll_for

import crux_dask
from crux_dask.plugins import CruxSchedulerPlugin, CruxWorkerPlugin
from crux_dask.plugins.protocol import key_string
from crux_dask.plugins.tasks import priority_number


def slow_inc(x, delay=0.0):
    time.sleep(delay)
    return x + 1


def add(x, y):
    return x + y


def computed_states(pag, key):
    """States of ``key`` that a computation created."""
    m = pag.mutations
    made = m[m["kind"].isin(["APPEND", "CONVERT", "MERGE", "SPLIT"])]["dst"]
    states = pag.states
    return states[(states["key"] == key) & states["state_id"].isin(made)]


@gen_cluster(client=True, nthreads=[("127.0.0.1", 2)] * 2)
async def test_diamond_critical_path_goes_through_the_injected_sleep(c, s, a, b):
    await crux_dask.attach(c)
    top = dask.delayed(slow_inc)(1, dask_key_name="top")
    slow = dask.delayed(slow_inc)(top, 0.4, dask_key_name="slow")
    fast = dask.delayed(slow_inc)(top, 0.01, dask_key_name="fast")
    bottom = dask.delayed(add)(slow, fast, dask_key_name="bottom")
    assert await c.compute(bottom) == 6

    path = await crux_dask.get_wcp(c)
    keys = path.states["key"].tolist()
    assert keys[:4] == ["root", "top", "slow", "bottom"]
    step = path.steps[path.steps["key"] == "slow"].iloc[0]
    assert step["busy"] == pytest.approx(0.4, abs=0.010)
    assert path.length >= 0.4
    assert sum(path.breakdown.values()) == pytest.approx(path.length)


@gen_cluster(client=True)
async def test_transfer_matches_the_task_stream(c, s, a, b):
    await crux_dask.attach(c)
    async with get_task_stream(client=c) as stream:
        x = c.submit(lambda: b"x" * 1_000_000, key="x", workers=[a.address])
        y = c.submit(len, x, key="y", workers=[b.address])
        assert await y == 1_000_000
    pag = await crux_dask.get_pag(c)
    m, st = pag.mutations, pag.states.set_index("state_id")
    transfers = m[(m["kind"] == "TRANSFER") & (m["key"] == "x")
                  & m["dst"].map(st["location"]).str.startswith("memory@")]
    assert len(transfers) == 1
    edge = transfers.iloc[0]
    assert st.loc[edge["src"], "location"] == f"memory@{a.address}"
    assert st.loc[edge["dst"], "location"] == f"memory@{b.address}"
    assert st.loc[edge["dst"], "size"] >= 1_000_000

    reported = [ss for msg in stream.data for ss in msg["startstops"]
                if ss["action"] == "transfer"]
    assert len(reported) == 1
    assert reported[0]["source"] == a.address
    assert edge["busy"] == pytest.approx(reported[0]["stop"] - reported[0]["start"], abs=1e-6)
    # In the worker's estimate of the scheduler's clock, the task stream's in its
    # heartbeat's: in one process, both are within milliseconds of the one clock.
    assert edge["stop"] == pytest.approx(reported[0]["stop"], abs=0.02)
    # y read the copy, not the original.
    assert m[(m["key"] == "y") & (m["kind"] == "CONVERT")]["src"].tolist() == [edge["dst"]]


def check_against_task_stream(pag, stream_data):
    computes = [(str(msg["key"]), msg["worker"], msg["thread"], ss["stop"])
                for msg in stream_data for ss in msg["startstops"]
                if ss["action"] == "compute" and msg.get("status") == "OK"]
    assert computes
    states = pag.states
    computed = states[states["location"].str.startswith("memory@")
                      & states["thread"].notna()]
    index = computed.groupby("key")
    # The task stream's times are the worker's, moved by distributed's estimate of its
    # offset to the scheduler's clock (from its heartbeats: 21.5 ms wrong, in one process,
    # in a run on a loaded machine); Crux's have its own.  The two may differ by one shift
    # a worker, which stays within distributed's error; each task's end within 20 ms of it.
    matched = {}
    for key, worker, thread, stop in computes:
        rows = index.get_group(key) if key in index.groups else computed.iloc[:0]
        rows = rows[(rows["worker"] == worker) & (rows["thread"] == thread)]
        matched[key, worker, thread, stop] = (rows["time"] - stop).tolist()
    shifts = {}
    for (_, worker, _, _), found in matched.items():
        if len(found) == 1:
            shifts.setdefault(worker, []).append(found[0])
    shift = {worker: float(np.median(found)) for worker, found in shifts.items()}
    assert all(abs(value) <= 0.1 for value in shift.values()), shift
    missing = sum(len(found) != 1 or abs(found[0] - shift[worker]) > 0.02
                  for (_, worker, _, _), found in matched.items())
    assert missing == 0
    assert len(computed) == len(computes)  # no extra computations either


@gen_cluster(client=True, timeout=120)
async def test_every_computation_of_the_task_stream_is_a_state(c, s, a, b):
    await crux_dask.attach(c)
    async with get_task_stream(client=c) as stream:
        x = da.random.random((400, 400), chunks=(50, 400))
        y = x.rechunk((400, 50)).T.sum(axis=0)
        df = dask.datasets.timeseries(start="2000-01-01", end="2000-01-05", freq="1h",
                                      partition_freq="1D", seed=0)
        grouped = df.groupby("name").x.mean()
        await c.compute(y)
        await c.compute(grouped)
    pag = await crux_dask.get_pag(c)
    check_against_task_stream(pag, stream.data)


@gen_cluster(client=True)
async def test_release_is_a_delete(c, s, a, b):
    await crux_dask.attach(c)
    x = c.submit(inc, 1, key="x")
    await x
    del x
    # The worker records the release in the same transition that drops the data.
    await async_poll_for(lambda: "x" not in a.data and "x" not in b.data, timeout=10)
    pag = await crux_dask.get_pag(c)
    m = pag.mutations
    deletes = m[(m["kind"] == "DELETE") & (m["key"] == "x")]
    assert len(deletes) == 1
    tombstone = pag.states.set_index("state_id").loc[deletes.iloc[0]["dst"]]
    assert tombstone["size"] == 0


@gen_cluster(client=True)
async def test_scatter_and_gather_go_through_the_client(c, s, a, b):
    await crux_dask.attach(c)
    [data] = await c.scatter([list(range(1000))], workers=[a.address])
    total = c.submit(sum, data, key="total", workers=[a.address])
    assert await c.gather(total) == sum(range(1000))
    pag = await crux_dask.get_pag(c)
    st = pag.states.set_index("state_id")
    m = pag.mutations
    scattered = m[(m["key"] == data.key) & (m["kind"] == "TRANSFER")].iloc[0]
    assert st.loc[scattered["src"], "location"] == "client"
    assert st.loc[scattered["dst"], "location"] == f"memory@{a.address}"
    gathered = m[(m["key"] == "total") & (m["kind"] == "TRANSFER")]
    assert st.loc[gathered["dst"], "location"].tolist() == ["client"]
    path = await crux_dask.get_wcp(c)
    assert path.states["location"].iloc[-1] == "client"  # the workflow ends at the client
    assert "total" in path.states["key"].tolist()


@gen_cluster(client=True)
async def test_erred_task_is_marked(c, s, a, b):
    await crux_dask.attach(c)
    bad = c.submit(lambda x: 1 / 0, 1, key="bad")
    with pytest.raises(ZeroDivisionError):
        await bad
    pag = await crux_dask.get_pag(c)
    erred = pag.states[pag.states["key"] == "bad"]
    assert erred["origin"].tolist() == ["erred"]
    stats = await crux_dask.get_stats(c)
    assert stats["erred_tasks"] == 1 and stats["hook_errors"] == 0


@gen_cluster(client=True)
async def test_cancelled_future_leaves_no_computation(c, s, a, b):
    await crux_dask.attach(c)
    gate = Event()
    blocked = c.submit(lambda e: e.wait(), gate, key="blocked")
    follower = c.submit(inc, blocked, key="follower")
    # Cancel while 'blocked' runs on a worker and 'follower' waits for it.
    await async_poll_for(
        lambda: any(w.state.tasks["blocked"].state == "executing"
                    for w in (a, b) if "blocked" in w.state.tasks)
        and "follower" in s.tasks and s.tasks["follower"].state == "waiting",
        timeout=10)
    await c.cancel([follower, blocked])
    await gate.set()
    ok = c.submit(inc, 1, key="ok")
    assert await ok == 2
    pag = await crux_dask.get_pag(c)
    keys = set(pag.states["key"])
    assert "follower" not in keys and "ok" in keys
    assert not s.plugins["crux"].graph_roots  # nothing kept for tasks that never ran
    stats = await crux_dask.get_stats(c)
    assert stats["events_failed"] == 0 and stats["hook_errors"] == 0


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)],
    worker_kwargs={"memory_limit": "40 MiB"},
    config={
        "distributed.worker.memory.target": 0.2,
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.pause": False,
        "distributed.worker.memory.terminate": False,
    },
)
async def test_spill_and_unspill_are_transfers_through_disk(c, s, a):
    await crux_dask.attach(c)
    parts = c.map(lambda i: bytes(2_000_000) + bytes([i]), range(8),
                  key=[f"part-{i}" for i in range(8)])
    await wait(parts)
    assert a.data.slow  # the worker really spilled
    total = c.submit(lambda *xs: sum(map(len, xs)), *parts, key="total")
    assert await total == 8 * 2_000_001
    pag = await crux_dask.get_pag(c)
    st = pag.states.set_index("state_id")
    m = pag.mutations
    moves = m[m["kind"] == "TRANSFER"].assign(source=lambda f: f["src"].map(st["location"]),
                                              target=lambda f: f["dst"].map(st["location"]))
    to_disk = moves[moves["target"] == f"disk@{a.address}"]
    from_disk = moves[moves["source"] == f"disk@{a.address}"]
    assert len(to_disk) >= 1 and len(from_disk) >= 1
    assert set(from_disk["key"]) <= set(to_disk["key"])
    assert set(to_disk["key"]) <= {f"part-{i}" for i in range(8)}


def test_every_event_sent_is_applied_on_a_large_graph():
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.scheduler.transition-counter-max": False,
                          "distributed.worker.transition-counter-max": False}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address=":0") as cluster, Client(cluster) as c:
        crux_dask.attach(c)
        parts = c.map(inc, range(20_000))
        total = c.submit(sum, parts, key="total")
        assert total.result() == sum(range(1, 20_001))
        del parts
        # Every part released on every worker (its DELETE is recorded in the same
        # transition that drops the data), then sent by the flush.
        def held_parts(dask_worker) -> int:
            return sum(str(key).startswith("inc-") for key in dask_worker.data)

        poll_for(lambda: sum(c.run(held_parts).values()) == 0, timeout=60)
        crux_dask.flush(c)
        stats = crux_dask.get_stats(c)
        pag = crux_dask.get_pag(c)
    sent = sum(w["events_sent"] for w in stats["workers"].values())
    recorded = sum(w["events_recorded"] for w in stats["workers"].values())
    dropped = sum(w["events_dropped"] for w in stats["workers"].values())
    buffered = sum(w["events_buffered"] for w in stats["workers"].values())
    assert sent > 20_000 and dropped == 0 and sent + buffered == recorded
    assert stats["events_from_workers"] == sent, stats
    assert stats["events_applied"] == stats["events_received"]
    assert stats["events_pending"] == 0 and stats["events_parked"] == 0
    assert stats["events_failed"] == 0 and stats["batches_rejected"] == 0
    assert stats["batches_in_columns"] > 0  # the releases came in batches large enough
    m = pag.mutations
    assert m[m["kind"] == "APPEND"]["dst"].nunique() == 20_000
    released = m[(m["kind"] == "DELETE") & m["key"].str.startswith("inc-")]
    assert released["key"].nunique() == 20_000
    assert computed_states(pag, "total")["size"].item() > 0


@gen_cluster(client=True)
async def test_attach_is_idempotent(c, s, a, b):
    await crux_dask.attach(c)
    await crux_dask.attach(c)
    assert isinstance(s.plugins["crux"], CruxSchedulerPlugin)
    assert list(s.plugins) .count("crux") == 1
    assert isinstance(a.plugins["crux"], CruxWorkerPlugin)
    await c.submit(inc, 1, key="one")
    pag = await crux_dask.get_pag(c)
    assert len(computed_states(pag, "one")) == 1


@gen_cluster(client=True)
async def test_attached_mid_run_records_from_then_on_and_says_so(c, s, a, b):
    before = c.submit(inc, 1, key="before")
    await before
    await crux_dask.attach(c)
    after = c.submit(inc, before, key="after")
    assert await after == 3
    stats = await crux_dask.get_stats(c)
    assert stats["tasks_at_attach"] == 1
    pag = await crux_dask.get_pag(c)
    keys = set(pag.states["key"])
    assert "after" in keys
    # 'before' predates the capture: it appears, from the root, as a stand-in.
    stand_in = pag.states[pag.states["key"] == "before"]
    assert len(stand_in) >= 1 and (stand_in["size"] == 0).all()


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_late_joining_worker_gets_the_plugin(c, s, a):
    await crux_dask.attach(c)
    async with Worker(s.address, nthreads=1) as late:
        assert "crux" in late.plugins
        x = c.submit(lambda: b"y" * 1000, key="x", workers=[a.address])
        y = c.submit(len, x, key="y", workers=[late.address])
        assert await y == 1000
        pag = await crux_dask.get_pag(c)
        st = pag.states
        assert f"memory@{late.address}" in set(st[st["key"] == "x"]["location"])


@gen_cluster(client=True,
             scheduler_kwargs={"preload": ["crux_dask.plugins"]},
             worker_kwargs={"preload": ["crux_dask.plugins"]})
async def test_preload_installs_both_plugins(c, s, a, b):
    assert "crux" in s.plugins and "crux" in a.plugins and "crux" in b.plugins
    await c.submit(inc, 1, key="one")
    pag = await crux_dask.get_pag(c)
    assert len(computed_states(pag, "one")) == 1


@gen_cluster(client=True)
async def test_annotations_override_the_mutation(c, s, a, b):
    await crux_dask.attach(c)
    x = c.submit(inc, 1, key="x")
    with dask.annotate(crux={"mutation": "APPEND", "label": "out.nc",
                             "location": "file@node1:/out.nc"}):
        written = dask.delayed(inc)(x, dask_key_name="write")
    await c.compute(written)
    pag = await crux_dask.get_pag(c)
    state = pag.states[pag.states["key"] == "write"].iloc[0]
    assert (state["label"], state["location"]) == ("out.nc", "file@node1:/out.nc")
    edge = pag.mutations[pag.mutations["dst"] == state["state_id"]].iloc[0]
    assert edge["kind"] == "APPEND"


def test_local_cluster_with_processes():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        a = dask.delayed(slow_inc)(1, 0.05, dask_key_name="a")
        b = dask.delayed(slow_inc)(a, 0.3, dask_key_name="b")
        c = dask.delayed(slow_inc)(a, 0.01, dask_key_name="c")
        d = dask.delayed(add)(b, c, dask_key_name="d")
        assert d.compute() == 6
        path = crux_dask.get_wcp(client)
        assert "b" in path.states["key"].tolist()
        stats = crux_dask.get_stats(client)
        assert stats["events_failed"] == 0 and stats["hook_errors"] == 0
        assert isinstance(crux_dask.get_pag(client).states, pd.DataFrame)


@gen_cluster(client=True)
async def test_a_rescheduled_task_keeps_the_path_consistent(c, s, a, b):
    from distributed import Reschedule

    def once_elsewhere(x: int) -> int:
        from distributed import get_worker

        worker = get_worker()
        if not getattr(worker, "rescheduled_once", False):  # the first try gives up
            worker.rescheduled_once = True
            raise Reschedule()
        return x + 1

    await crux_dask.attach(c)
    x = c.submit(slow_inc, 0, 0.05, key="x", workers=[a.address])
    y = c.submit(once_elsewhere, x, key="y", workers=[a.address])
    assert await y == 2
    # It really went back from processing, and ran again.
    moves = [(start, finish) for _, start, finish, *_ in s.story("y")]
    assert ("processing", "released") in moves, moves
    path = await crux_dask.get_wcp(c)
    assert path.states["key"].iloc[-1] == "y"
    assert sum(path.breakdown.values()) == pytest.approx(path.length, abs=1e-6)
    stats = await crux_dask.get_stats(c)
    assert stats["hook_errors"] == 0 and stats["events_failed"] == 0


@gen_cluster(client=True)
async def test_each_task_keeps_the_priority_dask_gave_it(c, s, a, b):
    """Priorities sort the recorded tasks as the scheduler's tuples sort them.

    Two graphs (two generations), the second with a user priority, so that
    every part of Dask's ``(-user priority, generation, order)`` counts.
    """
    await crux_dask.attach(c)
    first = c.persist(da.ones((40, 40), chunks=10).sum(axis=0))
    await wait(first)
    second = c.persist(da.zeros((40, 40), chunks=10).T.sum(axis=1), priority=1)
    await wait(second)
    pag = await crux_dask.get_pag(c)
    moments = pag.moments.set_index("state_id")
    states = pag.states.set_index("state_id")
    recorded = {states.at[sid, "key"]: number
                for sid, number in moments["priority"].dropna().items()}
    tuples = {key_string(ts.key): ts.priority for ts in s.tasks.values()}
    assert set(tuples) <= set(recorded) and len(tuples) > 30
    by_dask = sorted(tuples, key=tuples.__getitem__)
    numbers = [recorded[key] for key in by_dask]
    assert numbers == sorted(numbers)
    assert len(set(numbers)) == len(numbers)
    # The user priority runs the second graph's tasks first.
    firsts, seconds = ({key_string(k) for k in flatten(x.__dask_keys__())}
                       for x in (first, second))
    assert max(recorded[k] for k in seconds) < min(recorded[k] for k in firsts)


def test_a_priority_number_sorts_as_dask_priority_tuples():
    """Every part of the tuple counts, in Dask's order; anything else is not recorded."""
    tuples = [(-1, 2, 7), (0, 1, 5), (0, 1, 6), (0, 1.99, 0), (0, 2, 0), (0, 2, 2**31),
              (0, 3, 0), (1, 0, 0)]
    numbers = [priority_number(t) for t in tuples]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    for bad in (None, (0, 1), [0, 1, 2], (0, "1", 2), (0, float("nan"), 1), (0, 1, 2, 3)):
        assert priority_number(bad) is None
