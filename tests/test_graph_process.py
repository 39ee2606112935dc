"""The graph is built in a process of its own: the same graph, the scheduler keeps no
copy of it, and reads its journal back when that process dies for good."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading

import dask
import numpy as np
import psutil
import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import async_poll_for, gen_cluster, inc, poll_for
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

import crux_dask
from crux_dask.codec import encode_batch
from crux_dask.plugins.frames import Frames
from crux_dask.plugins.graph_pipe import RESTARTS
from crux_dask.plugins.graph_process import MESSAGE_BYTES, GraphProcess
from crux_dask.plugins.scheduler import CruxSchedulerPlugin
from crux_dask.plugins.spool import Spool
from crux_dask.plugins.staging import PIECES_AHEAD, KeptPieces, Pieces, Staging
from crux_dask.plugins.worker import flush_worker
from crux_dask.store import PAGStore
from crux_dask.wcp import critical_path

from workloads import chain

TOKEN = "graph-process-token"
DASHBOARD = {"dashboard": True, "dashboard_address": ":0"}


def workflow(client: Client) -> None:
    """A chain and a fan-in on one worker thread: the same graph whatever the timing."""
    chain = 0
    for i in range(15):
        chain = dask.delayed(inc)(chain, dask_key_name=f"chain-{i}")
    total = dask.delayed(sum)([dask.delayed(inc)(i, dask_key_name=f"leaf-{i}")
                               for i in range(10)] + [chain], dask_key_name="total")
    assert client.compute(total).result() == 15 + 55


def keys_and_sizes(store: PAGStore, end: int) -> tuple[list, int, int, int]:
    """Asked of the host, answered whole (not in pieces): the key of each state, how
    many mutations and pieces, and the end state."""
    return store.states_frame()["key"].tolist(), store.n_mutations, len(store.to_pieces()), end


def path_keys(store: PAGStore, end: int) -> list[str]:
    """Asked of the host: the keys of the observed path's steps."""
    from crux_dask.wcp import critical_path

    return critical_path(store, default_end=end).steps["key"].tolist()


def held(dask_worker) -> int:
    return len(dask_worker.data)


def shape(pag: crux_dask.PAG) -> tuple[list, list]:
    """The graph without times and ids: each state's key, label and kind of place, and
    each mutation's kind between the keys of its ends."""
    states = pag.states.set_index("state_id")
    place = states["location"].str.split("@").str[0]
    vertices = sorted(zip(states["key"], states["label"], place, strict=True))
    m = pag.mutations
    edges = sorted(zip(states.loc[m["src"], "key"], states.loc[m["dst"], "key"], m["kind"],
                       strict=True))
    return vertices, edges


def recorded(graph_process: bool) -> tuple[crux_dask.PAG, dict]:
    with dask.config.set({"crux-dask.graph-process": graph_process}), \
            LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        crux_dask.attach(client)
        workflow(client)
        # The result is released once the client has it: compare graphs after that.
        poll_for(lambda: not any(client.run(held).values()), timeout=30)
        pag = crux_dask.get_pag(client)
        # Computed where the graph is: the same path as on the copy the client got.
        served = crux_dask.get_wcp(client)
        assert served.to_frame()["key"].tolist() == pag.wcp().to_frame()["key"].tolist()
        assert "computation" in set(crux_dask.get_computations(client)["kind"])
        stats = crux_dask.get_stats(client)
        process = stats["graph_process"]
        if process is not None:
            assert psutil.Process(process["pid"]).is_running()
            assert process["pid"] != os.getpid()
    if process is not None:  # closing the scheduler stopped it
        assert not psutil.pid_exists(process["pid"]) or psutil.Process(
            process["pid"]).status() == psutil.STATUS_ZOMBIE
    return pag, stats


