"""Hooks and requests only record or read; the ingest applies, a bounded slice at a time."""

from __future__ import annotations

import asyncio
import json
import time

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.utils_test import async_poll_for, gen_cluster, gen_test
from tornado.httpclient import AsyncHTTPClient

import crux_dask
from crux_dask.codec import encode_batch
from crux_dask.dashboard.data import live_source
from crux_dask.dashboard.off_loop import OffLoop
from crux_dask.dashboard.steps import StepsTable
from crux_dask.graph.builder import PAGBuilder
from crux_dask.plugins.entries import Whole
from crux_dask.plugins.ingest import Ingest
from crux_dask.plugins.protocol import FILES
from crux_dask.plugins.spool import Spool

from workloads import chain

TOKEN = "s3cret-token"
DASHBOARD = {"dashboard": True, "dashboard_address": ":0"}
#: The graph built in the scheduler's process, where a hook could apply events.
IN_SCHEDULER = {"crux-dask.graph-process": False}


def new_ingest(slice_events: int, max_pending: int = 1_000_000) -> Ingest:
    builder = PAGBuilder()
    builder.root(0.0)
    return Ingest(builder, Spool(None, None), max_pending=max_pending, park_timeout=10.0,
                  slice_events=slice_events, slice_seconds=None)


def computations(n: int, prefix: str = "t", start: float = 0.0) -> list[tuple]:
    """``n`` computations without inputs, one a second from ``start``, each making one state."""
    return [("compute", f"{prefix}-{i}", "tcp://w:1", 1, start + i, start + i + 0.5, 8, (), 0,
             None, None, None, None, None, None) for i in range(n)]


def test_a_slice_applies_at_most_slice_events():
    ingest = new_ingest(slice_events=100)
    for event in computations(250):
        ingest.record(event)
    assert ingest.builder.n_applied == 1  # recording applied nothing (the root aside)
    assert [ingest.apply_slice() for _ in range(4)] == [100, 100, 50, 0]
    assert ingest.builder.n_applied == 251 and ingest.pending == 0
    assert ingest.counts["events_applied"] == 250 == ingest.received


def test_a_message_without_events_is_a_worker_timing_a_round_trip():
    ingest = new_ingest(slice_events=600)
    asked = time.time()
    reply = ingest.receive(source="tcp://w:1")
    assert reply.keys() == {"status", "accepted", "time"}
    assert (reply["status"], reply["accepted"]) == ("OK", 0)
    assert asked <= reply["time"] <= time.time()
    assert ingest.counts["batches_received"] == ingest.counts["batches_rejected"] == 0


def test_a_worker_batch_larger_than_a_slice_is_split():
    ingest = new_ingest(slice_events=600)
    for event in computations(100, "a"):
        ingest.record(event)
    asked = time.time()
    reply = ingest.receive(encode_batch(computations(1000, "b", 100.0), "tcp://w:1", 1))
    # With the scheduler's clock as it answered, for the worker's estimate of it.
    assert reply.keys() == {"status", "accepted", "time"}
    assert (reply["status"], reply["accepted"]) == ("OK", 1000)
    assert asked <= reply["time"] <= time.time()
    assert ingest.counts["batches_in_columns"] == 1
    for event in computations(10, "c", 1100.0):
        ingest.record(event)
    # What does not fit after the first events waits for the next slice, in order.
    assert [ingest.apply_slice() for _ in range(4)] == [600, 510, 0, 0]
    assert ingest.builder.n_applied == 1 + 1110
    keys = ingest.builder.store.keys.values
    assert keys[1:] == [f"a-{i}" for i in range(100)] + [f"b-{i}" for i in range(1000)] + [
        f"c-{i}" for i in range(10)]


def test_a_task_that_opened_many_files_is_applied_over_several_slices():
    def task(key: str, start: float, n_files: int) -> tuple:
        files = [0.1, "node1", [[f"/d/{key}-{i}", False, 10] for i in range(n_files)]]
        return Whole(key, "memory", "tcp://w:1", 1,
                [{"action": "compute", "start": start, "stop": start + 0.5}], 8, [], "t", "t",
                None, None, {FILES: files}, start + 0.5)

    ingest = new_ingest(slice_events=100)
    for item in (task("big", 1.0, 250), task("small", 2.0, 1)):
        ingest.queue.append(item)
        ingest.pending += 1
    # 250 reads and the task, then the other task and its read: at most a slice at a time.
    applied = []
    while ingest.queue or ingest.backlog:
        before = ingest.builder.n_applied
        ingest.apply_slice()
        applied.append(ingest.builder.n_applied - before)
    assert applied == [100, 100, 53]
    states = ingest.builder.pag().states
    assert states["key"].tolist()[-2:] == ["/d/small-0", "small"]
    big = states.index[states["key"] == "big"][0]
    mutations = ingest.builder.pag().mutations
    assert (mutations["dst"] == big).sum() == 250  # every file it read is an input
    assert ingest.counts["events_applied"] == 2 == ingest.received


