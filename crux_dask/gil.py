"""What a recorded run tells of the GIL: the share of each label's CPU time that holds it.

Three kinds of evidence, each for the labels it can speak of:

* distributed's GIL contention monitor (``gil`` of the load, where
  ``gilknocker`` is installed) says how much of each half second a worker's
  GIL was held; over the samples whose tasks were mostly of one label, it
  gives that label's share (:func:`gil_shares`);
* tasks of one label that ran on the CPU at once on one worker bound it
  (:func:`gil_most`);
* tasks of one worker that, running together with a core each, asked for
  little more than one core held it or waited for it (:func:`gil_held`).

A label with none has no evidence: the what-if plays it holding the GIL and
releasing it, and predicts the range between.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from crux_dask.sharing import intervals, recorded, task_cpu

if TYPE_CHECKING:
    import pandas as pd

    from crux_dask.runs import Run

__all__ = ["CPU_USER", "HELD_CORES", "KNOCK_WAIT", "covered", "cpu_users", "gil_held",
           "gil_most", "gil_shares"]

#: The GIL contention distributed's monitor reads of a worker whose GIL a task holds
#: all the time: its probe asks for the GIL every millisecond (its default
#: polling interval) and waits for the holder to let go, which CPython asks of it
#: after its switch interval (5 ms): 5 / (5 + 1).
KNOCK_WAIT = 0.005 / (0.005 + 0.001)
#: The most seconds a load sample's GIL contention covers: distributed's system
#: monitor measures it from its reading before to its own, every 500 ms, later while a
#: task holds the GIL.  (A sample without the moment of its reading, in an export of
#: schema version 9 or older, covers these seconds before its heartbeat, which sent the
#: monitor's last reading, up to another interval earlier.)
SAMPLE_SECONDS = 1.0
#: A sample tells a label's GIL share when the label's tasks made most of the CPU
#: demand of its window, and that demand was at least this share of one core.
EVIDENCE_SHARE = 0.8
EVIDENCE_DEMAND = 0.3
#: A label uses the CPU, for the GIL it may hold, from this share of its tasks' run
#: on it and of all tasks' CPU seconds.
CPU_USER = 0.05
#: Tasks of one worker that asked for at most this many cores together, each with a
#: core, waited for its GIL: pure-Python tasks on two threads 1.00-1.05 (the GIL
#: monitor read them holding it), a pandas groupby-apply of a Python function
#: 0.84-1.16, numpy's reductions and random arrays 1.30-1.50.
HELD_CORES = 1.2


def gil_shares(run: Run, load: pd.DataFrame, n_labels: int) -> np.ndarray:
    """The GIL share of each label, from the workers' GIL contention samples (NaN: none).

    A sample covers its worker's time from the system monitor's reading before
    it to its own (:func:`covered`); the tasks running then ask for CPU in
    proportion to their overlap with it and their density.  A sample whose
    demand is mostly one label's says that the label held the GIL for
    ``contention / KNOCK_WAIT`` of the time its demand was on the CPU; a
    label's share is the median over its samples.  A sample that may cover the
    time before the worker's first task (the worker unpacking the graph, a
    library's first call) says nothing, nor does a reading of exactly 0:
    ``gilknocker`` sets its metric to 0 as the monitor reads it, and to a
    measure only as one of its sampling rounds ends, which a task holding the
    GIL holds back (a worker whose tasks let go of it reads 0.002-0.008).
    """
    found: dict[int, list[float]] = {}
    begin, end, density = recorded(run)
    for w, worker in enumerate(run.workers):
        samples = load[(load["process"] == worker) & load["gil"].notna()]
        mine = np.flatnonzero(run.worker == w)
        if not len(mine):
            continue
        first = begin[mine].min()
        windows = covered(samples) - run.origin
        for (since, until), contention in zip(windows.T, samples["gil"].to_numpy()):
            if since < first or contention == 0.0:
                continue
            overlap = np.minimum(end[mine], until) - np.maximum(begin[mine], since)
            inside = overlap > 0
            if not inside.any():
                continue
            demand = np.bincount(run.label[mine][inside],
                                 overlap[inside] * density[mine][inside], n_labels)
            total = demand.sum() / (until - since)
            top = int(demand.argmax())
            if total >= EVIDENCE_DEMAND and demand[top] >= EVIDENCE_SHARE * demand.sum():
                found.setdefault(top, []).append(
                    min(1.0, contention / KNOCK_WAIT / min(total, 1.0)))
    shares = np.full(n_labels, np.nan)
    for label, values in found.items():
        shares[label] = float(np.median(values))
    return shares


def covered(samples: pd.DataFrame) -> np.ndarray:
    """``(since, until)``: the time each of one process's load samples measured, oldest
    first, from the system monitor's reading before it to its own (at most
    :data:`SAMPLE_SECONDS`), or the :data:`SAMPLE_SECONDS` before the sample where the
    moment of its reading is not known.

    The heartbeat that follows a task holding the GIL carries the reading from
    before the task: the monitor's next one had waited for the GIL too.  In four
    recordings of TPC-H Q3 on one thread, the heartbeat as its first ``astype``
    (0.45 s, holding the GIL) ended carried 0.0-0.42; the monitor's next reading,
    0.76-0.88.
    """
    measured = (samples["measured"].to_numpy(dtype=float) if "measured" in samples
                else np.full(len(samples), np.nan))
    known = np.isfinite(measured)
    until = np.where(known, measured, samples["time"].to_numpy(dtype=float))
    before = np.fmax(np.r_[np.nan, measured[:-1]], until - SAMPLE_SECONDS)
    return np.stack([np.where(known, before, until - SAMPLE_SECONDS), until])


def gil_most(run: Run, n_labels: int) -> np.ndarray:
    """The most of each label's CPU time that can hold the GIL, as its tasks' runs on one
    worker at once tell it: one GIL holds for one task at a time, so tasks of one label
    that ran together on the CPU for ``k`` cores' worth held it for ``1 / k`` of that at
    most.  1 for a label whose tasks never ran together.

    Of a task's CPU seconds, those it must have spent in an interval of its run
    are what its time outside the interval cannot hold: two tasks of 10 ms, each
    9 ms on the CPU, that overlap for 1 ms may have taken turns on one core then.
    """
    begin, end, _ = recorded(run)
    cpu = task_cpu(run)
    wall = end - begin
    most = np.ones(n_labels)
    for w in np.unique(run.worker).tolist():
        mine = np.flatnonzero(run.worker == w)
        for since, until, running in intervals(begin[mine], end[mine]):
            if len(running) < 2:
                continue
            tasks = mine[running]
            labels = run.label[tasks]
            if (labels != labels[0]).any():
                continue
            span = until - since
            inside = np.maximum(cpu[tasks] - (wall[tasks] - span), 0.0).sum() / span
            if inside > 1.0:
                most[labels[0]] = min(most[labels[0]], 1.0 / inside)
    return most


def gil_held(run: Run, host: list[int], cores: list[float], waited: np.ndarray,
             n_labels: int) -> np.ndarray:
    """The labels whose tasks ran where the GIL held the CPU back.

    Tasks that use the CPU (:func:`cpu_users`) and run together on one worker,
    while its host (``host`` of each worker, of ``cores``) has a core for each
    task running there, ask for as many cores as they release the GIL for: on
    the CPU, or waiting ``waited`` for a core that the host's other work took
    (as far as the load explains it, :func:`~crux_dask.machine.core_waits`).
    A label's tasks that, beside others of their worker, asked for at most
    :data:`HELD_CORES` with them (over the time they ran so, weighted by their
    CPU seconds) held it or waited for it: the label is played holding it as
    much as it can (:func:`gil_most`).  On TPC-H Q1 on two threads, the tasks
    that ran beside a pandas ``astype`` asked for 1.02-1.07 cores with it: it
    ran at full speed, they waited.  A program the load does not see that took
    cores from tasks that release the GIL reads the same.
    """
    begin, end, density = recorded(run)
    wall = end - begin
    asked = np.divide(np.minimum(task_cpu(run) + waited, wall), wall, out=density.copy(),
                      where=wall > 0)
    uses = cpu_users(run, n_labels)[run.label]
    on = np.asarray(host)[run.worker]
    together, weight = np.zeros(n_labels), np.zeros(n_labels)
    for h, count in enumerate(cores):
        mine = np.flatnonzero((on == h) & uses)
        for since, until, running in intervals(begin[mine], end[mine]):
            if len(running) > count:
                continue
            now = mine[running]
            for w in np.unique(run.worker[now]).tolist():
                tasks = now[run.worker[now] == w]
                if len(tasks) >= 2:
                    used = density[tasks] * (until - since)
                    np.add.at(together, run.label[tasks], used * asked[tasks].sum())
                    np.add.at(weight, run.label[tasks], used)
    return (weight > 0) & (together <= HELD_CORES * weight)


def cpu_users(run: Run, n_labels: int) -> np.ndarray:
    """The labels that use the CPU, for the GIL they may hold: their tasks were on it
    for at least :data:`CPU_USER` of their run and of all tasks' CPU seconds."""
    cpu = task_cpu(run)
    used = np.bincount(run.label, cpu, n_labels)
    return ((used > CPU_USER * np.bincount(run.label, run.duration, n_labels))
            & (used > CPU_USER * cpu.sum()))