def test_the_graph_process_builds_the_graph_the_scheduler_would():
    elsewhere, stats = recorded(graph_process=True)
    here, here_stats = recorded(graph_process=False)
    assert stats["graph_process"]["alive"] and here_stats["graph_process"] is None
    assert stats["graph_process"]["cpu_seconds"] > 0
    assert stats["graph_process"]["messages_unreadable"] == 0
    # What sending and reading back cost the scheduler's process (this one): measured.
    spent = sum(psutil.Process().cpu_times()[:2])
    assert 0 < stats["graph_process"]["seconds_sending"] < spent
    assert 0 < stats["graph_process"]["seconds_reading"] < spent
    assert stats["events_applied"] == stats["events_received"] > 30
    assert shape(elsewhere) == shape(here)


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD, config={"crux-dask.http.token": TOKEN})
async def test_when_the_graph_process_dies_for_good_its_journal_is_read_back(c, s, a, b):
    """A process that died as often as it may be started again is not: the scheduler
    reads back its journal, with what it was sent and had not made durable, and answers
    on that graph."""
    await crux_dask.attach(c)
    crux = s.plugins["crux"]
    assert isinstance(crux.host, GraphProcess)
    assert await c.submit(inc, 1, key="before") == 2
    before = await crux_dask.get_pag(c)
    assert "before" in set(before.states["key"])
    await async_poll_for(lambda: crux.host.remote["pid"] is not None, timeout=10)
    sent = crux.stats()["states"]
    crux.host.restarts = RESTARTS  # as if it had died as often already
    os.kill(crux.host.remote["pid"], signal.SIGKILL)
    await async_poll_for(lambda: not crux.host.alive, timeout=10)

    # The cluster goes on; later events are counted as dropped, never applied.
    assert await c.submit(inc, 2, key="after") == 3
    await c.run(flush_worker)
    after = await asyncio.wait_for(crux_dask.get_pag(c), 10)
    assert "before" in set(after.states["key"]) and "after" not in set(after.states["key"])
    assert after.states.equals(before.states)
    assert crux.progress().n_states == len(after.states) >= sent > 0
    path = await crux_dask.get_wcp(c)  # computed here instead, on the graph read back
    assert "before" in set(path.to_frame()["key"])
    stats = await crux_dask.get_stats(c)
    assert stats["events_dropped"] > 0 and not stats["graph_process"]["alive"]
    assert "graph process lost" in stats["last_error"]

    # A write cannot be recorded any more, and says so.
    http = AsyncHTTPClient()
    try:
        await http.fetch(f"http://127.0.0.1:{s.http_server.port}/crux/api/v1/states",
                         method="POST", headers={"Authorization": f"Bearer {TOKEN}"},
                         body=json.dumps({"key": "ext", "location": "file@h:/ext",
                                          "time": 1.0}))
    except HTTPClientError as error:
        assert error.code == 503
    else:
        raise AssertionError("a write was accepted without a graph process")


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD)
async def test_the_scheduler_keeps_no_copy_of_the_graph_and_the_api_asks_for_it(c, s, a, b):
    """The scheduler knows of the graph only how far it got, as the process says; the
    JSON API's listings are answered by the process."""
    await crux_dask.attach(c)
    crux = s.plugins["crux"]
    futures = c.map(inc, range(40), key=[f"t-{i}" for i in range(40)])  # kept: no releases
    await c.gather(futures)
    await c.run(flush_worker)
    await crux.host.drain()
    stats = crux.stats()
    assert stats["states"] >= 40 and stats["mutations"] >= 40
    held = [value for value in vars(crux.host).values() if isinstance(value, PAGStore)]
    assert held == [] and not hasattr(crux.host, "builder")

    http = AsyncHTTPClient()
    api = f"http://127.0.0.1:{s.http_server.port}/crux/api/v1"
    body = json.loads((await http.fetch(f"{api}/states?limit=10000")).body)
    assert body["total"] == stats["states"] == len(body["states"])
    assert {f"t-{i}" for i in range(40)} <= {state["key"] for state in body["states"]}
    body = json.loads((await http.fetch(f"{api}/mutations?limit=1&kind=append")).body)
    assert body["total"] >= 40 and body["mutations"][0]["kind"] == "APPEND"
    last = stats["states"] - 1
    state = json.loads((await http.fetch(f"{api}/states/{last}")).body)
    assert state["state_id"] == last
    with pytest.raises(HTTPClientError) as missing:
        await http.fetch(f"{api}/states/{stats['states']}")
    assert missing.value.code == 404
    del futures


