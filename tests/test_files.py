"""Files that tasks read and write become data states, without a change to user code.

The files on disk are the independent witness: every file a workflow read or
wrote must have a state of its size, and nothing else may.  A known injected
delay checks the seconds a task spends on its files.
"""

from __future__ import annotations

import _io
import builtins
import io
import os
import pickle
import sys
import threading
import time
from pathlib import Path

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import gen_cluster, poll_for

import crux_dask
from crux_dask import PAGBuilder
from crux_dask.dashboard.data import cached_key_groups
from crux_dask.model import file_group, file_label
from crux_dask.path import CATEGORIES
from crux_dask.plugins import files as watched
from crux_dask.plugins.entries import TaskFiles, Whole
from crux_dask.plugins.ingest import Ingest
from crux_dask.plugins.protocol import FILES, FOLLOW
from crux_dask.plugins.spool import Spool
from crux_dask.plugins.task_reports import FILES_INLINE
from crux_dask.plugins.tasks import Finished, task_events

HOST = "node1"
A = "tcp://10.0.0.1:1"
B = "tcp://10.0.0.2:1"


# -- the graph's rules, on events -------------------------------------------
def location(path: str) -> str:
    return f"file@{HOST}:{path}"


def test_a_file_read_by_two_tasks_is_one_state_and_a_rewrite_is_a_new_version():
    b = PAGBuilder()
    b.root(0.0)
    for key, start in (("load-0", 1.0), ("load-1", 1.5)):
        b.apply(("file", key, A, location("/data/in.csv"), False, start, 100, start - 0.2))
        b.compute(key, A, 1, start, start + 0.4, 8, io=0.1)
    b.apply(("file", "load-1", A, location("/data/in.csv"), True, 1.9, 250))
    states = b.pag().states
    files = states[states["location"] == location("/data/in.csv")]
    assert files["size"].tolist() == [100, 250]  # read twice, then rewritten
    assert files["origin"].tolist() == ["file", "load"]
    mutations = b.pag().mutations
    reads = mutations[mutations["src"] == files.index[0]]
    assert reads["kind"].tolist() == ["TRANSFER", "TRANSFER"]
    # Each task computed from its own copy of the file, which counts as made at its start.
    copies = states.loc[reads["dst"]]
    assert copies["time"].tolist() == [1.0, 1.5]
    assert (copies["location"] == f"memory@{A}").all()
    made = mutations[mutations["src"].isin(reads["dst"])]
    assert states.loc[made["dst"], "key"].tolist() == ["load-0", "load-1"]
    # A later read takes the newest version.
    b.apply(("file", "use", A, location("/data/in.csv"), False, 2.0, 250))
    b.compute("use", A, 1, 2.0, 2.1, 8, io=0.0)
    path = b.pag().wcp()
    assert path.states["key"].tolist()[-3:] == ["/data/in.csv"] * 2 + ["use"]
    assert path.states["size"].tolist()[-3] == 250


def test_a_read_reported_before_the_write_it_waits_for_reads_that_write():
    # The reader's read counts at its start, the writer's write at its stop: workers'
    # clocks, re-estimated at each heartbeat, can put the read a millisecond first.
    b = PAGBuilder()
    b.root(0.0)
    b.apply(("file", "read", A, location("/d/blob.bin"), False, 1.000, 64, 0.9, -1, ("write",)))
    b.compute("write", A, 1, 0.5, 1.001, 8)
    b.apply(("file", "write", A, location("/d/blob.bin"), True, 1.001, 64))
    b.compute("read", A, 1, 1.000, 1.4, 8, inputs=["write"], io=0.3)
    states = b.pag().states
    files = states[states["location"] == location("/d/blob.bin")]
    assert files["origin"].tolist() == ["write"]  # no second version, there before
    m = b.pag().mutations
    copy = m[m["src"] == files.index[0]]["dst"]  # the read's copy of the version written
    assert states.loc[m[m["src"].isin(copy)]["dst"], "key"].tolist() == ["read"]
    # A file no input wrote was there before, read with its task.
    b.apply(("file", "again", A, location("/d/other.bin"), False, 2.0, 10, 1.9, -1,
             ("read", "late")))
    assert b.pag().states["key"].tolist()[-1] == "read"  # waits for "late"
    b.compute("late", A, 1, 1.5, 1.9, 8)
    b.compute("again", A, 1, 2.0, 2.1, 8, inputs=["read", "late"], io=0.0)
    states = b.pag().states
    assert states[states["key"] == "/d/other.bin"]["origin"].tolist() == ["file", "file"]


