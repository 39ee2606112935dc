"""What distributed's GIL contention monitor tells of a run: each reading covers the time
since the monitor's reading before it, not the heartbeat that carried it, and a reading of
exactly 0 tells nothing.

Known answers first, on samples built here; then a real worker of one thread whose
tasks each hold the GIL for about 0.45 s in one call into C, as pandas' ``astype`` of
TPC-H's columns does: the monitor reads them holding it, and two threads are predicted
no faster.
"""

from __future__ import annotations

import time

import dask
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster

import crux_dask
from crux_dask import PAGBuilder
from crux_dask.gil import KNOCK_WAIT, covered
from crux_dask.load import LOAD_COLUMNS
from crux_dask.machine import machine_of
from crux_dask.recording import extract

WORKER = "tcp://127.0.0.1:1"


def _samples(readings: list[tuple[float, float, float]]) -> pd.DataFrame:
    """Load samples of :data:`WORKER`: ``(heartbeat, measured, gil)`` each."""
    rows = [{"process": WORKER, "time": heartbeat, "cpu": 1.0, "lag": 0.0, "busy": 1.0,
             "threads": 1.0, "cores": 2.0, "gil": gil, "cpu_time": np.nan,
             "measured": measured} for heartbeat, measured, gil in readings]
    return pd.DataFrame(rows, columns=list(LOAD_COLUMNS)).astype(LOAD_COLUMNS)


def test_a_reading_covers_the_time_since_the_monitor_s_reading_before_it():
    samples = _samples([(1.0, 0.9, 0.5), (1.6, 1.4, 0.5), (2.7, 2.6, 0.5), (3.2, np.nan, 0.5)])
    since, until = covered(samples)
    # The first from a second before its reading; the third no longer than a second;
    # the last, whose reading's moment is not known, the second before its heartbeat.
    assert since.tolist() == pytest.approx([-0.1, 0.9, 1.6, 2.2])
    assert until.tolist() == pytest.approx([0.9, 1.4, 2.6, 3.2])
    # An export of schema version 9 or older has no moments of reading at all.
    assert covered(samples.drop(columns="measured"))[0].tolist() == pytest.approx(
        [0.0, 0.6, 1.7, 2.2])


def _shares(labels: list[str], readings: list[float], lag: float, known: bool = True
            ) -> dict[str, float]:
    """The GIL share of each label of a run of tasks of 0.5 s on the CPU, one after the
    other on a worker of one thread, whose monitor read ``readings`` as each task ended
    (the first as the first started), each carried by a heartbeat ``lag`` seconds later;
    the moments of the readings ``known`` or not (an export of schema version 9 or
    older)."""
    builder = PAGBuilder(run_id="made")
    builder.apply(("root", 0.0, "graph"))
    for i, label in enumerate(labels):
        start = 0.01 + 0.5 * i
        builder.compute(f"('{label}-ab', {i})", WORKER, 0, start, start + 0.5, 8, sent=0.0,
                        received=0.005, runnable=0.005, priority=float(i), cpu=0.5,
                        cpu_wait=0.0)
    end = 0.01 + 0.5 * len(labels)
    builder.transfer(f"('{labels[-1]}-ab', {len(labels) - 1})", f"memory@{WORKER}", "client",
                     end + 0.01, end + 0.02)
    pag = builder.pag()
    run = extract(pag.store(), pag.ends[0])
    moments = [run.origin + 0.01 + 0.5 * k for k in range(len(readings))]
    load = _samples([(at + lag, at if known else np.nan, gil)
                     for at, gil in zip(moments, readings)])
    gil = machine_of(run, load).gil
    codes = pag.store().labels.codes
    return {label: float(gil[codes[label]]) for label in set(labels)}


def test_a_reading_of_zero_says_nothing():
    # Of the readings while the first label ran, two are 0: no round of the probe had
    # ended, held up by the tasks themselves.
    shares = _shares(["hold"] * 4 + ["free"] * 4,
                     [0.003, 0.98, 0.0, 0.98, 0.0, 0.004, 0.003, 0.005, 0.004], lag=0.05)
    assert shares["hold"] == pytest.approx(min(1.0, 0.98 / KNOCK_WAIT))
    assert shares["free"] == pytest.approx(0.004 / KNOCK_WAIT, abs=0.002)


def test_each_reading_tells_of_the_time_it_measured_not_of_its_heartbeat():
    # Labels taking turns, each task read as it ended, each reading carried a quarter
    # of a second later: the second before a heartbeat holds half of each label, and
    # says nothing of either.  The readings' own moments tell them apart.
    labels, readings = ["free", "hold"] * 4, [0.003] + [0.004, 0.98] * 4
    shares = _shares(labels, readings, lag=0.25)
    assert shares["hold"] == pytest.approx(min(1.0, 0.98 / KNOCK_WAIT))
    assert shares["free"] == pytest.approx(0.004 / KNOCK_WAIT, abs=0.002)
    assert all(np.isnan(share) for share in _shares(labels, readings, 0.25, False).values())


def _held(i: int, n: int) -> int:
    """``sum(range(n))``: one call into C that keeps the GIL to its end."""
    return sum(range(n)) + i


def test_a_task_that_holds_the_gil_in_one_call_is_read_holding_it():
    pytest.importorskip("gilknocker")  # distributed's GIL contention monitor
    started = time.perf_counter()
    sum(range(2_000_000))
    n = int(2_000_000 * 0.45 / (time.perf_counter() - started))  # about 0.45 s a call
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.submit(_held, 0, 1000).result()
        crux_dask.attach(client)
        dask.compute([dask.delayed(_held)(i, n, dask_key_name=("held", i)) for i in range(4)])
        ended = time.time()
        pag, load = crux_dask.get_pag(client), crux_dask.get_load(client, after=ended)
    worker = load[load["process"] != "scheduler"]
    assert worker["measured"].notna().all()
    # A reading is made before the heartbeat that carries it reaches the scheduler.
    assert (worker["measured"] <= worker["time"] + 0.01).all()
    run = extract(pag.store(), pag.ends[0])
    assert machine_of(run, load).gil[pag.store().labels.codes["held"]] > 0.8
    result = pag.what_if(threads=2, load=load)
    assert result.range is None  # the monitor told
    assert result.makespan / result.recorded > 0.85