def test_a_script_without_a_main_guard_runs_once(tmp_path):
    """The graph process does not import the scheduler's main module (which would run
    such a script again)."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from distributed import Client, LocalCluster\n"
        "import crux_dask\n"
        "print('script ran', flush=True)\n"
        "with LocalCluster(n_workers=1, processes=False, dashboard_address=':0') as cluster, \\\n"
        "        Client(cluster) as client:\n"
        "    crux_dask.attach(client)\n"
        "    assert client.submit(sum, [1, 2]).result() == 3\n"
        "    assert 'sum' in set(crux_dask.get_pag(client).states['label'])\n"
        "    stats = crux_dask.get_stats(client)\n"
        "    assert stats['graph_process']['alive'] and stats['states'] > 1, stats\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("script ran") == 1


@gen_cluster(client=True)
async def test_a_graph_reaches_the_client_from_its_process_a_few_pieces_at_a_time(c, s, a, b):
    """The graph is cut where it is built and kept there: the scheduler asks for each
    piece as the client fetches it, and for the next few meanwhile, so that it never
    holds more than those; then it tells the process to let them go.  The client gets
    the scheduler's copy of the graph."""
    await crux_dask.attach(c)
    assert await c.compute(dask.delayed(sum)([dask.delayed(inc)(i) for i in range(20)])) == 210
    await crux_dask.flush(c)
    crux = s.plugins["crux"]
    assert crux.host.apart
    held, most, asked = [0], [0], []
    receive, post, fetch = crux.host._on_message, crux.host._post, KeptPieces.fetch

    def on_message(message: tuple) -> None:
        if message[0] == "answer" and isinstance(message[2], bytes):  # a piece
            held[0] += 1
            most[0] = max(most[0], held[0])
        receive(message)

    async def fetched(self: KeptPieces, index: int) -> bytes:
        piece = await fetch(self, index)
        held[0] -= 1
        return piece

    crux.host._on_message = on_message
    crux.host._post = lambda message: (asked.append(message[0]), post(message))[1]
    KeptPieces.fetch = fetched
    try:
        pag = await crux_dask.get_pag(c)
    finally:
        KeptPieces.fetch = fetch
    keys, n_mutations, n_pieces, _ = await crux.analyse(keys_and_sizes)
    assert pag.states["key"].tolist() == keys
    assert len(pag.mutations) == n_mutations > 20
    assert asked.count("piece") == n_pieces > 2 * PIECES_AHEAD and asked.count("release") == 1
    assert 1 <= most[0] <= PIECES_AHEAD + 1 and held[0] == 0 and crux.staged == {}


@gen_cluster(client=True)
async def test_a_piece_of_an_answer_let_go_is_refused_and_the_process_goes_on(c, s, a, b):
    await crux_dask.attach(c)
    assert await c.submit(inc, 1, key="one") == 2
    await crux_dask.flush(c)
    crux = s.plugins["crux"]
    kept = await crux.pieces()
    number = kept._ask.args[1]  # the answer's, in the process
    assert isinstance(kept, KeptPieces) and kept.head == crux.progress().end
    with pytest.raises(IndexError):
        await kept.fetch(len(kept))
    with pytest.raises(KeyError, match=f"no piece {len(kept)} of answer {number}"):
        await crux.host._ask("piece", number, len(kept))  # refused there too
    assert PAGStore.from_pieces(await kept.fetch_all()).n_states == crux.progress().n_states
    kept.release()
    with pytest.raises(KeyError, match="let go"):
        await kept.fetch(1)
    with pytest.raises(KeyError, match="let go, or never made"):
        await crux.host._ask("piece", number, 1)
    assert crux.host.apart and "one" in set((await crux_dask.get_pag(c)).states["key"])