def test_a_computation_s_seconds_on_files_are_io_on_the_path():
    b = PAGBuilder()
    b.root(0.0)
    b.apply(("file", "load", A, location("/d/x.parquet/part.0.parquet"), False, 1.0, 10, 0.5))
    b.compute("load", A, 1, 1.0, 2.0, 8, sent=0.5,
              received=0.6, runnable=0.6, io=0.7)
    path = b.pag().wcp()
    assert path.breakdown["io"] == pytest.approx(0.7)
    assert path.breakdown["compute"] == pytest.approx(0.3)
    # Root to start: sent at 0.5; the read records no arrival of its task.
    assert (path.breakdown["scheduler"], path.breakdown["scheduling"]) == pytest.approx(
        (0.5, 0.5))
    assert path.breakdown["wait"] == pytest.approx(0.0)
    assert path.states["label"].tolist()[1] == "x.parquet"
    assert b.pag().moments["io"].dropna().tolist() == [0.7]


def test_a_file_there_before_appears_when_the_graph_that_reads_it_arrives():
    b = PAGBuilder()
    b.root(0.0, "attach")
    graph = b.root(600.0)  # submitted ten minutes after Crux was attached
    b.apply(("file", "load", A, location("/d/in.csv"), False, 601.0, 10, 600.5, graph))
    b.compute("load", A, 1, 601.0, 602.0, 8, root=graph, sent=600.5, received=600.6,
              runnable=600.6, io=0.2)
    path = b.pag().wcp()
    assert path.states["time"].iloc[0] == 600.0 and path.length == pytest.approx(2.0)
    assert (path.breakdown["scheduler"], path.breakdown["scheduling"]) == pytest.approx(
        (0.5, 0.5))
    assert path.breakdown["wait"] == pytest.approx(0.0)


def test_a_write_waits_for_the_report_of_its_task():
    b = PAGBuilder()
    b.root(0.0)
    b.apply(("file", "save", A, location("/out/a.bin"), True, 2.0, 64))
    assert b.n_parked == 1
    b.compute("save", A, 1, 1.0, 2.0, 8)
    assert b.n_parked == 0
    states = b.pag().states
    (written,) = states.index[states["location"] == location("/out/a.bin")]
    assert states.loc[written, ["size", "origin", "label"]].tolist() == [64, "save", "a.bin"]


@pytest.mark.parametrize("event", [
    ("file", "k", A, "memory@x", False, 1.0, 10),           # not a file's location
    ("file", "k", A, location("/a"), "yes", 1.0, 10),      # written is not a flag
    ("file", "k", A, location("/a"), False, float("nan"), 10),
    ("file", "k", A, location("/a"), False, 1.0, -1),
    ("file", "k", A, location("/a"), False, 1.0),           # too short
])
def test_a_malformed_file_event_is_refused_and_changes_nothing(event):
    b = PAGBuilder()
    b.root(0.0)
    with pytest.raises((ValueError, TypeError)):
        b.apply(event)
    assert b.store.n_states == 1


def test_what_a_worker_reports_in_another_form_gives_no_files():
    def entry(files, annotation=None):
        return Finished("t", False, A, 1, 1.0, 2.0, 8, (), "t", "t", annotation, None,
                        files=files)

    assert [e[0] for e in task_events(entry([0.1, HOST, [["/a", False, 5]]]))] == [
        "file", "compute"]
    for files in ([0.1, HOST], "junk", [-1.0, HOST, [["/a", False, 5]]],
                  [0.1, HOST, [["/a", "no", 5]]], [0.1, 7, [["/a", False, 5]]]):
        assert [e[0] for e in task_events(entry(files))] == ["compute"]
    # A task that says itself what it wrote: the annotation wins.
    told = task_events(entry([0.1, HOST, [["/a", True, 5]]], {"location": location("/b")}))
    assert [e[0] for e in told] == ["compute"] and told[0][12] == location("/b")


