"""The machine a what-if replays on: cores shared by a host's threads, a GIL by a worker's.

Known answers first, in runs built here: tasks that hold the GIL do not go
faster on more threads of one worker but do on more workers; tasks that
release it go faster on both, as far as the cores go; a run that cannot tell
gives the range between.  Then real runs on a LocalCluster: pure-Python loops
and numpy products, whose GIL share distributed's own contention monitor
tells, and a re-run that checks the prediction's direction.
"""

from __future__ import annotations

import hashlib
import os
import time

import dask
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster

import crux_dask
from crux_dask import PAGBuilder
from crux_dask.gil import KNOCK_WAIT, gil_most
from crux_dask.machine import core_waits, machine_of
from crux_dask.recording import DASK_BANDWIDTH, extract
from crux_dask.sharing import (
    Sharing,
    _fair,
    _gil_shared,
    intervals,
    solo_seconds,
    task_cpu,
    unit_times,
)
from crux_dask.whatif import _gaps_at

HOST = "tcp://127.0.0.1:{}"
#: What the GIL contention monitor reads of a worker whose tasks let go of the GIL (0.002 to
#: 0.008 here; never exactly 0, which is no reading at all: ``crux_dask.gil.gil_shares``).
RELEASED = 0.004


def _run(threads: int, seconds: float, cpu: float, n: int = 16, cores_waited: float = 0.0,
         gap: float = 0.0) -> crux_dask.PAG:
    """``n`` tasks of ``seconds`` (``cpu`` of them on the CPU) on one worker's ``threads``
    threads, one after another on each (``gap`` seconds apart: the dispatch), then their
    sum."""
    builder = PAGBuilder(run_id="made")
    builder.apply(("root", 0.0, "graph"))
    free = [0.01] * threads
    for i in range(n):
        thread = i % threads
        start = free[thread] + gap
        free[thread] = start + seconds
        builder.compute(f"('work-ab', {i})", HOST.format(1), thread, start, start + seconds, 8,
                        sent=0.0, received=0.005, runnable=0.005, priority=float(i), cpu=cpu,
                        cpu_wait=cores_waited)
    end = max(free)
    builder.compute("total", HOST.format(1), 0, end, end + 0.001, 8,
                    [f"('work-ab', {i})" for i in range(n)], sent=end, received=end,
                    runnable=end, priority=float(n), cpu=0.0005, cpu_wait=0.0)
    builder.transfer("total", f"memory@{HOST.format(1)}", "client", end + 0.002, end + 0.003)
    return builder.pag()


def _load(pag: crux_dask.PAG, gil: float, cores: float = 2.0, scheduler: float = 0.05
          ) -> pd.DataFrame:
    """Load samples of the run's worker every half second: its GIL contention ``gil``,
    and the cores its ``scheduler`` used."""
    run = extract(pag.store(), pag.ends[0])
    times = run.origin + np.arange(1, int(run.makespan / 0.5) + 2) * 0.5
    rows = [("scheduler", t, scheduler, 0.0, np.nan, np.nan, np.nan, 0.0) for t in times]
    rows += [(HOST.format(1), t, 1.0, 0.0, 1.0, 2.0, cores, gil) for t in times]
    return pd.DataFrame(rows, columns=["process", "time", "cpu", "lag", "busy", "threads",
                                       "cores", "gil"])


def _change(pag: crux_dask.PAG, load: pd.DataFrame | None = None, **change) -> float:
    result = pag.what_if(load=load, **change)
    return result.makespan / result.recorded