@gen_cluster(client=True)
async def test_stagings_a_client_never_fetched_are_let_go_in_the_process(c, s, a, b):
    """Past STAGED_MAX stagings, the oldest goes, and the process is told to let go of
    the pieces it kept for it; the newest can still be fetched."""
    from crux_dask.plugins.api import _stage_pag_on_scheduler
    from crux_dask.plugins.scheduler import STAGED_MAX

    await crux_dask.attach(c)
    assert await c.submit(inc, 1, key="one") == 2
    await crux_dask.flush(c)
    crux = s.plugins["crux"]
    posted = []
    post = crux.host._post
    crux.host._post = lambda message: (posted.append(message[0]), post(message))[1]
    tokens = [(await _stage_pag_on_scheduler(s))[0]]
    evicted = crux.staged[tokens[0]].parts[-1]  # the live graph, kept by the process
    tokens += [(await _stage_pag_on_scheduler(s))[0] for _ in range(STAGED_MAX + 1)]
    assert list(crux.staged) == tokens[2:] and posted.count("release") == 2
    with pytest.raises(KeyError, match="let go"):
        await evicted.fetch(0)
    with pytest.raises(KeyError, match="let go, or never made"):  # the process's answer
        await crux.host._ask("piece", evicted._ask.args[1], 0)
    newest = crux.staged[tokens[-1]]
    pieces = [await crux.staged_piece(tokens[-1], i) for i in range(len(newest))]
    assert PAGStore.from_pieces(pieces[1:]).n_states == crux.progress().n_states
    assert tokens[-1] not in crux.staged and posted.count("release") == 3


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD)
async def test_a_path_whose_pieces_died_with_the_process_is_made_again_for_the_http_api(
        c, s, a, b):
    """The JSON API's path, made and kept by the graph process, which dies before the
    first piece is sent: the process that resumes makes it again."""

    await crux_dask.attach(c)
    assert await c.compute(chain(30)) == 30
    await crux_dask.flush(c)
    crux = s.plugins["crux"]
    analyse, answers = crux.analyse, []

    async def dying(function, *args):
        answer = await analyse(function, *args)
        answers.append(type(answer).__name__)
        if crux.host.restarts == 0:
            os.kill(crux.host.remote["pid"], signal.SIGKILL)
            await async_poll_for(lambda: crux.host.restarts == 1, timeout=10)
        return answer

    crux.analyse = dying
    response = await AsyncHTTPClient().fetch(
        f"http://127.0.0.1:{s.http_server.port}/crux/api/v1/wcp")
    assert answers == ["KeptPieces", "KeptPieces"]  # the second by the process resumed
    await crux.host.drain()
    steps = json.loads(response.body)["steps"]
    assert [step["key"] for step in steps] == await crux.analyse(path_keys)
    assert len(steps) > 30


@gen_cluster(client=True)
async def test_a_staging_let_go_while_its_client_fetches_is_made_again(c, s, a, b):
    """A client whose staging was let go (for newer ones) while it fetched stages again."""
    await crux_dask.attach(c)
    assert await c.compute(chain(30)) == 30
    await crux_dask.flush(c)
    crux = s.plugins["crux"]
    fetch, stage, stagings = crux.staged_piece, crux.stage, []

    async def staged_piece(token: str, index: int) -> bytes:
        if index == 2 and len(stagings) == 1:  # as if newer stagings had pushed it out
            crux.staged.pop(token).release()
        return await fetch(token, index)

    crux.staged_piece = staged_piece
    crux.stage = lambda parts: (stagings.append(parts), stage(parts))[1]
    pag = await crux_dask.get_pag(c)
    assert len(stagings) == 2 and crux.staged == {}
    assert len(pag.states) == crux.progress().n_states > 30


@gen_cluster(client=True)
async def test_attach_returns_once_the_graph_process_is_up(c, s, a, b):
    """``attach`` waits for the process to start and import what it needs: its CPU
    (0.6 s, mostly imports) falls before the first computation recorded, not on its
    cores.  A scheduler with Crux preloaded starts none until it has something to
    build."""
    await c.register_plugin(CruxSchedulerPlugin())  # as a preload would
    host = s.plugins["crux"].host
    assert not host._started
    await crux_dask.attach(c)  # the plugin is the same one: registering is idempotent
    assert s.plugins["crux"].host is host and host.remote["pid"] is not None
    process = psutil.Process(host.remote["pid"])
    started = sum(process.cpu_times()[:2])
    assert started > 0.1
    assert await c.submit(inc, 1, key="one") == 2
    await crux_dask.flush(c)
    assert sum(process.cpu_times()[:2]) - started < 0.1