def test_a_file_read_after_it_was_written_elsewhere_finds_the_write_whatever_the_clocks():
    # The writer waits for an input its worker reports later; the reader's worker's
    # clock puts its read 50 ms before the write, though it ran after it.
    ingest = Ingest(PAGBuilder(), Spool(None, None), max_pending=10**9, park_timeout=10.0)
    ingest.root(0.0, "graph")

    def task(key, worker, start, inputs, path, written):
        return Whole(key, "memory", worker, 1,
                [{"action": "compute", "start": start, "stop": start + 1}], 8, inputs, key,
                key, None, None, {FILES: (0.1, HOST, [[path, written, 100]])}, start + 1)

    ingest.queue.extend([task("writer", A, 2.0, ["input"], "/o/p1", True),
                         task("reader", B, 2.95, [], "/o/p1", False)])
    ingest.pending = 2
    ingest.apply_slice()
    ingest.record(("compute", "input", A, 1, 0.5, 1.0, 8, (), 0, None, None, None, None,
                   None, None))
    ingest.apply_slice()
    states = ingest.builder.pag().states
    files = states[states["key"] == "/o/p1"]
    assert files["origin"].tolist() == ["writer", "writer"]  # written, then read: one file
    assert files["location"].tolist() == [location("/o/p1"), f"memory@{B}"]


def test_files_are_labelled_and_shown_by_their_dataset():
    assert file_label("/d/out.parquet/part.0.parquet") == "out.parquet"
    assert file_label("/d/x.zarr/x/0.0") == "x.zarr"
    assert file_label("/home/me/data/0.csv") == "0.csv"
    assert file_group("/d/out.parquet/part.0.parquet") == "/d/out.parquet"
    assert file_group("/d/x.zarr/x/0.0") == "/d/x.zarr"
    assert file_group("/home/me/data/0.csv") == "/home/me/data/"
    # On the dashboard's map, the 200 parts of a dataset are one group, not 200.
    b = PAGBuilder()
    b.root(0.0)
    for i in range(200):
        b.compute(f"save-{i}", A, 1, 1.0, 2.0, 8, io=0.0)
        b.apply(("file", f"save-{i}", A, location(f"/d/out.parquet/part.{i}.parquet"), True,
                 2.0, 10))
    groups = set(cached_key_groups(b.store).tolist())
    assert groups == {"root", "save", "/d/out.parquet"}


# -- real workflows ---------------------------------------------------------------
def write_bytes(path: str, n: int) -> str:
    with open(path, "wb") as f:
        f.write(os.urandom(n))
    return path


def read_then_wait(path: str, seconds: float) -> int:
    with open(path, "rb") as f:
        data = f.read()
    time.sleep(seconds)  # off the CPU, as a task waiting for storage is
    return len(data)


def read_then_spin(path: str, seconds: float) -> int:
    with open(path, "rb") as f:
        data = f.read()
    end = time.thread_time() + seconds
    while time.thread_time() < end:  # on the CPU
        pass
    return len(data)


def sized_later(name: str, files, time: float = 1.0) -> tuple:
    """A task's entry whose worker sends its files after it."""
    return Whole(name, "memory", A, 1, [{"action": "compute", "start": time, "stop": time + 1}],
            8, [], name, name, None, None, {FILES: (0.5, HOST, files)}, time + 1)


def test_files_sized_after_their_task_join_it_in_either_order_or_it_goes_without():
    ingest = Ingest(PAGBuilder(), Spool(None, None), max_pending=10**9, park_timeout=10.0)
    ingest.root(0.0, "graph")
    read = [["/in/a.csv", False, 10], ["/in/b.csv", False, 20]]
    ingest.queue.extend([
        sized_later("after", FOLLOW, 1.0), TaskFiles("after", A, read),   # the usual order
        TaskFiles("before", A, read), sized_later("before", FOLLOW, 3.0),  # files first
        sized_later("never", FOLLOW, 5.0),                                    # worker gone
        TaskFiles("stray", A, read),                                       # task never came
    ])
    ingest.pending = len(ingest.queue)
    ingest.apply_slice()
    assert set(ingest.awaiting_files) == {("never", A)}
    assert set(ingest.early_files) == {("stray", A)}
    ingest.resolve(None)
    assert not ingest.awaiting_files and not ingest.early_files
    assert (ingest.counts["file_lists_missing"], ingest.counts["file_lists_unmatched"]) == (1, 1)

    pag = ingest.builder.pag()
    states, mutations = pag.states, pag.mutations
    for name, copies in (("after", 2), ("before", 2), ("never", 0)):
        (task,) = states.index[states["key"] == name]
        inputs = states.loc[mutations.loc[mutations["dst"] == task, "src"]]
        assert (inputs["location"].str.startswith("memory@")).sum() == copies, name
    files = states[states["location"].str.startswith("file@")]
    assert sorted(files["size"]) == [10, 20]  # each file once, at its size