def test_a_task_whose_cpu_seconds_are_not_known_has_its_label_s_share_or_the_run_s():
    # Three labels: one whose tasks are all known (80 % on the CPU), one half known
    # (20 %), one never known: a worker could not tell them apart from another task's.
    builder = PAGBuilder(run_id="made")
    builder.apply(("root", 0.0, "graph"))
    shares = {"spin-ab": [0.8] * 4, "read-cd": [0.2, None] * 2, "cast-ef": [None] * 2}
    start, keys = 0.01, []
    for label, known in shares.items():
        for i, share in enumerate(known):
            key = f"('{label}', {i})"
            builder.compute(key, HOST.format(1), 0, start, start + 0.1, 8, label=label,
                            sent=start, received=start, runnable=start, priority=float(i),
                            cpu=None if share is None else 0.1 * share, cpu_wait=0.0)
            keys.append(key)
            start += 0.1
    builder.compute("total", HOST.format(1), 0, start, start + 0.1, 8, keys, label="total",
                    sent=start, received=start, runnable=start, priority=99.0, cpu=0.1,
                    cpu_wait=0.0)
    builder.transfer("total", f"memory@{HOST.format(1)}", "client", start + 0.11, start + 0.12)
    pag = builder.pag()
    run = extract(pag.store(), pag.ends[0])
    cpu = pd.Series(task_cpu(run), index=run.label_names).groupby(level=0).sum()
    assert cpu["spin-ab"] == pytest.approx(4 * 0.08)
    assert cpu["read-cd"] == pytest.approx(4 * 0.02)  # the known half's share, for all
    # the share of the run's known seconds that was on the CPU: 0.46 of 0.7
    assert cpu["cast-ef"] == pytest.approx(2 * 0.1 * (0.32 + 0.04 + 0.1) / 0.7)


def test_the_gil_is_shared_fairly_and_cores_as_far_as_they_go():
    assert _fair([1.0, 1.0]) == [0.5, 0.5]
    assert _fair([0.2, 1.0]) == pytest.approx([0.2, 0.8])
    assert _fair([0.3, 0.4]) == [0.3, 0.4]
    # Seconds a second of solo progress takes, for each task of one worker.
    assert _gil_shared([0, 1], [1.0, 1.0], [1.0, 1.0], 1.0) == {0: 2.0, 1: 2.0}
    assert _gil_shared([0, 1], [1.0, 1.0], [0.0, 0.0], 1.0) == {0: 1.0, 1: 1.0}
    assert _gil_shared([0, 1], [1.0, 0.2], [1.0, 1.0], 1.0) == pytest.approx({0: 1.25, 1: 1.0})


def test_every_task_runs_at_the_rate_its_host_and_worker_leave_it():
    # Tasks join and leave two hosts of 2 cores (workers 0, 1 on one, 2 on the other);
    # after each change every task running has the rate the sharing of cores and GIL
    # gives it, whether the host asked for less than it has (each at solo speed, not
    # recomputed) or more, and its end planned is pushed.
    rng = np.random.default_rng(7)
    n = 400
    density = rng.choice([0.0, 0.3, 1.0], n).tolist()
    gil = rng.choice([0.0, 0.5, 1.0], n).tolist()
    host_of, cores, background = [0, 0, 1], [2.0, 2.0], [0.25, 0.0]
    sharing = Sharing(host_of, cores, background, density, gil)
    running: dict[int, int] = {}
    ends: dict[int, float] = {}
    push = lambda at, task, worker: ends.__setitem__(task, at)  # noqa: E731
    solo = full = 0
    for step in range(2 * n):
        t = step * 0.01
        if running and (len(running) > 6 or rng.random() < 0.45 or step >= n):
            task = int(rng.choice(list(running)))
            sharing.leave(t, task, running.pop(task), push)
        elif step < n:
            running[step] = int(rng.integers(3))
            sharing.join(t, step, running[step], 1.0, push)
        for h in (0, 1):
            mine = {i: w for i, w in running.items() if host_of[w] == h}
            units = unit_times(mine, density, gil, cores[h], background[h])
            for i in mine:
                assert sharing.rate[i] == pytest.approx(1.0 / units[i], rel=1e-12)
                assert sharing.ends[i] == ends[i]
            at_solo = all(u == pytest.approx(1.0) for u in units.values())
            solo, full = solo + (bool(mine) and at_solo), full + (not at_solo)
    assert solo > 50 and full > 50  # both kinds of host were checked


def test_runs_are_together_only_while_both_run():
    # Runs 0 and 1 overlap from 1 to 2; run 2 starts as run 0 ends, and run 3 takes no
    # time at all: it is with no other run, and none comes after it.
    begin, end = np.array([0.0, 1.0, 3.0, 1.5]), np.array([3.0, 2.0, 4.0, 1.5])
    assert [(since, until, sorted(running)) for since, until, running
            in intervals(begin, end)] == [(0.0, 1.0, [0]), (1.0, 1.5, [0, 1]),
                                          (1.5, 2.0, [0, 1]), (2.0, 3.0, [0]),
                                          (3.0, 4.0, [2])]