@gen_cluster(client=True)
async def test_a_scheduler_closes_without_waiting_for_a_graph_process_still_starting(
        c, s, a, b):
    """A scheduler closed while its graph process still starts (it imports this package)
    does not wait for it; once started, it reads "close" and
    exits."""
    await c.register_plugin(CruxSchedulerPlugin())  # as a preload would: nothing started
    ingest = s.plugins["crux"].host
    assert not ingest._started
    may_start = threading.Event()
    spawn = ingest._spawn
    ingest._spawn = lambda: (may_start.wait(30), spawn())[1]
    assert await c.submit(inc, 1, key="one") == 2
    ingest.tick()  # the writer starts, and waits to spawn the process
    assert ingest._started
    await c.close()
    # It would otherwise wait for word from the process, 5 s at most.
    await asyncio.wait_for(s.close(), 4)
    assert ingest._process is None and not ingest.alive  # closed, not waiting
    may_start.set()
    await async_poll_for(lambda: ingest._process is not None
                         and ingest._process.poll() is not None, timeout=30)
    assert ingest._process.returncode == 0


def test_a_staging_reads_its_parts_as_one_sequence():
    """Pieces of several parts, fetched by their place in the whole; what is not bytes
    is pickled as it is fetched."""
    parts = [Pieces([b"a", {"b": 1}]), Pieces(), Pieces([b"c"]), Pieces([b"d", b"e"])]
    staging = Staging(parts)
    whole = [piece for part in parts for piece in part]
    assert len(staging) == len(whole) == 5
    fetched = [asyncio.run(staging.fetch(index)) for index in range(len(staging))]
    assert fetched == [b"a", pickle.dumps({"b": 1}, protocol=5), b"c", b"d", b"e"]
    for index in (-1, 5):
        with pytest.raises(IndexError):
            asyncio.run(staging.fetch(index))


@gen_cluster(client=True)
async def test_a_fetch_cut_short_by_the_graph_process_s_death_is_made_again(c, s, a, b):
    """If the graph process dies while the client fetches the pieces it keeps, the client
    gets the graph all the same, staged again by the process that resumes."""
    await crux_dask.attach(c)
    assert await c.compute(chain(50)) == 50
    await crux_dask.flush(c)
    crux = s.plugins["crux"]
    fetch = crux.staged_piece

    async def staged_piece(token: str, index: int) -> bytes:
        if index == 3 and crux.host.restarts == 0:
            os.kill(crux.host.remote["pid"], signal.SIGKILL)
            await async_poll_for(lambda: crux.host.restarts == 1, timeout=10)
        return await fetch(token, index)

    crux.staged_piece = staged_piece
    stage, stagings = crux.stage, []
    crux.stage = lambda parts: (stagings.append([type(part).__name__ for part in parts]),
                                stage(parts))[1]
    pag = await crux_dask.get_pag(c)
    assert crux.host.alive and crux.staged == {}
    assert [kinds[-1] for kinds in stagings] == ["KeptPieces", "KeptPieces"]  # staged again
    await crux.host.drain()
    keys, n_mutations, _, _ = await crux.analyse(keys_and_sizes)
    assert pag.states["key"].tolist() == keys and len(keys) > 50
    assert len(pag.mutations) == n_mutations


@gen_cluster(client=True)
async def test_a_question_that_cannot_travel_fails_only_its_asker(c, s, a, b):
    """What cannot be pickled never reaches the process: its asker gets the error, and
    the writer goes on sending what follows."""
    await crux_dask.attach(c)
    crux = s.plugins["crux"]
    assert crux.host.apart
    with pytest.raises(Exception, match=r"lambda|pickle"):
        await crux.host.ask(lambda store, end: end)
    assert "could not send 'analyse'" in crux.host.last_error
    assert await c.submit(inc, 1, key="after") == 2
    assert "after" in set((await crux_dask.get_pag(c)).states["key"])
    assert crux.host.apart


@gen_cluster(client=True, config={"crux-dask.graph-process": False})
async def test_a_long_path_reaches_the_client_a_piece_per_message(c, s, a, b):
    """A path is pickled where it is computed and cut into pieces, which the client fetches
    one per message: the scheduler never holds nor replies with one large buffer."""
    from crux_dask.plugins import staging
    from crux_dask.wcp import critical_path

    await crux_dask.attach(c)
    assert await c.compute(chain(300)) == 300
    await crux_dask.flush(c)
    crux = s.plugins["crux"]
    staged = []
    stage = crux.stage
    crux.stage = lambda parts: (staged.append([len(p) for part in parts for p in part]),
                                stage(parts))[1]
    piece_bytes, staging.PIECE_BYTES = staging.PIECE_BYTES, 4096
    try:
        path = await crux_dask.get_wcp(c)
    finally:
        staging.PIECE_BYTES = piece_bytes
    (sizes,) = staged
    assert len(sizes) > 10 and max(sizes) == 4096 and crux.staged == {}  # all fetched
    expected = critical_path(crux.host.builder.store, default_end=crux.host.builder.end)
    assert len(path) == len(expected) > 300
    assert path.steps["key"].tolist() == expected.steps["key"].tolist()