def file_states(pag: crux_dask.PAG, directory) -> pd.DataFrame:
    states = pag.states
    return states[states["location"].str.startswith("file@")
                  & states["key"].str.startswith(str(directory))]


def read_and_wait_for(path: str, opened: str, go_on: str) -> int:
    from distributed import Event

    with open(path, "rb") as f:
        data = f.read()
    Event(opened).set()
    Event(go_on).wait()  # off the CPU, as a task waiting for storage is
    return len(data)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_heartbeat_during_the_task_leaves_its_seconds_on_files_as_they_were(
        c, s, a, tmp_path):
    from distributed import Event

    await crux_dask.attach(c)
    write_bytes(str(tmp_path / "in.bin"), 10)
    opened, go_on = Event("opened"), Event("go-on")
    started = time.monotonic()  # before the file is opened: its seconds are within
    future = c.submit(read_and_wait_for, str(tmp_path / "in.bin"), "opened", "go-on",
                      key="reader")
    await opened.wait()
    a.scheduler_delay -= 0.25  # the worker's estimate of the scheduler's clock moves
    await go_on.set()
    assert await future == 10
    waited = time.monotonic() - started
    await crux_dask.flush(c)
    pag = await crux_dask.get_pag(c)
    readers = pag.states.index[pag.states["key"] == "reader"]
    (task,) = pag.moments.set_index("state_id").reindex(readers).dropna(
        subset=["io"]).itertuples()
    assert 0 < task.io <= waited
    assert task.io < 0.25  # a 10-byte read, not the clock's move
    # Its worker's moments travel with its files: when it reached the worker and when it
    # could run, two times (neither missing, NaN).
    assert task.received <= task.runnable


def write_three_ways(directory: str) -> list[str]:
    """A file by ``open()``, one by ``os.open``, one by pathlib under a temporary name
    then given its own (as zarr's stores write)."""
    with open(os.path.join(directory, "a.bin"), "wb") as f:
        f.write(b"a")
    descriptor = os.open(os.path.join(directory, "b.bin"), os.O_WRONLY | os.O_CREAT)
    os.write(descriptor, b"bb")
    os.close(descriptor)
    temporary = Path(directory, "c.partial")
    temporary.write_bytes(b"ccc")
    temporary.replace(Path(directory, "c.bin"))
    return sorted(str(path) for path in Path(directory).iterdir())


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_what_opens_files_is_wrapped_while_a_worker_records_and_put_back_after(
        c, s, a, tmp_path):
    assert open is _io.open and os.open is os.__dict__["open"]
    originals = [os.open, os.rename, os.replace, os.link]
    await crux_dask.attach(c)
    assert open is io.open is not _io.open  # one wrapper for both names, as before
    wrapped = [open, os.open, os.rename, os.replace, os.link]
    assert [pickle.loads(pickle.dumps(f)) for f in wrapped] == wrapped  # by name, as before
    written = await c.submit(write_three_ways, str(tmp_path), key="writer")
    with pytest.raises(FileNotFoundError), open(tmp_path / "missing.bin"):
        pass  # a failure is the same, and nothing is noted
    await crux_dask.flush(c)
    pag = await crux_dask.get_pag(c)
    files = file_states(pag, tmp_path)
    assert dict(zip(files["key"], files["size"])) == {
        path: os.path.getsize(path) for path in written}  # not c.partial
    assert (files["origin"] == "writer").all()

    await a.close()  # the process's last recorder
    assert open is io.open is _io.open
    assert [os.open, os.rename, os.replace, os.link] == originals