def test_a_run_on_one_worker_assumes_dask_s_own_bandwidth():
    pag = _run(threads=1, seconds=0.1, cpu=0.1)
    run = extract(pag.store(), pag.ends[0])
    assert (run.latency, run.bandwidth) == (0.0, DASK_BANDWIDTH) == (0.0, 100e6)


def test_tasks_that_hold_the_gil_need_workers_not_threads():
    pag = _run(threads=1, seconds=0.1, cpu=0.1)
    load = _load(pag, gil=0.8)  # a thread holding the GIL all the time reads about 0.83
    machine = machine_of(extract(pag.store(), pag.ends[0]), load)
    label = pag.store().labels.codes["work"]
    assert machine.gil[label] > 0.9
    assert _change(pag, load) == pytest.approx(1.0, abs=0.03)
    assert _change(pag, load, threads=2) == pytest.approx(1.0, abs=0.05)
    assert _change(pag, load, workers=2) == pytest.approx(0.5, abs=0.05)


def test_the_dispatch_and_round_trip_scale_with_the_threads_that_hold_the_gil():
    # Recorded on two threads, 20 ms between one task and the next on each: the worker's
    # event loop waited behind the other thread where the tasks hold the GIL, so on one
    # thread it waits half as long, on four twice as long; where they release it, as
    # long as recorded.  A third of the CPU seconds holding it counts a third.
    pag = _run(2, 0.1, 0.1, gap=0.02)
    run = extract(pag.store(), pag.ends[0])
    cpu = np.full(run.n_tasks, 0.1)
    holds, releases = np.ones(run.n_tasks), np.zeros(run.n_tasks)
    assert run.gaps.dispatch == pytest.approx(0.02)
    for gil, threads, factor in [(holds, 1, 0.5), (holds, 2, 1.0), (holds, 4, 2.0),
                                 (releases, 1, 1.0), (releases, 4, 1.0),
                                 (holds / 3, 1, 3 / 4)]:
        gaps = _gaps_at(run, gil, cpu, threads)
        assert gaps.dispatch == pytest.approx(0.02 * factor), (gil[0], threads)
        assert gaps.local == pytest.approx(run.gaps.local * factor)
        assert (gaps.first, gaps.slot, gaps.fetch) == (
            run.gaps.first, run.gaps.slot, run.gaps.fetch)


def test_tasks_that_release_the_gil_need_cores():
    pag = _run(threads=1, seconds=0.1, cpu=0.1)
    load = _load(pag, gil=RELEASED)
    assert _change(pag, load, threads=2) == pytest.approx(0.5, abs=0.05)
    assert _change(pag, load, threads=4) == pytest.approx(0.5, abs=0.05)  # 2 cores
    assert _change(pag, _load(pag, gil=RELEASED, cores=4.0), threads=4) == pytest.approx(
        0.25, abs=0.05)
    # Tasks that sleep use no core: threads are all they need.
    sleepy = _run(threads=1, seconds=0.1, cpu=0.0)
    assert _change(sleepy, _load(sleepy, gil=RELEASED), threads=4) == pytest.approx(0.25, abs=0.05)


def test_a_run_that_cannot_tell_gives_the_range_between():
    pag = _run(threads=1, seconds=0.1, cpu=0.1)
    result = pag.what_if(threads=2)  # no load: nothing says whether they hold the GIL
    low, high = result.range
    assert low / result.recorded == pytest.approx(0.5, abs=0.05)
    assert high / result.recorded == pytest.approx(1.0, abs=0.05)
    assert result.makespan == pytest.approx((low + high) / 2)
    assert result.gil_unknown == ["work"] and "hold the GIL" in result.summary()
    # Two tasks at once, each all the time on the CPU: at most half of it held the GIL.
    both = _run(threads=2, seconds=0.1, cpu=0.1)
    run = extract(both.store(), both.ends[0])
    assert gil_most(run, len(run.store.labels))[run.store.labels.codes["work"]] == (
        pytest.approx(0.5))
    assert both.what_if(threads=1).range is None
    assert _change(both, None, threads=1) == pytest.approx(2.0, abs=0.1)


