"""Workers report the tasks they finish; the scheduler records only what it alone knows."""

from __future__ import annotations

import msgpack
import pytest
from distributed.diagnostics.task_stream import TaskStreamPlugin
from distributed.utils_test import async_poll_for, gen_cluster, inc

import crux_dask
from crux_dask.codec import encode_batch
from crux_dask.graph.builder import PAGBuilder
from crux_dask.model import CLIENT, memory_location
from crux_dask.plugins.entries import Done, Lost, Sent
from crux_dask.plugins.ingest import Ingest
from crux_dask.plugins.joins import Announced, Sending
from crux_dask.plugins.protocol import REPORT_FIELDS
from crux_dask.plugins.scheduler import CruxSchedulerPlugin
from crux_dask.plugins.spool import Spool
from crux_dask.plugins.worker import CruxWorkerPlugin
from crux_dask.provenance import tasks_frame

A = "tcp://10.0.0.1:1"
B = "tcp://10.0.0.2:1"


def report(key, start: float, stop: float, inputs=(), **fields) -> list:
    """A task's report as a worker sends it."""
    row = dict.fromkeys(REPORT_FIELDS)
    row.update(key=key, thread=1, start=start, stop=stop, nbytes=8, inputs=list(inputs),
               prefix="p", **fields)
    return list(row.values())


def new_ingest() -> tuple[Ingest, int]:
    ingest = Ingest(PAGBuilder(), Spool(None, None), max_pending=10**9, park_timeout=10.0)
    return ingest, ingest.root(1.0, "graph")


def computed(ingest: Ingest):
    """The graph's computations with their moments, by key."""
    return tasks_with_moments(ingest.builder.pag())


def tasks_with_moments(pag):
    moments = pag.moments.drop(columns="run_id")
    return tasks_frame(pag).merge(moments, on="state_id", how="left").set_index("key")


def test_a_reported_task_takes_what_the_scheduler_recorded_as_it_sent_it():
    ingest, graph = new_ingest()
    # Sent, taken back, sent again (keeps when it was first sent); then the report.
    ingest.record(Sent("x", 2.0, None, graph))
    ingest.record(Sent("x", 3.0, None, -1))
    ingest.record(Sent(("y", 0), 5.0, ("x", A), -1))
    # Keys as Dask names them, a tuple as msgpack gives it back; the worker's priority
    # ends with its own generation.
    tasks = msgpack.packb([report("x", 4.0, 4.5, received=3.5, runnable=3.6),
                           report(("y", 0), 5.5, 6.0, ["x"], priority=[0, 1, 7, -3])])
    reply = ingest.receive(tasks=tasks, source=A)
    assert (reply["status"], reply["accepted"]) == ("OK", 2)
    ingest.apply_slice()
    x, y = computed(ingest).loc["x"], computed(ingest).loc["('y', 0)"]
    assert (x["compute_start"], x["compute_stop"], x["worker"]) == (4.0, 4.5, A)
    assert (x["requested"], x["first_requested"]) == (3.0, 2.0)
    assert (x["received"], x["runnable"]) == (3.5, 3.6)
    assert y["requested"] == 5.0 and y["priority"] == 2.0**32 + 7
    assert list(y["dependencies"]) == ["x"] and y["prefix"] == "p"
    assert not len(ingest.sending)  # each joined its report, and was let go
    assert ingest.counts["events_applied"] == 5 == ingest.received
    assert ingest.counts["tasks_reported"] == 2


@pytest.mark.parametrize("tasks", [b"\xc1", b"\x81\xa1a\x01", "not bytes", b"\xdd\xff\xff\xff\xff"])
def test_a_report_that_is_not_a_msgpack_array_is_refused_whole(tasks):
    ingest, _ = new_ingest()
    reply = ingest.receive(tasks=tasks, source=A)
    assert reply["status"] == "rejected" and ingest.counts["batches_rejected"] == 1
    assert not ingest.queue and ingest.pending == 0 and ingest.counts["tasks_reported"] == 0


def test_a_malformed_task_in_a_report_is_counted_and_the_others_are_applied():
    ingest, _ = new_ingest()
    rows = [report("good", 1.0, 2.0), report("late", 3.0, 2.0), report(None, 1.0, 2.0),
            report("many", 1.0, 2.0)[:-1], report("odd", 1.0, 2.0, received="soon"),
            report("in", 1.0, 2.0, inputs=[{"a": 1}])]
    assert ingest.receive(tasks=msgpack.packb(rows), source=A)["status"] == "OK"
    ingest.apply_slice()
    assert ingest.counts["events_failed"] == 4 and ingest.counts["events_applied"] == 2
    tasks = computed(ingest)
    assert sorted(tasks.index) == ["good", "odd"]
    assert tasks.loc["odd", "received"] != tasks.loc["odd", "received"]  # not a time: left out


def test_a_late_report_is_waited_for_and_the_tasks_of_a_worker_that_died_are_not():
    ingest, _ = new_ingest()
    ingest.record(Done("late", A, 3.0, 8))
    ingest.record(Done("lost", B, 4.0, 16))
    ingest.apply_slice()
    ingest.resolve(None)  # as a client's request for the graph does: not given up on
    assert len(computed(ingest)) == 0
    assert ingest.receive(tasks=msgpack.packb([report("late", 2.0, 3.0)]),
                          source=A)["status"] == "OK"
    ingest.record(Lost(B, 5.0))  # died before it sent its report
    ingest.apply_slice()
    tasks = computed(ingest)
    assert list(tasks.index) == ["late"]  # once, as its worker reported it
    assert (tasks.loc["late", "compute_start"], tasks.loc["late", "compute_stop"]) == (2.0, 3.0)
    states = ingest.builder.pag().states
    lost = states[states["key"] == "lost"]  # made when it finished, then gone with its worker
    assert (lost["location"] == f"memory@{B}").all() and lost["time"].tolist() == [4.0, 5.0]
    assert ingest.counts["tasks_unreported"] == 1 and ingest.builder.n_lost == 1