def test_a_function_wrapped_again_by_someone_else_is_left_to_them():
    with watched._install_lock:
        watched._install()
    theirs = builtins.open = lambda *args, **kwargs: None
    try:
        with watched._install_lock:
            watched._uninstall()
        assert builtins.open is theirs and io.open is _io.open
    finally:
        builtins.open = _io.open


@gen_cluster(client=True, nthreads=[("127.0.0.1", 2)])
async def test_patterns_and_annotations_decide_what_is_recorded(c, s, a, tmp_path):
    for name in ("keep.bin", "skip-me.bin", "told.bin"):
        write_bytes(str(tmp_path / name), 10)
    with dask.config.set({"crux-dask.files.exclude": [str(tmp_path / "skip-*")]}):
        await crux_dask.attach(c)
    kept = dask.delayed(read_then_wait)(str(tmp_path / "keep.bin"), 0, dask_key_name="keep")
    skipped = dask.delayed(read_then_wait)(str(tmp_path / "skip-me.bin"), 0,
                                           dask_key_name="skip")
    with dask.annotate(crux={"location": f"file@elsewhere:{tmp_path}/told.h5"}):
        told = dask.delayed(read_then_wait)(str(tmp_path / "told.bin"), 0,
                                            dask_key_name="told")
    assert await c.gather(c.compute([kept, skipped, told])) == [10, 10, 10]
    pag = await crux_dask.get_pag(c)
    opened = file_states(pag, tmp_path)
    assert sorted(opened["label"]) == ["keep.bin"]
    assert (pag.states["location"] == f"file@elsewhere:{tmp_path}/told.h5").sum() == 1


def held(dask_worker) -> int:
    return len(dask_worker.data)


def check_breakdown(path) -> None:
    assert set(path.breakdown) == set(CATEGORIES)
    assert sum(path.breakdown.values()) == pytest.approx(path.length, abs=1e-6)


