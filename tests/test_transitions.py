"""The scheduler's transitions for the export: by default those distributed keeps in its
own log; recorded (``capture.transitions``), all of them, in order, within bounds, and
nothing the scheduler's garbage collector has to walk."""

from __future__ import annotations

import gc
import pickle
from collections import deque

import numpy as np
from distributed.utils_test import async_poll_for, gen_cluster, inc

import crux_dask
from crux_dask.plugins.logs import since
from crux_dask.plugins.transitions import (
    CHUNK,
    FIELDS,
    TransitionLog,
    chunks_of_log,
    transitions_frame,
)

RECORDED = {"crux-dask.capture.transitions": True}


def record(log: TransitionLog, n: int, first: int = 0) -> None:
    """``n`` tasks finish, as the scheduler's hook records them."""
    for i in range(first, first + n):
        log.record(("x", i), "processing", "memory", f"s-{i}")
        log.finished(f"tcp://w{i % 2}")


def test_every_transition_in_order_with_tuple_keys_whole():
    log = TransitionLog(100_000)
    record(log, 10_000)
    frame = log.frame()
    assert len(log) == len(frame) == 10_000
    assert frame["key"].tolist() == [str(("x", i)) for i in range(10_000)]
    assert frame["stimulus_id"].tolist() == [f"s-{i}" for i in range(10_000)]
    assert frame["location"].tolist()[:3] == ["tcp://w0", "tcp://w1", "tcp://w0"]
    assert (np.diff(frame["time"].to_numpy()) >= 0).all()
    assert log.dropped == 0


def test_a_task_that_left_processing_for_a_lost_worker_then_finished_has_one_worker():
    """Out of processing twice (its worker died, then it finished elsewhere): only the
    transition that finished it names a worker, in the newest rows and in a chunk."""
    log = TransitionLog(100_000)
    log.record("t", "processing", "released", "worker-gone")
    log.record("t", "released", "waiting", "worker-gone")
    log.record("t", "waiting", "processing", "worker-gone")
    log.record("t", "processing", "memory", "task-finished")
    log.finished("tcp://w1")
    for frame in (log.frame(), transitions_frame(log.in_chunks())):
        assert frame["location"].tolist() == [None, None, None, "tcp://w1"]
    log._to_chunk()  # made into a chunk: the worker is taken along
    assert log.frame()["location"].tolist() == [None, None, None, "tcp://w1"]


def test_the_transition_that_fills_a_chunk_keeps_its_worker():
    """The hook names the worker after recording the transition: the rows become a chunk
    only when the next transition comes."""
    log = TransitionLog(100_000)
    log.chunk = 4
    record(log, 9)
    assert len(log.chunks) == 2 and len(log) == 9
    frame = log.frame()
    assert frame["location"].tolist() == [f"tcp://w{i % 2}" for i in range(9)]
    assert frame["key"].tolist() == [str(("x", i)) for i in range(9)]