@gen_cluster(client=True, config={"crux-dask.max-states": 100})
async def test_spooled_segments_are_read_back_by_the_graph_process_a_piece_per_message(
        c, s, a, b):
    """For an export, the segments spooled to disk are read back and cut where they
    were written, and kept there: only how many pieces each has reaches the scheduler,
    then a piece per message as they are fetched, as they are on disk."""
    from crux_dask.plugins.host import split_pieces
    from crux_dask.provenance import read_dataset

    await crux_dask.attach(c)
    for _ in range(2):  # each flushed graph is more than max-states: a segment spooled
        assert await c.compute(chain(300)) == 300
        await crux_dask.flush(c)
    crux = s.plugins["crux"]
    assert crux.host.apart and len(crux.spool.run_ids) >= 2
    kinds = []
    receive = crux.host._on_message
    crux.host._on_message = lambda message: (kinds.append(message[0]), receive(message))
    kept = await crux.spooled_pieces()
    assert isinstance(kept, KeptPieces) and [k for k in kinds if k != "rows"] == ["kept"]
    pieces = await kept.fetch_all()
    kept.release()
    assert kinds.count("answer") == len(pieces) == sum(kept.head)
    on_disk = [store for run_id in crux.spool.run_ids
               for store in read_dataset(crux.spool.directory, run_id).stores]
    assert len(kept.head) == len(on_disk)
    for part, written in zip(split_pieces(pieces, kept.head), on_disk, strict=True):
        store = PAGStore.from_pieces(part)
        every = np.arange(written.n_states)
        assert store.n_states == written.n_states > 0
        assert store.states_frame(every).equals(written.states_frame(every))


def test_what_is_recorded_goes_to_the_process_in_messages_of_bounded_size():
    """Each message to the process holds at most MESSAGE_ENTRIES entries and, past a
    batch that fills it, about MESSAGE_BYTES of the workers' batches; in order."""
    process = GraphProcess(Spool(None, None), {
        "max_pending": 10**6, "park_timeout": 10.0, "max_states": None, "spool_dir": None,
        "apply_interval": 0.1})
    posted: list[tuple] = []
    process._post = posted.append  # what the writer thread would pickle and send
    process._started = True
    try:
        entries = [("task", i) for i in range(5000)]
        process.queue.extend(entries)
        process.tick()
        assert [len(message[2]) for message in posted] == [2048, 2048, 904]
        assert [message[1] for message in posted] == [0, 1, 2]  # numbered, to be acknowledged
        assert [entry for message in posted for entry in message[2]] == entries

        posted.clear()
        events = [("transfer", f"k-{i}", "memory@a", "memory@b", 1.0, 2.0, 8)
                  for i in range(15_000)]
        batch = encode_batch(events, "tcp://w:1", 0)
        assert MESSAGE_BYTES // 4 < len(batch) < MESSAGE_BYTES // 2
        queued = []
        for i in range(12):
            process.queue_batch(batch)
            queued.append(batch)
            process.queue.append(("task", i))
            queued.append(("task", i))
        process.tick()
        assert [entry for message in posted for entry in message[2]] == queued
        assert len(posted) > 1
        for message in posted:
            size = sum(len(e) if isinstance(e, bytes) else 1_000 for e in message[2])
            assert size < MESSAGE_BYTES + len(batch)
    finally:
        process.spool.close(remove_temporary=True)