def test_a_slice_is_applied_in_the_order_things_happened():
    # As the scheduler receives them: each task first, then, in its worker's next
    # batch, the fetch of its input that happened before it ran.
    def received(in_columns: bool) -> Ingest:
        ingest = new_ingest(slice_events=1000)
        for key in ["x", *(f"z-{i}" for i in range(600))]:
            ingest.builder.compute(key, "tcp://a:1", 1, 0.0, 0.5, 8, ())
        tasks = [("compute", f"y-{i}", "tcp://b:1", 1, 2.0 + i, 2.5 + i, 8, ("x",), 0,
                  None, None, None, None, None, None) for i in range(3)]
        fetch = [("transfer", "x", "memory@tcp://a:1", "memory@tcp://b:1", 1.0, 1.5, 8)]
        for event in tasks:
            ingest.record(event)
        if in_columns:  # enough other fetches for the batch to travel in columns
            fetch += [("transfer", f"z-{i}", "memory@tcp://a:1", "memory@tcp://b:1",
                       1.6, 1.7, 8) for i in range(600)]
            assert ingest.receive(encode_batch(fetch, "tcp://b:1", 1))["status"] == "OK"
            assert ingest.counts["batches_in_columns"] == 1
        else:
            ingest.record(fetch[0])
        ingest.apply_slice()
        return ingest

    for in_columns in (False, True):
        ingest = received(in_columns)
        assert ingest.builder.n_parked_total == 0, in_columns
        pag = ingest.builder.pag()
        moved = pag.mutations[(pag.mutations["kind"] == "TRANSFER")
                              & (pag.mutations["key"] == "x")]["dst"].item()
        made = pag.mutations[pag.mutations["key"].str.startswith("y-")]
        assert set(made["src"]) == {moved}  # every task read the fetched copy


def test_events_applied_together_are_ordered_by_the_one_rule_of_an_events_time():
    """A shard is made at its stop, a root at its time, a release at its time."""
    from crux_dask.events import event_time
    from crux_dask.plugins.time_order import in_time_order

    shard = ("shard", "t", "tcp://a:1", "memory@tcp://b:1", 8, 1.0, 5.0, ("x",))
    rest = (0, None, None, None, None, None, None)
    compute = ("compute", "y", "tcp://a:1", 1, 2.0, 3.0, 8, (), *rest)
    root, delete = ("root", 4.0), ("delete", "y", "tcp://a:1", 6.0)
    unreadable = ("compute", "z", "tcp://a:1", 1, 2.0, "late", 8, (), *rest)
    ordered = in_time_order([delete, shard, root, compute, unreadable])
    assert ordered == [unreadable, compute, root, shard, delete]
    assert [event_time(e) for e in ordered] == sorted(event_time(e) for e in ordered)


def test_the_events_per_slice_follow_the_time_a_slice_took():
    from crux_dask.plugins.ingest import SLICE_MIN

    def sizes(slice_seconds: float) -> list[int]:
        builder = PAGBuilder()
        builder.root(0.0)
        ingest = Ingest(builder, Spool(None, None), max_pending=10**9, park_timeout=10.0,
                        slice_events=3000, slice_seconds=slice_seconds)
        for event in computations(6000):
            ingest.record(event)
        return [ingest.apply_slice() for _ in range(3)]

    # Slices that can never be fast enough shrink to the least; slices that are
    # always fast grow to the most.
    assert sizes(1e-9) == [4 * SLICE_MIN, SLICE_MIN, SLICE_MIN]
    assert sizes(1e9) == [4 * SLICE_MIN, 3000, 2488]


@gen_test()
async def test_a_hook_past_max_pending_only_schedules_the_slices():
    ingest = new_ingest(slice_events=100, max_pending=50)
    for event in computations(300):
        ingest.record(event)
    assert ingest.builder.n_applied == 1  # scheduled, not applied
    seen = []

    def watch() -> bool:
        seen.append(ingest.builder.n_applied)
        return ingest.pending == 0

    await async_poll_for(watch, timeout=5, period=0)
    assert ingest.builder.n_applied == 301
    assert all((n - 1) % 100 == 0 for n in seen)  # the loop ran between whole slices


@gen_test()
async def test_drain_applies_everything_in_slices_between_loop_turns():
    ingest = new_ingest(slice_events=100)
    for event in computations(1000):
        ingest.record(event)
    seen: list[int] = []
    draining = asyncio.ensure_future(ingest.drain())
    while not draining.done():
        seen.append(ingest.builder.n_applied)
        await asyncio.sleep(0)
    await draining
    assert ingest.builder.n_applied == 1001 and ingest.pending == 0
    assert len(set(seen)) >= 5  # other callbacks ran while it drained


