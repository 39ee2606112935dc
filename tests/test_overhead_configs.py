"""The configurations ``benchmarks/overhead.py`` measures Crux's cost with do what they say."""

from __future__ import annotations

import sys
from pathlib import Path

from distributed.utils_test import gen_cluster, inc

import crux_dask
from crux_dask.plugins.protocol import REPORTED

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import overhead


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1)])
async def test_crux_quiet_records_no_task_and_crux_records_each(c, s, a, b):
    await crux_dask.attach(c)
    assert all([overhead.quiet_hooks(dask_scheduler=s), overhead.quiet_hooks(dask_worker=a),
                overhead.quiet_hooks(dask_worker=b)])
    assert await c.gather(c.map(inc, range(10), key=[f"quiet-{i}" for i in range(10)]))
    await crux_dask.flush(c)
    # Put back (the class's hooks), the same cluster records the next tasks.
    for plugin in (s.plugins["crux"], a.plugins["crux"], b.plugins["crux"]):
        del plugin.transition
    assert await c.gather(c.map(inc, range(10), key=[f"heard-{i}" for i in range(10)]))
    await crux_dask.flush(c)
    states = (await crux_dask.get_pag(c)).states
    quiet = states[states["key"].str.startswith("quiet-", na=False)]
    heard = states[states["key"].str.startswith("heard-", na=False)]
    # Quiet, no task was recorded: what the client gathered is still read from the
    # workers' transfer logs as they send, from stand-ins of unknown origin.
    assert set(quiet["origin"]) == {"unknown"}
    # Heard, each task's result is a state its thread made on its worker.
    computed = heard[heard["thread"].notna()]
    assert sorted(computed["key"]) == sorted(f"heard-{i}" for i in range(10))
    assert computed["location"].str.startswith("memory@").all()


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_quiet_hooks_says_so_where_crux_is_not(c, s, a):
    assert overhead.quiet_hooks(dask_scheduler=s) is False
    assert overhead.quiet_hooks(dask_worker=a) is False


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1)])
async def test_crux_scheduler_records_each_task_on_the_scheduler_alone(c, s, a, b):
    await crux_dask.attach(c)
    assert all([overhead.quiet_hooks(dask_worker=a), overhead.quiet_hooks(dask_worker=b)])
    futures = c.map(inc, range(10), key=[f"alone-{i}" for i in range(10)])
    assert await c.gather(futures)
    # No worker marked a task as one it reports: the scheduler's hook recorded each.
    assert not any(REPORTED in (s.tasks[f.key].metadata or {}) for f in futures)
    await crux_dask.flush(c)
    pag = await crux_dask.get_pag(c)
    states = pag.states
    alone = states[states["key"].str.startswith("alone-", na=False)]
    computed = alone[alone["thread"].notna()]
    assert sorted(computed["key"]) == sorted(f"alone-{i}" for i in range(10))
    assert computed["location"].str.startswith("memory@").all()