def test_what_the_process_sends_is_read_back_as_it_comes_in_any_cut():
    """The scheduler reads the process's pipe on its event loop as bytes come: the
    messages a real Connection sent come back whole, whatever the reads cut."""
    reading, writing = multiprocessing.Pipe(duplex=False)
    sent = [("rows", "run", {"state_time": bytes(100_000)}, {"end": 3}), ("kept", 3, 2, 7),
            ("answer", 1, [1.5, "x"], None), ("closed",)]

    def send_all() -> None:
        for message in sent:
            writing.send(message)
        writing.close()

    sender = threading.Thread(target=send_all)
    sender.start()
    data = bytearray()
    while chunk := os.read(reading.fileno(), 1 << 16):
        data += chunk
    sender.join()
    reading.close()
    for cut in (1, 4, 999, len(data)):
        frames = Frames(len(data))
        buffers = {id(frames._buffer), id(frames._spare)}
        received = []
        for start in range(0, len(data), cut):
            received += frames.feed(memoryview(data)[start:start + cut])
        assert received == sent
        # Room enough from the start: the two buffers it made are all it used.
        assert {id(frames._buffer), id(frames._spare)} == buffers
        assert len(frames._buffer) == len(frames._spare) == len(data)
    # Read from the pipe straight into the buffers, a few hundred bytes at a time.
    reading, writing = multiprocessing.Pipe(duplex=False)
    sender = threading.Thread(target=send_all)
    sender.start()
    frames, received, read = Frames(), [], None
    while read != 0:
        read, messages = frames.read(reading.fileno(), 999)
        received += messages
    sender.join()
    reading.close()
    assert received == sent
    # More than 2 GiB is told by a length of -1 and 8 bytes: the same message here.
    body = pickle.dumps(sent[1])
    assert Frames().feed(struct.pack("!i", -1) + struct.pack("!Q", len(body)) + body) == [sent[1]]
    # A message that cannot be read is counted and skipped; the next one still comes.
    frames = Frames()
    garbage = b"not a pickle"
    assert frames.feed(struct.pack("!i", len(garbage)) + garbage + struct.pack("!i", len(body))
                       + body) == [sent[1]]
    assert frames.undecodable == 1


def test_a_read_takes_its_budget_of_messages_and_leaves_the_rest_waiting():
    """What a message holds is fresh memory, paid for on the event loop: one read takes
    the messages that start within its budget of bytes, and the messages complete
    after them wait for the next reads, which take them without reading the pipe."""
    reading, writing = multiprocessing.Pipe(duplex=False)
    sent = [b"x" * 3000, *range(5), b"y" * 5000, "last"]
    for message in sent:
        writing.send(message)
    writing.close()
    sizes = {repr(message): len(pickle.dumps(message)) + 4 for message in sent}
    frames, calls, read = Frames(), [], None
    while read != 0:
        read, messages = frames.read(reading.fileno(), 2048)
        calls.append((read, messages))
    reading.close()
    assert [message for _, messages in calls for message in messages] == sent
    for _, messages in calls:  # every message but the last started within the budget
        assert sum(sizes[repr(message)] for message in messages[:-1]) < 2048
    # The read that completed the 3,000 bytes completed small messages after them too.
    waited = [messages for read, messages in calls if read is None]
    assert waited and waited[0][0] == 0
    assert not frames.waiting


@gen_cluster(client=True)
async def test_messages_read_past_a_turn_s_budget_are_taken_in_the_next_turns(c, s, a, b):
    """Read a few hundred bytes a turn, the graph's pieces and the answer after them
    come in many turns, the pipe unread while complete messages wait: all arrive."""
    from crux_dask.plugins import graph_pipe

    await crux_dask.attach(c)
    assert await c.compute(chain(300)) == 300
    await crux_dask.flush(c)
    crux = s.plugins["crux"]
    assert crux.host.apart
    read_bytes, graph_pipe.READ_BYTES = graph_pipe.READ_BYTES, 300
    try:
        pag = await crux_dask.get_pag(c)
        path = await crux_dask.get_wcp(c)
    finally:
        graph_pipe.READ_BYTES = read_bytes
    assert not crux.host._paused and not crux.host._frames.waiting
    assert len(pag.states) == crux.progress().n_states
    expected = critical_path(pag.stores[0], default_end=pag.ends[0])
    assert len(path) == len(expected) > 300
    assert path.steps["key"].tolist() == expected.steps["key"].tolist()
    assert path.steps["key"].tolist() == await crux.analyse(path_keys)