def test_a_csv_to_parquet_pipeline_and_its_second_reading(crux_client, tmp_path):
    (tmp_path / "in").mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        n = 5_000 * (i + 1)
        pd.DataFrame({"x": np.arange(n), "y": rng.random(n)}).to_csv(
            tmp_path / "in" / f"{i}.csv", index=False)
    df = dd.read_csv(str(tmp_path / "in" / "*.csv"))
    df.assign(z=df.x * 2).to_parquet(str(tmp_path / "out.parquet"))
    total = dd.read_parquet(str(tmp_path / "out.parquet"))["z"].sum().compute()
    assert total == sum(2 * (5_000 * (i + 1)) * (5_000 * (i + 1) - 1) // 2 for i in range(4))
    # The result is released once the client has it: the graph is compared with
    # its export below, so both must come after its release.
    poll_for(lambda: not any(crux_client.run(held).values()), timeout=30)

    pag = crux_dask.get_pag(crux_client)
    files = file_states(pag, tmp_path)
    on_disk = {str(p): p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()}
    assert set(files["key"]) == set(on_disk)  # every file read or written, and nothing else
    newest = files.drop_duplicates("key", keep="last").set_index("key")["size"]
    assert newest.to_dict() == on_disk
    inputs = files[files["key"].str.endswith(".csv")]
    assert len(inputs) == 4 and (inputs["origin"] == "file").all()  # one state per file
    outputs = files[files["label"] == "out.parquet"]
    assert len(outputs) == len(on_disk) - 4 and outputs["key"].is_unique
    assert outputs["origin"].str.startswith("toparquet").all()

    # The second computation's path starts from a file the first one wrote.
    path = pag.wcp()
    steps = path.to_frame()
    read_back = steps[(steps["kind"] == "TRANSFER")
                      & steps["source"].isin(outputs["location"])]
    assert len(read_back) == 1
    assert steps.loc[read_back.index[0] + 1, "label"].startswith("read_parquet")
    assert path.breakdown["io"] > 0
    check_breakdown(path)

    dataset = crux_dask.export_parquet(crux_client, tmp_path / "runs")
    offline = crux_dask.read_parquet(dataset)
    pd.testing.assert_frame_equal(offline.states, pag.states)
    pd.testing.assert_frame_equal(offline.moments, pag.moments)
    assert offline.wcp().breakdown == pytest.approx(path.breakdown)


def test_plain_open_in_delayed_functions_and_the_seconds_spent_on_files(crux_client, tmp_path):
    written = dask.delayed(write_bytes)(str(tmp_path / "blob.bin"), 12_345,
                                        dask_key_name="write-blob")
    waited = dask.delayed(read_then_wait)(written, 0.4, dask_key_name="wait-blob")
    spun = dask.delayed(read_then_spin)(written, 0.4, dask_key_name="spin-blob")
    assert dask.compute(waited, spun) == (12_345, 12_345)

    pag = crux_dask.get_pag(crux_client)
    (blob,) = file_states(pag, tmp_path).itertuples()
    assert (blob.size, blob.origin, blob.label) == (12_345, "write-blob", "blob.bin")
    states, mutations = pag.states, pag.mutations
    copies = mutations[(mutations["src"] == blob.Index) & (mutations["kind"] == "TRANSFER")]
    readers = mutations[mutations["src"].isin(copies["dst"])]
    assert sorted(states.loc[readers["dst"], "key"]) == ["spin-blob", "wait-blob"]
    io = pag.moments.set_index("state_id")["io"]
    by_key = {states.loc[r.dst, "key"]: (io[r.dst], r.stop - r.start)
              for r in readers.itertuples()}
    # Slept 0.4 s after opening: at least that off the CPU, at most the task's run (a
    # busy machine stretches it, waiting for a core or the GIL); spun 0.4 s of CPU
    # (its thread's clock): off the CPU for at most the rest of its run.
    waited, run = by_key["wait-blob"]
    assert 0.39 <= waited <= run + 1e-3, by_key
    spun, run = by_key["spin-blob"]
    assert 0.0 <= spun <= run - 0.39, by_key


def opens_while_opening(path: str) -> list[str]:
    """The files opened in this thread while it opens ``path``, seen by CPython's audit
    hook: the file itself, and what the hook that notes it opens."""
    seen: list[str] = []
    here = threading.get_ident()

    def audit(event: str, args: tuple) -> None:
        if event == "open" and threading.get_ident() == here and seen[-1:] != ["done"]:
            seen.append(str(args[0]))

    sys.addaudithook(audit)  # for the rest of this worker process: it counts nothing more
    with open(path) as f:
        f.read()
    seen.append("done")
    return seen[:-1]


def test_the_first_file_of_a_task_reads_its_thread_s_clock_once(crux_client, tmp_path):
    path = tmp_path / "first.txt"
    path.write_text("first")
    opened = crux_client.submit(opens_while_opening, str(path), pure=False).result()
    # The file, then its thread's account of CPU time, once (not the account noted as
    # the task's first file in turn, down to the end of the stack).
    assert opened[0] == str(path)
    accounts = [p for p in opened if p.startswith("/proc/self/task/")]
    assert len(accounts) == 1 and len(opened) == 2, opened[:5]


def write_and_remove(path: str) -> int:
    with open(path, "w") as f:
        f.write("scratch")
    os.remove(path)
    return 7


def test_a_file_gone_before_its_task_is_done_is_counted_not_recorded(crux_client, tmp_path):
    before = sum(w["files_gone"] for w in crux_dask.get_stats(crux_client)["workers"].values())
    assert crux_client.submit(write_and_remove, str(tmp_path / "scratch.txt")).result() == 7
    crux_dask.flush(crux_client)
    stats = crux_dask.get_stats(crux_client)["workers"].values()
    assert sum(w["files_gone"] for w in stats) == before + 1
    assert file_states(crux_dask.get_pag(crux_client), tmp_path).empty


def import_a_module(directory: str) -> str:
    sys.path.insert(0, directory)
    try:
        import crux_test_helper_module
    finally:
        sys.path.remove(directory)
    return crux_test_helper_module.NAME


def test_files_the_worker_opens_itself_never_appear(crux_client, tmp_path):
    (tmp_path / "crux_test_helper_module.py").write_text("NAME = 'helper'\n")
    data = crux_client.scatter(list(range(4)))
    assert crux_client.submit(import_a_module, str(tmp_path)).result() == "helper"
    # Spill what the workers hold, and load it back.
    crux_client.run(lambda dask_worker: dask_worker.data.evict())
    assert crux_client.submit(sum, data).result() == 6

    pag = crux_dask.get_pag(crux_client)
    states = pag.states
    assert states["location"].str.startswith("disk@").any()  # spilled indeed
    opened = states.loc[states["location"].str.startswith("file@"), "key"]
    base = str(tmp_path.parent.parent)  # the temporary directories of these tests
    assert opened.str.startswith(base).all(), opened.tolist()
    assert not opened.str.endswith((".py", ".pyc")).any()


def test_zarr_chunks_written_in_its_own_threads_and_read_back(tmp_path):
    """zarr's stores read and write in threads of their own, and write each chunk under a
    temporary name first: a worker of one thread still knows whose each chunk is."""
    pytest.importorskip("zarr")  # in the test extras; an optional library for users
    store = str(tmp_path / "a.zarr")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        x = da.random.random((400, 400), chunks=(100, 100))
        expected = float(x.sum().compute())  # the same random array: its seed is its key
        da.to_zarr(x, store)
        total = float(da.from_zarr(store).sum().compute())  # the run's last computation
        pag = crux_dask.get_pag(client)
    assert total == pytest.approx(expected)

    chunks = {str(p): p.stat().st_size for p in (tmp_path / "a.zarr" / "c").rglob("*")
              if p.is_file()}
    assert len(chunks) == 16
    files = file_states(pag, tmp_path)
    assert files.set_index("key")["size"].to_dict() == chunks  # each once, and no temporary
    assert files["origin"].str.contains("store").all()  # written by to_zarr's tasks
    assert (files["label"] == "a.zarr").all()
    states, mutations = pag.states, pag.mutations
    reads = mutations[mutations["src"].isin(files.index) & (mutations["kind"] == "TRANSFER")]
    assert sorted(reads["src"]) == sorted(files.index)  # each chunk read back once
    readers = mutations.loc[mutations["src"].isin(reads["dst"]), "dst"]
    assert len(readers) == 16 and states.loc[readers, "key"].str.contains("sum").all()
    io = pag.moments.set_index("state_id")["io"]
    assert io[readers].notna().all()
    path = pag.wcp()
    assert path.breakdown["io"] > 0
    check_breakdown(path)


def write_files(directory: str, count: int) -> int:
    for i in range(count):
        with open(os.path.join(directory, f"part-{i:04d}.bin"), "wb") as f:
            f.write(b"x" * i)
    return count


def read_files(directory: str, count: int, written: int) -> int:
    total = 0
    for i in range(count):
        with open(os.path.join(directory, f"part-{i:04d}.bin"), "rb") as f:
            total += len(f.read())
    return total


def test_a_task_that_opens_many_files_has_them_sized_after_its_completion(crux_client,
                                                                        tmp_path):
    count = 3 * FILES_INLINE  # more than the worker sizes as the task is done
    written = dask.delayed(write_files)(str(tmp_path), count, dask_key_name="write-many")
    read = dask.delayed(read_files)(str(tmp_path), count, written, dask_key_name="read-many")
    after = dask.delayed(lambda total: total + 1)(read, dask_key_name="after-many")
    assert after.compute() == sum(range(count)) + 1

    pag = crux_dask.get_pag(crux_client)
    states, mutations = pag.states, pag.mutations
    files = file_states(pag, tmp_path)
    on_disk = {str(p): p.stat().st_size for p in tmp_path.iterdir()}
    assert dict(zip(files["key"], files["size"])) == on_disk
    assert set(files["origin"]) == {"write-many"}
    # Each file written was copied into memory for the reader alone, which took all.
    copies = mutations[mutations["src"].isin(files.index) & (mutations["kind"] == "TRANSFER")]
    assert sorted(states.loc[copies["src"], "key"]) == sorted(on_disk)
    (reader,) = set(mutations.loc[mutations["src"].isin(copies["dst"]), "dst"])
    assert states.loc[reader, "key"] == "read-many"
    # The task after it waited for it, not for the files.
    made = mutations[(mutations["src"] == reader) & (mutations["kind"] == "CONVERT")]
    assert states.loc[made["dst"], "key"].tolist() == ["after-many"]
    stats = crux_dask.get_stats(crux_client)
    assert stats["file_lists_received"] >= 2  # the writer's and the reader's
    assert stats["file_lists_missing"] == stats["file_lists_rejected"] == 0