def test_tasks_that_used_one_core_together_held_the_gil_or_waited_for_it():
    # Two threads of one worker, with a core each, and no GIL monitor: each task ran 0.1 s,
    # 0.05 s of it on the CPU, so the two used one core together.  Releasing the GIL they
    # would have used two: on one thread each takes its 0.05 s, and the run as long.
    pag = _run(threads=2, seconds=0.1, cpu=0.05)
    held = pag.what_if(load=_load(pag, gil=np.nan), threads=1)
    assert held.range is None and held.gil_unknown == []
    assert held.makespan / held.recorded == pytest.approx(1.0, abs=0.1)
    # On one core, the core explains it: the run cannot tell.
    assert pag.what_if(load=_load(pag, gil=np.nan, cores=1.0), threads=1).range is not None
    # Two tasks that used two cores released it: at most half held it (gil_most).
    apart = _run(threads=2, seconds=0.1, cpu=0.1)
    assert _change(apart, _load(apart, gil=np.nan), threads=1) == pytest.approx(2.0, abs=0.1)


def _pair(overlap: float) -> crux_dask.PAG:
    """Two tasks of 10 ms, 9 ms of each on the CPU, on two threads of one worker, that
    ran together for ``overlap`` seconds; then their sum."""
    builder = PAGBuilder(run_id="made")
    builder.apply(("root", 0.0, "graph"))
    starts = (0.01, 0.02 - overlap)
    for i, start in enumerate(starts):
        builder.compute(f"('work-ab', {i})", HOST.format(1), i, start, start + 0.01, 8,
                        sent=0.0, received=0.005, runnable=0.005, priority=float(i),
                        cpu=0.009, cpu_wait=0.0)
    end = max(starts) + 0.01
    builder.compute("total", HOST.format(1), 0, end, end + 0.001, 8,
                    ["('work-ab', 0)", "('work-ab', 1)"], sent=end, received=end,
                    runnable=end, priority=2.0, cpu=0.0005, cpu_wait=0.0)
    builder.transfer("total", f"memory@{HOST.format(1)}", "client", end + 0.002, end + 0.003)
    return builder.pag()


def test_only_the_cpu_seconds_an_overlap_must_hold_bound_the_gil_share():
    # Together for all of their runs, the two used 1.8 cores: at most 1 / 1.8 of their CPU
    # time held the GIL.  Together for 1 ms, each may have spent 8 of its 9 ms on the CPU
    # before or after, and they may have taken turns for that one: nothing is bounded.
    # Together for 6 ms, each spent at least 5 ms of it on the CPU: 10 / 6 cores.
    for overlap, most in [(0.01, 1 / 1.8), (0.001, 1.0), (0.006, 0.6)]:
        pag = _pair(overlap)
        run = extract(pag.store(), pag.ends[0])
        found = gil_most(run, len(run.store.labels))[run.store.labels.codes["work"]]
        assert found == pytest.approx(most), overlap


def test_a_task_off_the_cpu_while_another_holds_the_gil_was_waiting_for_it():
    # On three threads of one worker, beside a task that held the GIL for all of its 0.1 s:
    # a task 0.03 s on the CPU, whose own share is low, waited the rest of its 0.1 s for
    # the GIL (a thread that lets go of it waits again behind the holder); a task that
    # slept for the same 0.1 s waited for nothing.
    builder = PAGBuilder(run_id="made")
    builder.apply(("root", 0.0, "graph"))
    for thread, (name, cpu) in enumerate([("hold", 0.1), ("short", 0.03), ("nap", 0.0)]):
        builder.compute(f"('{name}-ab', 0)", HOST.format(1), thread, 0.01, 0.11, 8,
                        sent=0.0, received=0.005, runnable=0.005, priority=float(thread),
                        cpu=cpu, cpu_wait=0.0)
    builder.transfer("('hold-ab', 0)", f"memory@{HOST.format(1)}", "client", 0.12, 0.13)
    pag = builder.pag()
    run = extract(pag.store(), pag.ends[0])
    gil = np.where(run.label_names == "hold", 1.0, 0.2)
    solo, density = solo_seconds(run, gil, np.zeros(run.n_tasks))
    names = run.label_names.tolist()
    assert dict(zip(names, solo.tolist())) == pytest.approx(
        {"hold": 0.1, "short": 0.03, "nap": 0.1})
    assert dict(zip(names, density.tolist())) == pytest.approx(  # alone, all on the CPU
        {"hold": 1.0, "short": 1.0, "nap": 0.0})


