"""Both graph hosts answer the same questions the same way (plugins/host.py)."""

from __future__ import annotations

import pytest
from distributed.utils_test import gen_cluster, inc

import crux_dask
from crux_dask.plugins.graph_process import GraphProcess
from crux_dask.plugins.host import LocalHost, split_pieces
from crux_dask.store import PAGStore


def states_and_end(store: PAGStore, end: int, extra: int) -> tuple[int, int]:
    return store.n_states + extra, end


@pytest.mark.parametrize("apart", [True, False], ids=["graph-process", "in-scheduler"])
def test_each_host_answers_the_same_questions_alike(apart):
    @gen_cluster(client=True, config={"crux-dask.graph-process": apart})
    async def run(c, s, a, b):
        await crux_dask.attach(c)
        crux = s.plugins["crux"]
        host = crux.host
        assert isinstance(host, GraphProcess if apart else LocalHost)
        assert host.apart is apart
        assert sum(await c.gather(c.map(inc, range(10)))) == 55
        await crux_dask.flush(c)
        pag = await crux_dask.get_pag(c)
        progress = host.progress()
        assert progress.n_states == len(pag.states)
        assert await host.ask(states_and_end, 1) == (len(pag.states) + 1, progress.end)
        cut = await host.pieces()  # kept in the graph process, fetched a piece at a time
        try:
            pieces = await cut.fetch_all()
        finally:
            cut.release()
        assert cut.head == progress.end
        (whole,) = split_pieces(pieces, [len(pieces)])
        assert PAGStore.from_pieces(whole).n_states == len(pag.states)
        root = pag.states[pag.states["location"] == "root"]["state_id"].iloc[0]
        made = await host.external("APPEND", sources=[int(root)], key="outside", label="x",
                                   origin="outside", location="file@h:/x", size=3,
                                   start=1.0, stop=2.0)
        assert (await host.ask(states_and_end, 0))[0] == made + 1 == len(pag.states) + 1
        assert host.progress().n_states == made + 1  # said before the answer
        assert (host.sizes()["graph_process"] is not None) is apart

    run()
