"""A task taken back from its worker and sent again: the time between is 'rescheduled'."""

from __future__ import annotations

import time

import pytest
from distributed import Reschedule
from distributed.utils_test import gen_cluster

import crux_dask
from crux_dask.path import CATEGORIES


def work(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i


def check_breakdown(path) -> None:
    assert set(path.breakdown) == set(CATEGORIES)
    assert sum(path.breakdown.values()) == pytest.approx(path.length, abs=1e-6)


ATTEMPTS: list[float] = []


def once_rescheduled(x: int) -> int:
    """Its first run waits 0.3 s, then says it belongs elsewhere (as a P2P output does)."""
    ATTEMPTS.append(time.time())
    if len(ATTEMPTS) == 1:
        time.sleep(0.3)
        raise Reschedule()
    return x + 1


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_a_task_that_raised_reschedule_is_rescheduled_on_its_path(c, s, a, b):
    await crux_dask.attach(c)
    ATTEMPTS.clear()
    x = c.submit(work, 1, 0.0, key="x")
    assert await c.submit(once_rescheduled, x, key="y") == 2
    assert len(ATTEMPTS) == 2
    sent = [t for key, _, finish, _, _, t in s.transition_log
            if key == "y" and finish == "processing"]
    assert len(sent) == 2  # the scheduler's own log: sent, taken back, sent again
    pag = await crux_dask.get_pag(c)
    moments = pag.moments.merge(pag.states, on=["state_id", "run_id"])
    y = moments[moments["key"] == "y"].iloc[0]
    assert y["first_requested"] == pytest.approx(sent[0], abs=1e-3)
    assert y["requested"] == pytest.approx(sent[1], abs=1e-3)
    path = pag.wcp()
    steps = path.to_frame()
    step = steps[(steps["key"] == "y") & (steps["kind"] != "TRANSFER")].iloc[0]
    # From its first sending (or its input's arrival, if later) to its last.
    since = max(sent[0], step["stop"] - step["cost"])
    assert step["rescheduled"] == pytest.approx(sent[1] - since, abs=1e-3)
    assert step["rescheduled"] >= 0.25  # its first run waited 0.3 s before it said so
    check_breakdown(path)