def test_the_wait_for_the_gil_and_for_cores_is_taken_out_of_a_recording():
    # Two threads of one worker, each task half on the CPU and held up the other half:
    # by the GIL (the worker's contention says so), the run goes as fast on one thread.
    pag = _run(threads=2, seconds=0.2, cpu=0.1)
    load = _load(pag, gil=KNOCK_WAIT)  # what a GIL held all the time reads
    assert _change(pag, load) == pytest.approx(1.0, abs=0.05)
    assert _change(pag, load, threads=1) == pytest.approx(1.0, abs=0.1)
    assert _change(pag, load, workers=2, threads=1) == pytest.approx(0.5, abs=0.05)
    # Held up by other work on the host's two cores instead (the threads' clocks say
    # so): the scheduler kept both cores busy, each task had half of one.  The replay
    # keeps that work: one thread, the third runnable on two cores, has two thirds of one.
    busy = _run(threads=2, seconds=0.2, cpu=0.1, cores_waited=0.1)
    run = extract(busy.store(), busy.ends[0])
    load = _load(busy, gil=RELEASED, scheduler=2.0)
    assert core_waits(run, machine_of(run, load)) == pytest.approx(
        [0.1] * 16 + [0.0], abs=0.001)
    assert _change(busy, load) == pytest.approx(1.0, abs=0.05)
    assert _change(busy, load, threads=1) == pytest.approx(1.5, abs=0.1)
    # Held up by a program the load does not see: the waits stay in the tasks' seconds,
    # and one thread takes twice as long.
    unseen = _load(busy, gil=RELEASED)
    assert core_waits(run, machine_of(run, unseen)).max() < 0.01
    assert _change(busy, unseen) == pytest.approx(1.0, abs=0.05)
    assert _change(busy, unseen, threads=1) == pytest.approx(2.0, abs=0.1)


def test_a_wait_on_the_run_queue_the_cores_do_not_explain_is_the_gil_s_handing_over():
    # Two threads of one worker holding the GIL in turn (its contention says so), each
    # task half on the CPU and half runnable, waiting for a core the host had free (no
    # other work on it): the GIL passed to a thread wakes it, and it waits its turn on
    # the run queue.  That wait goes with the GIL: one thread is as fast.
    pag = _run(threads=2, seconds=0.2, cpu=0.1, cores_waited=0.1)
    load = _load(pag, gil=KNOCK_WAIT)
    run = extract(pag.store(), pag.ends[0])
    assert core_waits(run, machine_of(run, load)).max() < 0.01
    assert _change(pag, load) == pytest.approx(1.0, abs=0.05)
    assert _change(pag, load, threads=1) == pytest.approx(1.0, abs=0.1)


def spin(i: int, seconds: float = 0.2) -> int:
    end = time.thread_time() + seconds
    n = i
    while time.thread_time() < end:
        n += 1
    return n


def product(i: int, seconds: float = 0.2) -> float:
    x = np.random.default_rng(i).random((600, 600))
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        x = x @ x
        x /= np.abs(x).max()
    return float(x[0, 0])


