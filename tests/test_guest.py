"""An invisible guest: the worker plugin changes nothing distributed relies on.

It replaces no handler (data gathered by a client is read from the worker's
own transfer log), and its teardown never waits on a scheduler that is gone:
what it could not send is kept and counted.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest
from distributed import Client, Worker, wait
from distributed.utils_test import gen_cluster, inc

import crux_dask

#: Crux preloaded on the scheduler and the workers through dask's configuration.
PRELOAD = {"distributed.scheduler.preload": ["crux_dask.plugins"],
           "distributed.worker.preload": ["crux_dask.plugins"]}


def gathered_by_client(pag, key: str) -> int:
    """How many transfers of ``key`` to the client the graph holds."""
    st = pag.states.set_index("state_id")
    m = pag.mutations
    moves = m[(m["key"] == key) & (m["kind"] == "TRANSFER")]
    return int((st.loc[moves["dst"], "location"] == "client").sum())


@gen_cluster(client=True)
async def test_handlers_are_distributeds_own(c, s, a, b):
    before = {w.address: dict(w.handlers) for w in (a, b)}
    await crux_dask.attach(c)
    for w in (a, b):
        assert "crux" in w.plugins
        assert w.handlers == before[w.address]
        assert "serializers" in inspect.signature(w.handlers["get_data"]).parameters


@pytest.mark.parametrize("direct", [True, False])
@gen_cluster(client=True, client_kwargs={"serializers": ["dask", "msgpack"]},
             config=PRELOAD)
async def test_gather_honours_the_clients_serializers(c, s, a, b, direct):
    assert "crux" in s.plugins and "crux" in a.plugins and "crux" in b.plugins
    plain = c.submit(inc, 1, key="plain")
    assert await c.gather(plain, direct=direct) == 2
    complex_ = c.submit(lambda x: x, inc, key="complex")
    await wait(complex_)
    with pytest.raises(TypeError):  # the client refused pickle: it must not get any
        await c.gather(complex_, direct=direct)
    # The gather of `plain` is in the graph all the same (read with a client that
    # takes pickle: the graph travels pickled).
    async with Client(s.address, asynchronous=True) as reader:
        pag = await crux_dask.get_pag(reader)
        assert gathered_by_client(pag, "plain") == 1
        stats = await crux_dask.get_stats(reader)
    assert stats["hook_errors"] == 0
    assert all(w["hook_errors"] == 0 for w in stats["workers"].values())


@gen_cluster(client=True)
async def test_many_gathers_are_all_recorded(c, s, a, b):
    await crux_dask.attach(c)
    futures = c.map(inc, range(50), key=[f"x-{i}" for i in range(50)])
    for future in futures:  # one gather each: 50 entries of the workers' transfer logs
        await c.gather(future)
    pag = await crux_dask.get_pag(c)
    assert all(gathered_by_client(pag, f"x-{i}") == 1 for i in range(50))


@gen_cluster(client=True, nthreads=[])
async def test_worker_closes_at_once_when_the_scheduler_is_gone(c, s):
    async with Worker(s.address, nthreads=1) as a:
        # Nothing is sent unless asked: the events stay in the buffer.
        await crux_dask.attach(c, flush_interval="1h", batch_size=1_000_000)
        plugin = a.plugins["crux"]
        [x] = await c.scatter([list(range(100))], workers=[a.address])
        assert await c.submit(sum, x, key="total") == 4950
        await c.gather(x)
        # Recorded on `a`: the scatter, and the gather of x (the transfer log is read
        # on flush, and in teardown).
        assert plugin.buffer
        await s.close()
        await c.close()
        started = time.monotonic()
        await a.close()
        elapsed = time.monotonic() - started
    assert elapsed < 1.0
    stats = plugin.stats()
    assert stats["events_sent"] == 0
    assert stats["events_unsent"] == stats["events_recorded"] >= 2
    assert stats["events_buffered"] == stats["events_unsent"]  # kept, not dropped


@gen_cluster(client=True, nthreads=[])
async def test_a_worker_closed_right_after_its_scheduler_does_not_try_to_send(c, s):
    """Closed before it read the end of its stream to the scheduler (as distributed's
    own tests close a cluster: client, scheduler, workers), a worker asks its socket
    whether the scheduler hung up, and keeps what it could not send, without trying."""
    async with Worker(s.address, nthreads=1) as a:
        await crux_dask.attach(c, flush_interval="1h", batch_size=1_000_000)
        plugin = a.plugins["crux"]
        [x] = await c.scatter([list(range(10))], workers=[a.address])  # recorded on `a`
        assert await c.submit(sum, x, key="total") == 45
        assert plugin.buffer
        flushes = []
        flush = plugin.flush
        plugin.flush = lambda: (flushes.append(1), flush())[1]
        await c.close()
        await s.close()
        await a.close()
    assert flushes == []
    stats = plugin.stats()
    assert stats["events_sent"] == 0
    assert stats["events_unsent"] == stats["events_recorded"] >= 1


@gen_cluster(client=True)
async def test_teardown_sends_what_is_buffered_to_a_live_scheduler(c, s, a, b):
    await crux_dask.attach(c, flush_interval="1h", batch_size=1_000_000)
    plugins = [a.plugins["crux"], b.plugins["crux"]]
    [x] = await c.scatter([1], workers=[a.address])
    assert await c.gather(x) == 1
    received = s.plugins["crux"].counts["events_from_workers"]
    await c.unregister_worker_plugin("crux")
    recorded = sum(p.counts["events_recorded"] for p in plugins)
    assert recorded >= 2
    assert sum(p.counts["events_sent"] for p in plugins) == recorded
    assert s.plugins["crux"].counts["events_from_workers"] - received == recorded
    assert all(p.stats()["events_unsent"] == 0 for p in plugins)


@gen_cluster(client=True, nthreads=[])
async def test_teardown_with_a_send_stuck_in_flight_is_bounded(c, s):
    async with Worker(s.address, nthreads=1) as a:
        await crux_dask.attach(c, flush_interval="1h", batch_size=1_000_000)
        plugin = a.plugins["crux"]
        [x] = await c.scatter([1], workers=[a.address])
        assert plugin.buffer
        release = asyncio.Event()

        async def stuck(**kwargs):  # a scheduler that never answers
            await release.wait()

        real = a.scheduler

        class Stuck:  # the scheduler, but Crux's handler never answers
            crux_events = staticmethod(stuck)

            def __getattr__(self, name):
                return getattr(real, name)

        a.scheduler = Stuck()
        try:
            plugin._flush_soon()
            assert plugin._sending is not None
            started = time.monotonic()
            await c.unregister_worker_plugin("crux")
            elapsed = time.monotonic() - started
        finally:
            a.scheduler = real
        assert "crux" not in a.plugins
        release.set()
        assert await c.gather(x) == 1  # and the worker works on
    assert elapsed < 1.0 + 0.5  # the teardown's bound and the round trip
    assert plugin.stats()["events_unsent"] == plugin.counts["events_recorded"]


def loaded(names: tuple[str, ...]) -> list[str]:
    import sys

    return [name for name in names if name in sys.modules]


def test_what_the_client_asks_of_workers_loads_nothing_into_them():
    """A worker runs what a client's flush and stats ask from the module it loaded
    with the plugin: never the client API, the graph's modules or pandas."""
    from distributed import LocalCluster

    heavy = ("crux_dask.plugins.api", "crux_dask.pag", "crux_dask.store", "pandas")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        assert client.submit(inc, 1).result() == 2
        assert crux_dask.get_pag(client).states["key"].str.startswith("inc").any()
        (stats,) = crux_dask.get_stats(client)["workers"].values()
        assert stats["events_recorded"] > 0
        (found,) = client.run(loaded, heavy).values()
        assert found == []
        assert client.run_on_scheduler(loaded, heavy) != []  # where they belong
