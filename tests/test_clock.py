"""Each worker's times are in the scheduler's clock as the worker's own round trips
bound it, not as distributed's latest heartbeat put it.

In one process (``gen_cluster``) the scheduler and the workers read the same
clock: the true offset is 0, and Dask's task stream, whose times distributed
converted with its heartbeat's estimate, is the independent witness.
"""

from __future__ import annotations

import math
import time

import pytest
from distributed.diagnostics.task_stream import TaskStreamPlugin
from distributed.utils_test import async_poll_for, gen_cluster

import crux_dask
from crux_dask.plugins.clock import DRIFT, ClockOffset
from crux_dask.plugins.protocol import PLUGIN_NAME

#: How far a heartbeat on a loaded machine moved a worker's estimate (seen: 0.121 s).
SKEW = 0.25


def test_the_round_trip_that_bounds_the_offset_tightest_is_kept():
    clock = ClockOffset(0.3)  # distributed's estimate: kept until a round trip
    assert (clock.offset, clock.bound) == (0.3, math.inf)
    assert clock.sample(100.0, 100.2, 100.15)  # 0.2 s there and back: +0.05 +- 0.1
    assert (clock.offset, clock.bound) == pytest.approx((0.05, 0.1))
    assert clock.sample(101.0, 101.01, 101.006)  # tighter: +0.001 +- 0.005
    assert clock.offset == pytest.approx(0.001)
    # Looser, and within what the kept one allows: it changes nothing.
    assert not clock.sample(102.0, 102.1, 102.08)
    assert clock.offset == pytest.approx(0.001)


def test_an_old_round_trip_gives_way_as_the_clocks_may_have_drifted():
    clock = ClockOffset(0.0)
    clock.sample(0.0, 0.002, 0.001)  # +-0.001
    looser = 0.003  # half of a 6 ms round trip
    aged = (looser - 0.001) / DRIFT  # when the kept bound has grown as loose
    assert not clock.sample(aged - 10.0, aged - 10.0 + 2 * looser, aged - 10.0 + looser + 0.002)
    assert clock.sample(aged + 10.0, aged + 10.0 + 2 * looser, aged + 10.0 + looser + 0.002)
    assert clock.offset == pytest.approx(0.002)


def test_a_round_trip_the_kept_bound_excludes_means_a_clock_was_set():
    clock = ClockOffset(0.0)
    clock.sample(0.0, 0.002, 0.001)  # 0 +- 0.001
    assert clock.sample(1.0, 1.05, 3.025)  # 2 +- 0.025: looser, but the clock moved 2 s
    assert clock.offset == pytest.approx(2.0)


@pytest.mark.parametrize("sent, received, remote", [
    (1.0, 0.5, 1.0),  # answered before it was asked
    (1.0, 1.1, math.nan),
    (1.0, math.inf, 1.0),
    (-math.inf, 1.0, 1.0),
])
def test_a_round_trip_that_is_not_one_changes_nothing(sent, received, remote):
    clock = ClockOffset(0.0)
    clock.sample(0.0, 0.002, 0.001)
    assert not clock.sample(sent, received, remote)
    assert (clock.offset, clock.bound) == (0.0, 0.001)


def sleep_and_pass(x=None, seconds: float = 0.05, read: str | None = None):
    if read is not None:  # a task that opens a file: the scheduler records it
        with open(read, "rb") as f:
            f.read()
    time.sleep(seconds)
    return x


def compute_of(stream: TaskStreamPlugin, key: str) -> tuple[float, float]:
    (record,) = [r for r in stream.buffer if r["key"] == key]
    (run,) = [s for s in record["startstops"] if s["action"] == "compute"]
    return run["start"], run["stop"]


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_a_heartbeat_that_misjudged_the_scheduler_clock_moves_no_time(
        c, s, a, b, tmp_path):
    stream = TaskStreamPlugin(s)
    s.add_plugin(stream)
    await crux_dask.attach(c)
    # Each worker timed round trips to the scheduler as its plugin started.
    await async_poll_for(lambda: all(math.isfinite(w.plugins[PLUGIN_NAME].clock.bound)
                                     for w in (a, b)), timeout=5)
    # What a heartbeat on a loaded machine does: a's estimate of the scheduler's clock
    # moves by SKEW, and no heartbeat sets it right (nor moves b's) until the end.
    for worker in (a, b):
        worker.periodic_callbacks["heartbeat"].stop()
        await worker.heartbeat()  # after any under way
    a.scheduler_delay += SKEW
    (tmp_path / "in.bin").write_bytes(b"1")
    x = c.submit(sleep_and_pass, 1, read=str(tmp_path / "in.bin"), key="x",
                 workers=[a.address])
    y = c.submit(sleep_and_pass, x, key="y", workers=[b.address])
    z = c.submit(sleep_and_pass, y, key="z", workers=[a.address])
    assert await z == 1  # the client gathers z from a
    path = await crux_dask.get_wcp(c)
    steps = path.to_frame()
    assert list(steps["key"])[-6:] == ["x", "x", "y", "y", "z", "z"]
    assert list(steps["category"])[-6:] == ["compute", "transfer"] * 3
    # x to b, y to a, z to the client: each arrives after it was made, on a and b alike.
    assert (steps["wait"] > -0.005).all(), steps[["key", "category", "cost", "wait"]]
    # x's sleep, after it opened its file, is io; with y's and z's sleeps it makes up
    # what the task stream timed the three runs at (each at least its 50 ms sleep).
    runs = [stop - start for start, stop in (compute_of(stream, k) for k in "xyz")]
    assert min(runs) >= 0.05
    assert path.breakdown["compute"] + path.breakdown["io"] == pytest.approx(
        sum(runs), abs=1e-3)
    # One process, one clock: each worker's estimate is within its bound of 0.
    stats = await crux_dask.get_stats(c)
    for worker in stats["workers"].values():
        assert abs(worker["clock_offset"]) <= worker["clock_bound"] < 0.05
    # The task stream has the tasks in distributed's estimate, a's SKEW late; Crux has
    # them where they ran (within the bound of the estimate they were taken with, which
    # a later round trip may have narrowed since), as long: those that workers report
    # (y, z) and those the scheduler records (x, which opened a file).
    computed = steps[steps["category"] == "compute"].set_index("key")
    for key, worker in (("x", a), ("y", b), ("z", a)):
        start, stop = compute_of(stream, key)
        assert computed.loc[key, "start"] == pytest.approx(
            start - worker.scheduler_delay, abs=0.05)
        assert computed.loc[key, "stop"] - computed.loc[key, "start"] == pytest.approx(
            stop - start, abs=1e-6)