def _recorded(function, threads: int, n: int = 12, **kwargs) -> tuple[crux_dask.PAG,
                                                                      pd.DataFrame]:
    """The graph and load of a run of ``n`` tasks of ``function`` on a fresh worker of
    ``threads`` threads, with Crux attached just before."""
    with LocalCluster(n_workers=1, threads_per_worker=threads, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        # Warm: the worker imports the function's module at its first task (0.5 s of CPU
        # for this one), which its loop's seconds per task would count.
        client.submit(function, 0, **kwargs).result()
        crux_dask.attach(client)
        name = function.__name__
        dask.compute([dask.delayed(function)(i, dask_key_name=(name, i), **kwargs)
                      for i in range(n)])
        return crux_dask.get_pag(client), crux_dask.get_load(client)


def digest(i: int, seconds: float = 0.2) -> str:
    """SHA-256 of blocks of 4 MB for ``seconds`` of CPU: hashlib lets go of the GIL while
    it hashes."""
    block, found = bytes(4_000_000), hashlib.sha256()
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        found.update(block)
    return found.hexdigest()


def test_a_run_without_the_gil_monitor_tells_the_gil_from_how_tasks_ran_together():
    # Without distributed's GIL contention monitor, two threads of one worker: pure-Python
    # loops used one core together, hashes two.  The loops are played holding the GIL: a
    # point, and two threads to one changes little (releasing it, each loop would keep
    # its recorded run, twice its CPU seconds; predicted 1.13-1.17 here, where the two
    # threads used only 0.90-0.94 of a core together, a loss one thread does not have).
    # The hashes, bound to half of it, are not known.
    with dask.config.set({"distributed.admin.system-monitor.gil.enabled": False}):
        loops, loops_load = _recorded(spin, threads=2, n=8)
        hashes, hashes_load = _recorded(digest, threads=2, n=8)
    assert loops_load["gil"].isna().all()  # what follows could fail
    run = extract(loops.store(), loops.ends[0])
    held = machine_of(run, loops_load).gil[loops.store().labels.codes["spin"]]
    assert held == pytest.approx(1.0)
    one = loops.what_if(threads=1, load=loops_load)
    assert one.range is None and one.makespan / one.baseline < 1.25
    run = extract(hashes.store(), hashes.ends[0])
    assert np.isnan(machine_of(run, hashes_load).gil[hashes.store().labels.codes["digest"]])


def _recorded_on_one_thread(function) -> tuple[float, float]:
    """The GIL share of ``function``'s label, and the change predicted on two threads,
    in a run of twelve of its tasks on a fresh worker of one thread."""
    pag, load = _recorded(function, threads=1)
    name = function.__name__
    run = extract(pag.store(), pag.ends[0])
    share = machine_of(run, load).gil[pag.store().labels.codes[name]]
    result = pag.what_if(threads=2, load=load)
    assert result.range is None  # the monitor told
    return float(share), result.makespan / result.recorded


def test_a_real_run_tells_which_code_holds_the_gil():
    # A loop of pure Python holds the GIL; a product of matrices lets go of it.  Other
    # work on this machine may take cores from the second: it goes faster on two
    # threads as far as the cores let it, the first does not.
    spin_share, spin_change = _recorded_on_one_thread(spin)
    product_share, product_change = _recorded_on_one_thread(product)
    assert spin_share > 0.6 and product_share < 0.3
    assert spin_change > 0.85 and product_change < spin_change - 0.15


def test_pure_python_on_two_threads_needs_workers_not_threads():
    # Recorded on one worker of two threads, pure-Python loops wait for each other's
    # GIL: the replay takes that wait out, so more threads gain nothing and a second
    # worker does, and "more threads" is not the first advice.
    pag, load = _recorded(spin, threads=2)
    # Against the unchanged replay, as suggest() ranks: another program on this machine
    # may take cores from the recording, and that wait stays in both.
    more_threads = pag.what_if(threads=4, load=load)
    assert more_threads.makespan / more_threads.baseline == pytest.approx(1.0, abs=0.1)
    more_workers = pag.what_if(workers=2, threads=1, load=load)
    assert more_workers.makespan / more_workers.baseline < 0.85
    advice = pag.suggest(load=load)
    assert advice["change"].iloc[0] != "4 threads per worker", advice


def test_a_run_shorter_than_a_heartbeat_knows_its_host_s_cores():
    # The workers count their cores in their heartbeats, which a run of a few
    # milliseconds right after Crux starts may not wait for: on one host, the
    # scheduler's count stands in, so the replay still shares the cores.
    pag, load = _recorded(spin, threads=2, n=4, seconds=0.005)
    run = extract(pag.store(), pag.ends[0])
    assert machine_of(run, load).cores == [float(len(os.sched_getaffinity(0)))]
