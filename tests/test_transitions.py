"""The scheduler's transitions kept for the export: all of them, in order, within bounds,
and nothing the scheduler's garbage collector has to walk."""

from __future__ import annotations

import gc
import pickle

import numpy as np
from distributed.utils_test import async_poll_for, gen_cluster, inc

import crux_dask
from crux_dask.plugins.transitions import CHUNK, FIELDS, TransitionLog, transitions_frame


def record(log: TransitionLog, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        log.append(("x", i), "processing", "memory", f"tcp://w{i % 2}", f"s-{i}")


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


def test_nothing_kept_is_a_long_list_for_the_collector_to_walk():
    log = TransitionLog(1_000_000)
    record(log, 100_000)
    held = gc.get_referents(vars(log))
    longest = max(len(o) for o in held if isinstance(o, list))
    assert longest < FIELDS * CHUNK  # the newest rows; the rest are numpy arrays
    assert not any(gc.is_tracked(column) for chunk in log.chunks for column in chunk)
    assert len(log) == 100_000


def test_an_empty_log_makes_an_empty_frame_of_the_columns():
    frame = TransitionLog(10).frame()
    assert list(frame.columns) == ["key", "start", "finish", "time", "location", "stimulus_id"]
    assert len(frame) == 0


@gen_cluster(client=True)
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
    assert len(ours) > 40 * 4
    theirs = list(s.transition_log)[-len(ours):]
    assert [(str(t.key), t.start, t.finish, t.stimulus_id) for t in theirs] == list(
        zip(ours["key"], ours["start"], ours["finish"], ours["stimulus_id"]))
