"""Faults and hostile input: nothing crashes, no worker is dropped, nothing recorded is lost."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import dask
import msgpack
import pytest
from distributed.utils_test import async_poll_for, gen_cluster, inc, poll_for

import crux_dask
from crux_dask import PAGBuilder
from crux_dask.codec import MAX_BATCH_BYTES, encode_batch
from crux_dask.events import Compute
from crux_dask.plugins import CruxWorkerPlugin
from crux_dask.plugins.protocol import EVENTS_HANDLER

from workloads import chain


def malformed_batches(n: int, seed: int = 0) -> list[bytes]:
    """``n`` batches of every malformed kind: random bytes, wrong versions and types, huge."""
    rng = random.Random(seed)
    good = ["transfer", "k", "memory@a", "memory@b", 1.0, 2.0, 10]
    makers = [
        lambda: rng.randbytes(rng.randrange(0, 200)),
        lambda: msgpack.packb({"v": rng.choice([0, 2, "1", None]), "source": "w", "seq": 1,
                               "events": [good]}),
        lambda: msgpack.packb({"v": 1, "source": rng.randrange(9), "seq": 1, "events": []}),
        lambda: msgpack.packb({"v": 1, "source": "w", "seq": 1,
                               "events": [good[:rng.randrange(1, 6)]]}),  # too few fields
        lambda: msgpack.packb({"v": 1, "source": "w", "seq": 1,
                               "events": [[*good[:4], "early", 2.0, 10]]}),
        lambda: msgpack.packb({"v": 1, "source": "w", "seq": 1,
                               "events": [["delete", "k", "memory@a", float("nan")]]}),
        lambda: msgpack.packb([rng.random() for _ in range(rng.randrange(5))]),
        lambda: encode_batch([good])[: rng.randrange(1, 20)],
    ]
    batches = [makers[i % len(makers)]() for i in range(n - 2)]
    # Two over the size limit.
    batches += [b"\x91" + b"\x00" * (MAX_BATCH_BYTES + 1)] * 2
    return batches


@pytest.mark.parametrize("apart", [True, False])
def test_hostile_batches_are_counted_and_harm_nothing(apart):
    """Every malformed batch is refused and counted, by the scheduler in its reply if its
    head is malformed (or always, without a graph process), else by the graph process."""

    @gen_cluster(client=True, timeout=300, config={"crux-dask.graph-process": apart})
    async def run(c, s, a, b):
        await crux_dask.attach(c)
        await c.submit(inc, 1, key="x", workers=[a.address])
        plugin = s.plugins["crux"]
        before = dict(plugin.counts)
        bad = malformed_batches(10_000)
        valid = refused = 0
        taken = []  # events in bad batches the scheduler took, to be checked where applied
        send = a.scheduler.crux_events
        for i, data in enumerate(bad):
            reply = await send(batch=data, source=a.address)
            if reply["status"] == "rejected":
                refused += 1
            else:
                assert apart and reply["status"] == "OK"
                taken.append(reply["accepted"])
            if i % 100 == 0:  # a valid batch now and then, through the same transport
                event = ("transfer", "x", f"memory@{a.address}", f"memory@{b.address}",
                         time.time(), time.time(), 28)
                reply = await send(batch=encode_batch([event], a.address, i),
                                   source=a.address)
                assert (reply["status"], reply["accepted"]) == ("OK", 1)
                valid += 1
        await crux_dask.flush(c)
        stats = await crux_dask.get_stats(c)
        assert stats["batches_rejected"] - before["batches_rejected"] == refused
        assert stats["batches_failed"] - before["batches_failed"] == len(taken)
        assert refused + len(taken) == len(bad)
        assert (len(taken) > 1000) == apart  # the events of a batch are checked apart
        assert stats["events_failed"] == sum(taken)
        assert stats["events_from_workers"] - before["events_from_workers"] >= valid
        assert stats["events_applied"] + stats["events_failed"] == stats["events_received"]
        assert stats["hook_errors"] == 0
        assert set(s.workers) == {a.address, b.address}  # nobody was dropped
        pag = await crux_dask.get_pag(c)
        copies = pag.states[(pag.states["key"] == "x")
                            & (pag.states["location"] == f"memory@{b.address}")]
        assert len(copies) == valid  # every valid event landed
        assert await c.submit(inc, 41) == 42  # and the cluster still works

    run()


@gen_cluster(client=True)
async def test_worker_plugin_without_scheduler_side_is_harmless(c, s, a, b):
    await c.register_plugin(CruxWorkerPlugin(flush_interval="20ms"))
    x = c.submit(lambda: b"x" * 1000, key="x", workers=[a.address])
    assert await c.submit(len, x, key="y", workers=[b.address]) == 1000
    del x
    await c.run(_flush)
    stats = await c.run(lambda dask_worker: dask_worker.plugins["crux"].stats())
    recorded = sum(w["events_recorded"] for w in stats.values())
    assert recorded > 0
    left = sum(w["events_dropped"] + w["events_buffered"] for w in stats.values())
    assert left == recorded  # nothing sent, everything accounted for
    assert set(s.workers) == {a.address, b.address}
    assert await c.submit(inc, 1) == 2


async def _flush(dask_worker):
    return await dask_worker.plugins["crux"].flush()


@gen_cluster(client=True)
async def test_a_batch_whose_answer_was_lost_is_sent_again_and_taken_once(c, s, a, b):
    await crux_dask.attach(c)
    handler = s.handlers[EVENTS_HANDLER]
    lost = []

    def answer_lost(**message):
        reply = handler(**message)  # taken, then its answer lost on the way back
        if "seq" in message and not lost:
            lost.append(message["source"])
            raise OSError("the connection dropped before the answer")
        return reply

    s.handlers[EVENTS_HANDLER] = answer_lost
    assert await c.gather(c.map(inc, range(20))) == list(range(1, 21))
    assert await c.run(_flush) in ({a.address: False, b.address: True},
                                   {a.address: True, b.address: False})
    stats = await c.run(lambda dask_worker: dask_worker.plugins["crux"].stats())
    assert sum(w["send_failures"] for w in stats.values()) == 1
    assert set((await c.run(_flush)).values()) == {True}  # the same batch, sent again
    await crux_dask.flush(c)
    stats = await crux_dask.get_stats(c)
    sent = sum(w["events_sent"] for w in stats["workers"].values())
    assert lost and stats["batches_repeated"] == 1
    assert stats["events_from_workers"] == sent
    pag = await crux_dask.get_pag(c)
    made = pag.mutations[(pag.mutations["kind"] == "APPEND")
                         & pag.mutations["key"].str.startswith("inc-")]
    assert len(made) == made["key"].nunique() == 20  # each task once


def test_worker_killed_mid_run_then_restart():
    from distributed import Client, LocalCluster

    def slow(x, delay=0.3):
        time.sleep(delay)
        return x + 1

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        parts = [dask.delayed(slow)(i, dask_key_name=f"part-{i}") for i in range(8)]
        total = dask.delayed(sum)(parts, dask_key_name="total")
        future = client.compute(total)
        victim = next(iter(cluster.workers.values()))
        address = victim.worker_address

        def held_by_victim() -> int:  # parts the scheduler (and so Crux) knows it holds
            return client.run_on_scheduler(
                lambda dask_scheduler, address: len(dask_scheduler.workers[address].has_what),
                address=address)

        poll_for(lambda: held_by_victim() >= 1, timeout=30)
        assert not future.done()  # mid-run: 'total' needs every part
        os.kill(victim.process.process.pid, signal.SIGKILL)  # lost work is redone
        assert future.result(timeout=60) == sum(range(1, 9))
        path = crux_dask.get_wcp(client)
        assert path.states["key"].iloc[-1] == "total"
        stats = crux_dask.get_stats(client)
        assert stats["events_failed"] == 0 and stats["hook_errors"] == 0
        # What the dead worker held is marked gone.
        pag = crux_dask.get_pag(client)
        gone = pag.mutations[(pag.mutations["kind"] == "DELETE")
                             & (pag.mutations["worker"] == address)]
        assert stats["states_lost"] >= 1 and len(gone) >= stats["states_lost"]

        client.restart()
        crux_dask.attach(client)  # the new workers get the worker plugin again
        assert client.submit(slow, 1, 0.01, key="after").result() == 2
        pag = crux_dask.get_pag(client)
        assert "after" in set(pag.states["key"])
        assert crux_dask.get_stats(client)["events_failed"] == 0


def test_many_clients_attach_once():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster:
        clients = [Client(cluster) for _ in range(3)]
        try:
            for client in clients:
                crux_dask.attach(client)
            plugins = clients[0].run_on_scheduler(
                lambda dask_scheduler: [n for n in dask_scheduler.plugins if n == "crux"])
            assert plugins == ["crux"]
        finally:
            for client in clients:
                client.close()


@pytest.mark.parametrize("graph_process", [True, False])
@gen_cluster(client=True, timeout=240, config={"crux-dask.max-states": 1_000})
async def test_memory_is_bounded_and_the_export_holds_everything(c, s, a, b, graph_process):
    """A pipeline that releases as it goes: 3,000 steps, about 6,000 states, cap 1,000.
    Spooled segments are read back for the export by the graph process, or in a thread."""
    import tempfile

    with dask.config.set({"crux-dask.graph-process": graph_process}):
        await crux_dask.attach(c)
    assert s.plugins["crux"].host.apart == graph_process
    assert await c.compute(chain(3_000)) == 3_000
    # The result's release too, on the workers, so that no event comes after the counts.
    await async_poll_for(lambda: not (s.tasks or a.state.tasks or b.state.tasks), timeout=30)
    await crux_dask.flush(c)
    stats = await crux_dask.get_stats(c)
    # A segment spools between slices; a slice whose batch completes a long chain of
    # events that waited for each other's inputs adds thousands of states at once.
    assert stats["segments_spooled"] >= 2
    assert stats["states"] < 2 * 1_000  # what stays in the scheduler's memory is bounded
    with tempfile.TemporaryDirectory() as out:
        dataset = await crux_dask.export_parquet(c, Path(out) / "runs")
        pag = crux_dask.read_parquet(dataset)
    assert len(pag.run_ids) == stats["segments_spooled"] + 1
    assert len(pag) == stats["states_spooled"] + stats["states"]  # nothing lost
    computed = pag.states[pag.states["thread"].notna()]
    assert sorted(computed["key"]) == sorted(f"step-{i}" for i in range(3_000))
    assert stats["events_failed"] == 0 and stats["hook_errors"] == 0
    assert stats["inputs_substituted"] == 0  # every input found, across segments too


@pytest.mark.parametrize("configured", [False, True])
def test_a_temporary_spool_goes_with_the_scheduler_a_configured_one_stays(configured,
                                                                           tmp_path):
    """Spooled segments in a directory Crux made itself are removed when the scheduler
    closes (nothing can read them after); in the configured ``spool-dir`` they stay."""
    from distributed import Client, LocalCluster

    settings = {"crux-dask.max-states": 100}
    if configured:
        settings["crux-dask.spool-dir"] = str(tmp_path / "spool")
    with dask.config.set(settings), \
            LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        crux_dask.attach(client)
        assert client.compute(chain(300)).result() == 300
        poll_for(lambda: not client.run_on_scheduler(lambda dask_scheduler: len(
            dask_scheduler.tasks)), timeout=30)
        crux_dask.flush(client)
        stats = crux_dask.get_stats(client)
        assert stats["segments_spooled"] >= 1
        directory = Path(stats["spool_dir"])
        assert (directory / "metadata.json").exists()
        assert (directory == tmp_path / "spool") == configured
    assert directory.exists() == configured
    if configured:
        assert len(crux_dask.read_parquet(directory).run_ids) == stats["segments_spooled"]


class CountingBuilder(PAGBuilder):
    """A builder that counts the events it is given."""

    applied_events = 0

    def apply(self, event, now=0.0):
        self.applied_events += 1
        return super().apply(event, now)


def test_a_worker_that_never_reports_costs_each_waiting_event_a_round_or_two():
    # Root tasks on worker A, each released from the scheduler's queue by the task
    # before it on B; each task on B computed from its partner on A, fetched by B,
    # which never reports a fetch.  Every task waits for another waiting one.
    a, b, n = "tcp://10.0.0.1:1", "tcp://10.0.0.2:1", 300
    builder = CountingBuilder()
    builder.root(0.0)
    events = []
    for i in range(n):
        t = 1.0 + 2 * i
        events.append(Compute("compute", f"a-{i}", a, 1, t, t + 0.5, 8,
                              released_by=f"b-{i - 1}" if i else None,
                              released_on=b if i else None))
        events.append(Compute("compute", f"b-{i}", b, 1, t + 1.0, t + 1.5, 8, (f"a-{i}",)))
    builder.apply_many(events)
    assert builder.n_parked == 2 * n - 1  # everything but the first root task waits
    before = builder.applied_events
    builder.resolve_parked()
    assert builder.n_parked == 0
    assert builder.applied_events - before <= 2 * (2 * n - 1)  # not once per round per event
    states = builder.pag().states.set_index("key")
    mutations = builder.pag().mutations
    # Each b computed from the newest copy of its a (the fetch never came), each
    # a caused by the b that freed its slot.
    made = mutations[mutations["kind"] != "DELETE"]
    assert dict(zip(states.iloc[made["dst"]].index, states.iloc[made["src"]].index)) == {
        **{f"a-{i}": "root" for i in range(n)}, **{f"b-{i}": f"a-{i}" for i in range(n)}}
    causes = builder.pag().causes
    slots = causes[causes["kind"] == "SLOT"]
    assert len(slots) == n - 1
