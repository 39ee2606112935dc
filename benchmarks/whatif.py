"""Speed of the what-if replay on a synthetic run of about a million states.

The layered workflow of :mod:`benchmarks.core_scale` (16 workers, each task
merging three outputs of the layer before, one input in ten fetched from
another worker, every replica released) is built through the real builder,
its tasks of ``--seconds`` each scheduled as Dask would (:func:`scheduled`),
then replayed: the recorded run read once (``extract``), an unchanged replay
and a replay on twice the workers, each timed on its own; then the
prediction over cluster shapes (``PAG.scaling``'s default: 1–8 workers ×
1, 2 or 4 threads, 24 shapes), which a run this large replays on units of
its tasks (:mod:`crux_dask.units`).  With ``--tasks`` the scaling is also
replayed on every task, and the two compared shape by shape.

With ``--seconds 0`` the events are those of ``core_scale``, serial in time
(tasks of 80 µs, 0.13 s from a task's inputs to its start): tasks shorter
than the round trip, which stay tasks.  With ``--cpu`` every task's seconds
are CPU seconds and a load table gives each worker's host two cores, so the
replays share cores as those of a run recorded with Crux's CPU clocks do
(:mod:`crux_dask.sharing`), each worker's event loop working :data:`LOOP`
seconds after each task; without it the run has no CPU seconds, as an
export of an older schema, and tasks compete for nothing.

Targets: a replay of a million states in seconds; the scaling in ≤ 30 s.

Usage: ``python benchmarks/whatif.py [--states N] [--seconds S] [--cpu] [--tasks]``
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import pandas as pd
from core_scale import workflow_events

from crux_dask.events import Compute
from crux_dask.graph.builder import PAGBuilder
from crux_dask.load import LOAD_COLUMNS, SCHEDULER
from crux_dask.recording import extract
from crux_dask.runs import Run
from crux_dask.scaling import scaling
from crux_dask.sharing import task_cpu
from crux_dask.units import UNITS
from crux_dask.whatif import what_if

CPU = Compute._fields.index("cpu")
SENT = Compute._fields.index("sent")
PRIORITY = Compute._fields.index("priority")
#: CPU seconds of a worker's event loop after each task (with ``--cpu``): about what a
#: worker of a local cluster spends (1 to 4 ms in the real-code benchmark).
LOOP = 0.002


def build(n_tasks: int, cpu: bool, seconds: float | None = None) -> PAGBuilder:
    """The synthetic run, its tasks all CPU where ``cpu``, scheduled in parallel with
    tasks of ``seconds`` if given."""
    builder = PAGBuilder()
    events = workflow_events(n_tasks)
    for chunk in events if seconds is None else scheduled(events, seconds):
        if cpu:
            chunk = [_with_cpu(event) if event[0] == "compute" else event for event in chunk]
        builder.apply_many(chunk)
    return builder


def scheduled(chunks, seconds: float, round_trip: float = 0.01, dispatch: float = 0.001):
    """The synthetic workflow's events as a schedule Dask could make: each task sent once
    its inputs are computed, at its worker a ``round_trip`` later, where it computes for
    ``seconds`` on the worker's thread once free (after a ``dispatch``); its fetches as it
    arrives; a layer deleted after the next."""
    stop: dict[str, float] = {}
    free: dict[str, float] = {}
    origin, fetches, last = 0.0, [], 0.0
    for chunk in chunks:
        out = []
        for event in chunk:
            kind = event[0]
            if kind == "root":
                origin = last = event[1]
                out.append(event)
            elif kind == "transfer":
                fetches.append(event)
            elif kind == "delete":
                out.append((*event[:3], last))
            else:
                key, worker, inputs = event[1], event[2], event[7]
                released = max((stop[k] for k in inputs), default=origin)
                there = released + round_trip
                start = max(there, free.get(worker, origin)) + dispatch
                stop[key] = free[worker] = start + seconds
                last = max(last, start + seconds)
                out += [(*f[:4], there, there + dispatch / 2, *f[6:]) for f in fetches]
                fields = [*event[:4], start, start + seconds, *event[6:]]
                fields += [None] * (len(Compute._fields) - len(fields))
                fields[SENT:SENT + 3] = released, there, there
                fields[PRIORITY] = len(stop)
                out.append(tuple(fields))
                fetches = []
        yield out


def _with_cpu(event: tuple) -> tuple:
    fields = list(event) + [None] * (len(Compute._fields) - len(event))
    fields[CPU], fields[CPU + 1] = event[5] - event[4], 0.0  # cpu, cpu_wait
    return tuple(fields)


def two_cores(run: Run) -> pd.DataFrame:
    """A load table: each worker on a host of two cores, its process's CPU seconds at the
    run's start and end its tasks' and :data:`LOOP` seconds a task more; the scheduler's."""
    cpu = np.bincount(run.worker, task_cpu(run), len(run.workers))
    tasks = np.bincount(run.worker, minlength=len(run.workers))
    rows = [{"process": p, "time": at, "cpu": 0.5, "lag": 0.0, "busy": 0.0, "threads": 1.0,
             "cores": 2.0, "gil": float("nan"), "cpu_time": used}
            for p, done in zip(run.workers, cpu + LOOP * tasks)
            for at, used in ((run.origin - 1.0, 0.0), (run.origin + run.makespan + 1.0, done))]
    rows.append({"process": SCHEDULER, "time": run.origin + 1.0, "cpu": 0.5, "lag": 0.0,
                 "cores": 2.0})
    return pd.DataFrame(rows).astype(LOAD_COLUMNS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=1_000_000,
                        help="about how many states the run has")
    parser.add_argument("--seconds", type=float, default=0.02,
                        help="seconds of each task, scheduled as Dask would (0: the "
                             "events serial in time, of tasks of 80 µs)")
    parser.add_argument("--cpu", action="store_true",
                        help="tasks of CPU seconds, on hosts of two cores")
    parser.add_argument("--tasks", action="store_true",
                        help="also the scaling replayed on every task, to compare")
    args = parser.parse_args()
    # core_scale's workflow makes about 2.2 states per task (its copies and tombstones).
    builder = build(int(args.states / 2.2), args.cpu, args.seconds or None)
    store, end = builder.store, builder.pag().ends[0]
    print(f"run: {store.n_states:,} states, {store.n_mutations:,} mutations, "
          + (f"tasks of {args.seconds} s scheduled as Dask would" if args.seconds else
             "events serial in time") + (", CPU seconds on hosts of two cores" * args.cpu))
    t0 = time.perf_counter()
    run = extract(store, end)
    t1 = time.perf_counter()
    print(f"extract: {run.n_tasks:,} tasks, {len(run.deps):,} inputs in {t1 - t0:.2f} s")
    load = two_cores(run) if args.cpu else None
    for change in ({}, {"workers": 2 * len(run.workers)}):
        t0 = time.perf_counter()
        result = what_if(store, end, run=run, load=load, **change)
        spent = time.perf_counter() - t0
        print(f"replay {change or 'unchanged'}: {spent:.2f} s (the unchanged replay is "
              f"computed once and kept); predicted {result.makespan:.3f} s, recorded "
              f"{result.recorded:.3f} s, replay error {result.replay_error:+.1%}")
    found = {}
    for most in (UNITS, math.inf) if args.tasks else (UNITS,):
        run.memo.clear()
        t0 = time.perf_counter()
        found[most] = scaling(store, end, range(1, 9), (1, 2, 4), load, run=run, most=most)
        spent = time.perf_counter() - t0
        print(f"scaling over {len(found[most].table)} shapes, replayed on "
              f"{'every task' if math.isinf(most) else f'units (at most about {most:,})'}: "
              f"{spent:.2f} s; {found[most].summary()}")
    if args.tasks:
        error = found[UNITS].table["predicted"] / found[math.inf].table["predicted"] - 1
        print(f"units against every task: largest error {error.abs().max():.1%}, median "
              f"{error.abs().median():.1%}; enough {found[UNITS].enough} against "
              f"{found[math.inf].enough}")
    print("targets: a replay of 1M states in seconds; the scaling in <= 30 s")


if __name__ == "__main__":
    main()
