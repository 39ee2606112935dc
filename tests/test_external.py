"""Applications outside Dask join the graph through the POST routes."""

from __future__ import annotations

import asyncio
import time

import dask
import pytest
from distributed.utils_test import gen_cluster

import crux_dask
from crux_dask.external import CruxHTTPError, CruxWriter

TOKEN = "s3cret-token"
WITH_TOKEN = {"crux-dask.http.token": TOKEN}
DASHBOARD = {"dashboard": True, "dashboard_address": ":0"}


def address(s) -> str:
    return f"http://127.0.0.1:{s.http_server.port}"


def mpi_stage(writer: CruxWriter, source: int, start: float, stop: float, ranks: int = 4,
              slow: int = 2) -> dict:
    """What an MPI code that ran from ``start`` to ``stop`` would report: its ranks split
    from one input, merged into a file.

    The slow rank takes six sevenths of the run, the others one seventh; the merge
    takes the last seventh (0.3 s, 0.05 s and 0.05 s of a 0.35 s run).
    """
    seventh = (stop - start) / 7
    outputs = []
    for rank in range(ranks):
        seconds = 6 * seventh if rank == slow else seventh
        outputs.append(writer.mutation("SPLIT", source, f"mpi-rank-{rank}",
                                       f"memory@mpi-node-{rank}", start, start + seconds, 1000))
    merged = writer.mutation("MERGE", outputs, "mpi-out", "file@mpi:/scratch/out.h5",
                             start + 6 * seventh, stop, 4000, label="out.h5")
    return {"ranks": outputs, "out": merged}


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD, config=WITH_TOKEN)
async def test_external_mpi_stage_between_two_dask_stages_is_on_the_path(c, s, a, b):
    await crux_dask.attach(c)
    await c.submit(lambda: time.sleep(0.05) or 1, key="prep")
    await crux_dask.flush(c)  # the routes answer from the events applied so far
    writer = CruxWriter(address(s), TOKEN)
    [prep] = [st for st in await asyncio.to_thread(writer.states, key="prep")
              if st["thread"] is not None]
    # The MPI stage ran after prep and is over: it reports times from prep's end to now.
    ran = (prep["time"], time.time())
    assert ran[0] < ran[1]
    stage = await asyncio.to_thread(mpi_stage, writer, prep["state_id"], *ran)

    with dask.annotate(crux={"reads": ["mpi-out"]}):
        post = dask.delayed(lambda: 2, pure=False)(dask_key_name="post")
    await c.compute(post)
    path = await crux_dask.get_wcp(c)
    keys = path.states["key"].tolist()
    assert keys[keys.index("prep"):][:4] == ["prep", "mpi-rank-2", "mpi-out", "post"]
    kinds = path.steps.set_index("key")["kind"]
    assert kinds["mpi-rank-2"] == "SPLIT" and kinds["mpi-out"] == "MERGE"
    assert stage["out"] in path.states["state_id"].tolist()
    stats = await crux_dask.get_stats(c)
    assert stats["http_accepted"] == 5 and stats["http_rejected"] == 0


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD)
async def test_writes_are_refused_without_a_configured_token(c, s, a, b):
    await crux_dask.attach(c)
    writer = CruxWriter(address(s), "anything-at-all")
    with pytest.raises(CruxHTTPError) as error:
        await asyncio.to_thread(writer.state, "x", "file@h:/x", time.time())
    assert error.value.status == 403


@pytest.mark.parametrize("token, body, status, field", [
    (None, {"key": "x", "location": "l", "time": 1.0}, 401, None),
    ("wrong-token!", {"key": "x", "location": "l", "time": 1.0}, 401, None),
    (TOKEN, {"key": "x", "location": "l", "time": "noon"}, 400, "stop"),
    (TOKEN, {"key": "", "location": "l", "time": 1.0}, 400, "key"),
    (TOKEN, {"key": "x", "location": "l", "time": 1.0, "size": -3}, 400, "size"),
    (TOKEN, {"key": "x", "location": "l", "time": 1.0, "colour": "red"}, 400, "colour"),
    (TOKEN, {"key": "x", "location": "l", "time": 1.0, "src": 1}, 400, "src"),
    (TOKEN, {"key": "x" * 2_000_000, "location": "l", "time": 1.0}, 413, None),
])
def test_bad_writes_get_clear_errors(token, body, status, field):
    @gen_cluster(client=True, scheduler_kwargs=DASHBOARD, config=WITH_TOKEN)
    async def run(c, s, a, b):
        await crux_dask.attach(c)
        writer = CruxWriter(address(s), token)
        with pytest.raises(CruxHTTPError) as error:
            await asyncio.to_thread(writer._request, "POST", "/states", body)
        assert error.value.status == status
        if field:
            assert error.value.body["parameter"] == field
        stats = await crux_dask.get_stats(c)
        assert stats["http_rejected"] == 1 and stats["events_failed"] == 0

    run()


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD, config=WITH_TOKEN)
async def test_unknown_sources_and_kinds_are_404(c, s, a, b):
    await crux_dask.attach(c)
    writer = CruxWriter(address(s), TOKEN)
    with pytest.raises(CruxHTTPError) as error:
        await asyncio.to_thread(writer.mutation, "CONVERT", 10_000, "y", "file@h:/y", 1.0, 2.0)
    assert error.value.status == 404 and error.value.body["parameter"] == "src"
    with pytest.raises(CruxHTTPError) as error:
        await asyncio.to_thread(writer.mutation, "TELEPORT", 0, "y", "file@h:/y", 1.0, 2.0)
    assert error.value.status == 404