@pytest.mark.parametrize("columns", [False, True])
def test_a_gather_is_requested_when_the_scheduler_saw_its_task_finish(columns):
    # The worker records what a client gathered, not when it asked.
    ingest, _ = new_ingest()
    ingest.record(Done("x", A, 2.5, 8))
    memory = memory_location(A)
    batch = [("transfer", "x", memory, CLIENT, 3.0, 3.1, 8),  # gathered
             ("transfer", "x", memory, CLIENT, 3.2, 3.3, 8, 3.15),  # its moment recorded
             ("transfer", "x", memory, memory_location(B), 3.4, 3.5, 8)]  # a fetch
    assert ingest.receive(batch=encode_batch(batch, A, columns=columns),
                          tasks=msgpack.packb([report("x", 2.0, 2.4)]), source=A)["status"] == "OK"
    ingest.apply_slice()
    pag = ingest.builder.pag()
    moments = pag.states.merge(pag.moments, on="state_id", how="left")
    copies = moments[moments["time"] > 3.0].sort_values("time")
    assert copies["location"].tolist() == [CLIENT, CLIENT, memory_location(B)]
    requested = copies["requested"].tolist()
    assert requested[:2] == [2.5, 3.15] and requested[2] != requested[2]
    assert ingest.counts["events_failed"] == 0
    assert ingest.counts["batches_in_columns"] == columns


def test_finished_tasks_are_kept_for_gathers_within_a_bound():
    announced = Announced(capacity=3)
    for i in range(5):
        announced.done(f"t-{i}", float(i))
    events = [("transfer", f"t-{i}", memory_location(A), CLIENT, 9.0, 9.5, 8) for i in range(5)]
    events += [("transfer",), ("transfer", ["unhashable"], "m", CLIENT, 1.0, 2.0, 8), None,
               ("transfer", "t-4", "m", CLIENT, 1.0)]  # too short: not given a moment
    announced.gathers(events)  # malformed events are left for the builder to refuse
    assert [event[7] if len(event) == 8 else None for event in events[:5]] == [
        None, None, 2.0, 3.0, 4.0]
    assert events[5:] == [("transfer",), ("transfer", ["unhashable"], "m", CLIENT, 1.0, 2.0, 8),
                          None, ("transfer", "t-4", "m", CLIENT, 1.0)]


def test_sent_tasks_never_reported_are_kept_within_a_bound():
    sending = Sending(most=3)
    for i in range(5):
        sending.record(Sent(f"t-{i}", float(i), None, -1))
    assert sorted(sending.tasks) == ["t-2", "t-3", "t-4"] and sending.dropped == 2
    assert sending.take("t-3")[1] == 3.0 and sending.take("t-3") is None


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_tasks_of_a_worker_without_crux_are_recorded_by_the_scheduler(c, s, a, b):
    stream = TaskStreamPlugin(s)
    s.add_plugin(stream)
    await c.register_plugin(CruxSchedulerPlugin())
    await a.plugin_add(CruxWorkerPlugin(), name="crux")  # b has none
    on_a = c.map(inc, range(10), key=[f"a-{i}" for i in range(10)], workers=[a.address])
    on_b = c.map(inc, on_a, key=[f"b-{i}" for i in range(10)], workers=[b.address])
    assert await c.gather(on_b) == list(range(2, 12))
    pag = await crux_dask.get_pag(c)

    runs = {t["key"]: (t["worker"], s_["start"], s_["stop"]) for t in stream.buffer
            for s_ in t["startstops"] if s_["action"] == "compute"}
    tasks = tasks_with_moments(pag)
    assert len(runs) == 20 and sorted(tasks.index) == sorted(runs)  # each once, either side
    for key, (worker, start, stop) in runs.items():
        task = tasks.loc[key]
        assert task["worker"] == worker
        # In a's estimate of the scheduler's clock, where a reported them, the task
        # stream's in its heartbeat's: in one process, within milliseconds.
        assert (task["compute_start"], task["compute_stop"]) == pytest.approx(
            (start, stop), abs=0.02)
        assert task["compute_stop"] - task["compute_start"] == pytest.approx(
            stop - start, abs=1e-6)
        # Sent by the scheduler, in both cases; what a worker knows, only where it reports.
        assert task["requested"] <= start
        assert (task["received"] == task["received"]) == key.startswith("a-")
        if key.startswith("b-"):
            assert list(task["dependencies"]) == [f"a-{key[2:]}"]
    assert s.plugins["crux"].stats()["tasks_reported"] == 10


def wait_for(event_name: str) -> int:
    from distributed import Event

    Event(event_name).wait()
    return 1


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_task_under_way_when_its_worker_stops_reporting_is_recorded_by_the_scheduler(
        c, s, a):
    from distributed import Event

    await crux_dask.attach(c)
    go = Event("go")
    running = c.submit(wait_for, "go", key="running")
    await async_poll_for(lambda: "running" in a.state.tasks
                         and a.state.tasks["running"].state == "executing", timeout=10)
    await a.plugin_remove("crux")
    await go.set()
    assert await running == 1
    tasks = tasks_with_moments(await crux_dask.get_pag(c))
    assert "running" in tasks.index and tasks.loc["running", "worker"] == a.address
    assert s.plugins["crux"].stats()["tasks_reported"] == 0
