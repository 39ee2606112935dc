"""Tasks queued on the scheduler wait for a slot: each was released by the task that freed one."""

from __future__ import annotations

import time

import dask
import pytest
from distributed.utils_test import gen_cluster

import crux_dask
from crux_dask.path import CATEGORIES


def work(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i


def gather(*parts: int) -> int:
    return sum(parts)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)],
             config={"distributed.scheduler.worker-saturation": 1.0})
async def test_each_queued_task_waits_for_the_task_whose_end_freed_its_slot(c, s, a):
    await crux_dask.attach(c)
    parts = [dask.delayed(work)(i, 0.05, dask_key_name=f"work-{i}") for i in range(6)]
    assert await c.compute(dask.delayed(gather)(*parts, dask_key_name="total")) == 15

    # The scheduler's own log: a task leaves the queue on the stimulus that brought
    # another one's completion, which names the task that freed the slot.
    finished = {stimulus: key for key, start, finish, _, stimulus, _ in s.transition_log
                if start == "processing" and finish == "memory"}
    released = {key: finished[stimulus]
                for key, start, finish, _, stimulus, _ in s.transition_log
                if start == "queued" and finish == "processing"}
    assert len(released) == 5  # one slot for one thread: all but the first queued

    pag = await crux_dask.get_pag(c)
    keys = pag.states["key"]
    slots = pag.causes[pag.causes["kind"] == "SLOT"]
    assert dict(zip(keys[slots["dst"]], keys[slots["src"]])) == released

    # Each task released by the one before: the six form the path, through their slots.
    path = pag.wcp()
    steps = path.to_frame()
    works = steps[steps["key"].str.match(r"work-\d+$") & (steps["category"] == "compute")]
    assert len(works) == 6
    assert (works["via"].iloc[1:] == "slot").all()
    assert set(path.breakdown) == set(CATEGORIES)
    assert sum(path.breakdown.values()) == pytest.approx(path.length, abs=1e-6)
    assert path.breakdown["wait"] <= 0.1 * path.length