async def flush_worker(dask_worker) -> bool:
    return await dask_worker.plugins["crux"].flush()


class ProbeBefore(SchedulerPlugin):
    """Notes how many events the builder applied before Crux's own transition hook."""

    name = "probe-before"

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.applied: int | None = None

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        crux = self.scheduler.plugins.get("crux")
        self.applied = None if crux is None else crux.host.builder.n_applied


class ProbeAfter(SchedulerPlugin):
    """Checks, right after Crux's transition hook, that it applied nothing."""

    name = "probe-after"

    def __init__(self, scheduler, before: ProbeBefore) -> None:
        self.scheduler = scheduler
        self.before = before
        self.calls = 0
        self.pending_seen = 0
        self.changed: list = []

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        crux = self.scheduler.plugins["crux"]
        self.calls += 1
        self.pending_seen = max(self.pending_seen, crux.host.pending)
        if crux.host.builder.n_applied != self.before.applied:
            self.changed.append((key, start, finish))


@gen_cluster(client=True, config={"crux-dask.max-pending-events": 1,
                                  "crux-dask.apply-interval": "1h", **IN_SCHEDULER})
async def test_scheduler_hooks_never_apply_even_past_max_pending(c, s, a, b):
    before = ProbeBefore(s)
    s.add_plugin(before)
    await crux_dask.attach(c)
    after = ProbeAfter(s, before)
    s.add_plugin(after)
    crux = s.plugins["crux"]
    receive = s.handlers["crux_events"]
    handler_changed = []

    def watched_receive(**kwargs):
        applied = crux.host.builder.n_applied
        reply = receive(**kwargs)
        if crux.host.builder.n_applied != applied:
            handler_changed.append(reply)
        return reply

    s.handlers["crux_events"] = watched_receive
    x = c.submit(lambda: b"x" * 1000, key="x", workers=[a.address])
    y = c.submit(len, x, key="y", workers=[b.address])  # a transfer, reported by b
    assert await y == 1000
    await c.run(flush_worker)
    # The periodic callback waits an hour: only the slices the hooks scheduled apply.
    await async_poll_for(lambda: crux.host.pending == 0, timeout=10)
    assert after.calls > 0 and after.pending_seen >= 1
    assert after.changed == [] and handler_changed == []
    assert crux.host.counts["events_from_workers"] > 0
    pag = await crux_dask.get_pag(c)
    assert {"x", "y"} <= set(pag.states["key"])
    assert f"memory@{b.address}" in set(pag.states[pag.states["key"] == "x"]["location"])


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD,
             config={"crux-dask.apply-interval": "1h", "crux-dask.http.token": TOKEN,
                     **IN_SCHEDULER})
async def test_requests_read_what_is_applied_and_flush_applies_the_rest(c, s, a, b):
    await crux_dask.attach(c)
    crux = s.plugins["crux"]
    started = time.time()  # when the external data is made: it does not end the workflow
    assert await c.compute(chain(20)) == 20
    pending, applied = crux.host.pending, crux.host.builder.n_applied
    assert pending >= 20  # recorded by the hook, waiting for the periodic callback

    http = AsyncHTTPClient()
    base = f"http://127.0.0.1:{s.http_server.port}"
    stats = json.loads((await http.fetch(f"{base}/crux/api/v1/stats")).body)
    # Events still arriving (the released result, a worker's last batch) may add to the queue,
    # but the request applies none of it.
    assert stats["events_pending"] >= pending and crux.host.builder.n_applied == applied
    await http.fetch(f"{base}/crux/api/v1/states")
    await http.fetch(f"{base}/crux/api/v1/wcp")
    data = live_source(crux)
    steps = StepsTable(data)
    driver = OffLoop(data, [steps])  # computed in a thread, on a copy
    driver.update()
    await async_poll_for(lambda: not driver.busy(), 10)
    posted = await http.fetch(f"{base}/crux/api/v1/states", method="POST",
                              headers={"Authorization": f"Bearer {TOKEN}"},
                              body=json.dumps({"key": "ext", "location": "file@h:/ext",
                                               "time": started}))
    assert posted.code == 201
    # Nothing queued was applied by the requests; the write applied its own state only.
    assert crux.host.pending >= pending and crux.host.builder.n_applied == applied + 1
    assert json.loads(posted.body)["state_id"] == crux.host.builder.store.n_states - 1

    pag = await crux_dask.get_pag(c)
    assert crux.host.pending == 0
    assert {f"step-{i}" for i in range(20)} <= set(pag.states["key"])
    assert "ext" in set(pag.states["key"])
    driver.update()
    await async_poll_for(lambda: not driver.busy(), 10)
    driver.update()
    assert [k for k in steps.source.data["key"] if k.startswith("step-")][-1] == "step-19"