def test_the_transitions_travel_in_chunks_pickled_apart():
    """As the export sends them: no piece holds more than a chunk, and the table made
    of them on the other side is the whole of it."""
    log = TransitionLog(100_000)
    record(log, 10_000)
    pieces = [pickle.dumps(chunk) for chunk in log.in_chunks()]
    assert len(pieces) == -(-10_000 // CHUNK)
    chunks = [pickle.loads(piece) for piece in pieces]
    assert max(len(chunk[0]) for chunk in chunks) <= CHUNK
    assert transitions_frame(chunks).equals(log.frame())
    assert len(transitions_frame(TransitionLog(10).in_chunks())) == 0


def test_past_the_capacity_the_oldest_go_and_are_counted():
    log = TransitionLog(1000)
    record(log, 5000)
    frame = log.frame()
    assert 1000 <= len(frame) <= 1000 + log.chunk
    assert log.dropped + len(frame) == 5000
    assert frame["key"].iloc[-1] == str(("x", 4999))
    assert frame["key"].iloc[0] == str(("x", log.dropped))


def test_a_frame_is_of_what_was_kept_when_asked():
    log = TransitionLog(1_000_000)
    record(log, 6000)
    kept = log.kept()
    record(log, 9000, first=6000)  # rows made into a chunk meanwhile, and more
    assert log.frame(kept)["key"].tolist() == [str(("x", i)) for i in range(6000)]
    assert len(log.frame()) == 15_000


def test_nothing_kept_is_a_long_list_or_a_tuple_for_the_collector_to_walk():
    log = TransitionLog(1_000_000)
    record(log, 100_000)
    held = list(vars(log).values())  # 3.13's dict of inline values has no referents
    longest = max(len(o) for o in held if isinstance(o, list))
    assert longest < FIELDS * CHUNK  # the newest rows; the rest are numpy arrays
    gc.collect()  # the collector stops tracking what holds no container the first time
    assert not any(gc.is_tracked(column) for chunk in log.chunks for column in chunk)
    assert len(log) == 100_000


def test_an_empty_log_makes_an_empty_frame_of_the_columns():
    frame = TransitionLog(10).frame()
    assert list(frame.columns) == ["key", "start", "finish", "time", "location", "stimulus_id"]
    assert len(frame) == 0


@gen_cluster(client=True, config=RECORDED)
async def test_the_log_agrees_with_the_schedulers_own(c, s, a, b):
    await crux_dask.attach(c)
    plugin = s.plugins["crux"]
    plugin.transitions = TransitionLog(1_000_000)
    plugin.transitions.chunk = 16  # several chunks, and rows after them
    futures = c.map(inc, range(40))
    await c.gather(futures)
    del futures
    await async_poll_for(lambda: not s.tasks, timeout=5)  # released and forgotten too
    ours = plugin.transitions.frame()
    finished = ours[(ours["start"] == "processing") & (ours["finish"] == "memory")]
    assert len(finished) == 40 and finished["location"].isin([a.address, b.address]).all()
    assert len(ours) > 40 * 4
    theirs = list(s.transition_log)[-len(ours):]
    assert [(str(t.key), t.start, t.finish, t.stimulus_id) for t in theirs] == list(
        zip(ours["key"], ours["start"], ours["finish"], ours["stimulus_id"]))


@gen_cluster(client=True, config={**RECORDED, "distributed.admin.low-level-log-length": 0})
async def test_every_transition_is_kept_though_the_schedulers_own_log_keeps_none(c, s, a, b):
    await crux_dask.attach(c)
    plugin = s.plugins["crux"]
    counted = s.transition_counter
    futures = c.map(inc, range(300))  # submitted at once: 600 transitions and more
    await c.gather(futures)
    del futures
    await async_poll_for(lambda: not s.tasks, timeout=5)
    assert not s.transition_log
    frame = plugin.transitions.frame()
    assert len(frame) == s.transition_counter - counted >= 300 * 4
    assert frame.groupby("key")["finish"].last().eq("forgotten").all()
    finished = frame[frame["location"].notna()]
    assert len(finished) == 300 and (finished["finish"] == "memory").all()


@gen_cluster(client=True, config={"distributed.admin.low-level-log-length": 500})
async def test_by_default_the_export_has_what_distributed_keeps_and_counts_the_rest(c, s, a, b):
    await crux_dask.attach(c)
    plugin = s.plugins["crux"]
    counted = s.transition_counter
    futures = c.map(inc, range(300))  # 1,200 transitions and more: the log keeps 500
    await c.gather(futures)
    del futures
    await async_poll_for(lambda: not s.tasks, timeout=5)
    assert len(plugin.transitions) == 0  # nothing recorded by the hook
    frame = transitions_frame(await plugin.transition_chunks())
    theirs = list(s.transition_log)
    assert len(frame) == len(theirs) == 500
    assert [(str(t.key), t.start, t.finish, t.stimulus_id, t.timestamp) for t in theirs] == list(
        zip(frame["key"], frame["start"], frame["finish"], frame["stimulus_id"], frame["time"]))
    assert frame["location"].isna().all()  # distributed's log does not say
    dropped = plugin.stats()["transitions_dropped"]
    assert dropped == s.transition_counter - counted - 500 > 0


def test_distributed_s_log_makes_chunks_of_the_export():
    entries = [(("x", i), "processing", "memory", {}, f"s-{i}", float(i))
               for i in range(CHUNK + 5)]
    chunks = chunks_of_log(entries)
    assert len(chunks) == 2
    frame = transitions_frame(chunks)
    assert frame["key"].tolist() == [str(("x", i)) for i in range(CHUNK + 5)]
    assert frame["time"].tolist() == [float(i) for i in range(CHUNK + 5)]
    assert len(transitions_frame(chunks_of_log([]))) == 0


def test_a_log_is_read_from_the_newest_entry_read_before():
    log = deque(maxlen=4)
    assert since(log, None) == ([], False)
    first, second = object(), object()
    log.extend([first, second])
    assert since(log, None) == ([first, second], False)  # nothing read yet: nothing lost
    assert since(log, second) == ([], False)
    later = [object() for _ in range(3)]
    log.extend(later)  # first falls out; second is still there
    assert since(log, second) == (later, False)
    log.append(newest := object())  # second falls out too: what followed it is partly gone
    assert since(log, second) == ([*later, newest], True)
