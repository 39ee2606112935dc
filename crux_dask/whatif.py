"""What-if replay: a recorded run played again by a model of Dask's scheduler.

The tasks of a recorded run (states computed on a worker thread), their
inputs, compute seconds and output sizes, are replayed by a discrete-event
model that behaves like ``distributed``'s scheduler and workers:

* **order**: the priorities Dask gave the tasks order the scheduler's queue
  and each worker's ready heap; in a run recorded without them (exported
  before they were captured) the order in which the tasks started stands in;
* **placement**: a task whose inputs are all in memory goes, like
  ``decide_worker``, to the worker holding some of its inputs where it could
  start soonest (occupancy per thread plus the bytes to fetch over the
  measured bandwidth), a task without inputs to the least occupied worker;
* **root-task queuing**: tasks of *root-ish* groups (a label with more tasks
  than twice the threads and fewer than five input tasks in all) wait in the
  scheduler's queue until a worker has fewer than
  ``max(ceil(threads * worker_saturation), 1)`` tasks processing;
* **threads**: each worker runs its tasks on ``threads`` threads, each task
  for its recorded compute seconds (divided by its label's speedup);
* **transfers**: an input held elsewhere is fetched, starting the measured
  fetch lag after the task reached its worker, and takes latency + bytes /
  bandwidth, both fitted to the recorded transfers between workers;
* **scheduling gaps**: the medians measured in the run: from a task's release
  (its inputs computed, a queue slot freed, the graph's arrival) to its
  arrival at its worker, and from its inputs there and a thread free to its
  start (see :class:`Gaps`);
* **spill**: the seconds a worker spent spilling after a task, or loading its
  input back from disk, are added to that task (dropped with ``spill=False``);
* **stragglers**: with ``stragglers="median"``, each straggler
  (:mod:`crux_dask.groups`) computes for its group's median seconds; its
  bytes stay as recorded.

Not modelled: work stealing, contention for cores or the GIL between
threads (a task's seconds do not grow with more threads), limits on
concurrent transfers, memory limits and pauses, and the order of ties Dask
breaks by bytes held.

The makespan, recorded and predicted alike, is the time from the graph's
root (its arrival at the scheduler) to the run's end state (usually the
result reaching the client).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from crux_dask.groups import tasks
from crux_dask.recording import extract
from crux_dask.replay import Run, Schedule, simulate
from crux_dask.store import PAGStore
from crux_dask.wcp import CriticalPath

__all__ = ["WhatIf", "predicted_pag", "suggest", "what_if"]

#: Candidate labels of :func:`suggest`: the top labels of the observed path.
TOP_LABELS = 3


@dataclass
class WhatIf:
    """A predicted run.

    Attributes
    ----------
    makespan : float
        Predicted seconds from the graph's root to the run's end.
    recorded : float
        The recorded run's makespan, same definition.
    replay_error : float
        The unchanged replay's makespan against ``recorded``, as a fraction
        (``+0.05``: the model predicts the recorded run 5 % too long).
    baseline : float
        The unchanged replay's makespan: ``makespan - baseline`` is what the
        change does within the model.
    changes : dict
        The change replayed.
    """

    makespan: float
    recorded: float
    replay_error: float
    baseline: float
    changes: dict
    run: Run = field(repr=False)
    schedule: Schedule = field(repr=False)

    @property
    def saved(self) -> float:
        """Seconds the change saves, against the unchanged replay."""
        return self.baseline - self.makespan

    @cached_property
    def path(self) -> CriticalPath:
        """The observed critical path of the predicted run (a PAG built from its events)."""
        return predicted_pag(self.run, self.schedule).wcp()

    def summary(self) -> str:
        """One line: the change, predicted and recorded makespans, and the replay's error."""
        change = ", ".join(f"{k}={v}" for k, v in self.changes.items()) or "unchanged"
        return (f"{change}: predicted {self.makespan:.3f} s (saves {self.saved:+.3f} s), "
                f"recorded {self.recorded:.3f} s, unchanged replay error "
                f"{self.replay_error:+.1%}")


def predicted_pag(run: Run, schedule: Schedule):
    """A PAG of the predicted run, built by :class:`~crux_dask.PAGBuilder` from its events."""
    from crux_dask.graph.builder import PAGBuilder

    store = run.store
    keys = np.asarray(store.keys.values, dtype=object)[store.column("state_key", run.state)]
    names = [run.workers[w] if w < len(run.workers) else f"tcp://what-if:{w}"
             for w in range(schedule.workers)]
    origin = run.origin
    events: list[tuple[float, int, tuple]] = [(0.0, 0, ("root", origin, "graph"))]
    for d, src, dst, began, there in schedule.transfers:
        events.append((there, 1, ("transfer", keys[d], f"memory@{names[src]}",
                                  f"memory@{names[dst]}", origin + began, origin + there,
                                  int(run.size[d]))))
    labels = run.label_names
    for task in range(run.n_tasks):
        inputs = tuple(keys[run.deps[run.dep_ptr[task]:run.dep_ptr[task + 1]]])
        releaser = int(schedule.released_by[task])
        events.append((schedule.stop[task], 2, (
            "compute", keys[task], names[schedule.worker[task]], int(schedule.thread[task]),
            origin + schedule.start[task], origin + schedule.stop[task], int(run.size[task]),
            inputs, 0, labels[task], None, None, None, None, None,
            origin + schedule.sent[task], origin + schedule.runnable[task],
            origin + schedule.runnable[task],
            keys[releaser] if releaser >= 0 else None,
            names[schedule.worker[releaser]] if releaser >= 0 else None)))
    last = schedule.stop[run.outputs].max() if len(run.outputs) else 0.0
    # The client gathers once every output is computed; the output computed last is
    # the one it receives last, so that the path ends through it.
    by_stop = run.outputs[np.argsort(schedule.stop[run.outputs], kind="stable")]
    for task, delay in zip(by_stop.tolist(), np.sort(run.output_delay).tolist()):
        there = last + delay
        events.append((there, 3, ("transfer", keys[task], f"memory@{names[schedule.worker[task]]}",
                                  "client", origin + min(last, there), origin + there,
                                  int(run.size[task]))))
    events.sort(key=lambda e: (e[0], e[1]))
    builder = PAGBuilder(run_id=f"{store.run_id}-what-if")
    builder.apply_many([e[2] for e in events])
    builder.resolve_parked()
    return builder.pag()


def what_if(store: PAGStore, end: int, workers: int | None = None, threads: int | None = None,
            speedup: dict[str, float] | None = None, transfer_speedup: float | None = None,
            spill: bool = True, stragglers: str | None = None, run: Run | None = None
            ) -> WhatIf:
    """Replay a recorded run with changes; see :meth:`crux_dask.PAG.what_if`.

    Raises
    ------
    ValueError
        For an unknown label, a number of workers or threads below one, a
        factor that is not positive, ``stragglers`` other than ``"median"``, or a
        run without tasks or timing.
    """
    run = extract(store, end) if run is None else run
    changes: dict = {}
    if workers is not None:
        _positive_int("workers", workers)
        changes["workers"] = workers
    if threads is not None:
        _positive_int("threads", threads)
        changes["threads"] = threads
    factor = np.ones(run.n_tasks)
    if speedup:
        known = set(run.label_names.tolist())
        for prefix, k in speedup.items():
            if prefix not in known:
                raise ValueError(f"unknown task prefix {prefix!r}; the run's prefixes: "
                                 f"{', '.join(sorted(known))}")
            _positive("speedup of " + prefix, k)
            factor[run.label_names == prefix] = k
        changes["speedup"] = dict(speedup)
    if transfer_speedup is not None:
        _positive("transfer_speedup", transfer_speedup)
        changes["transfer_speedup"] = transfer_speedup
    if not spill:
        changes["spill"] = False
    duration = run.duration
    if stragglers is not None:
        if stragglers != "median":
            raise ValueError(f"stragglers must be 'median', got {stragglers!r}")
        duration = _stragglers_at_median(run)
        changes["stragglers"] = stragglers
    base = run.replay
    if not changes:
        schedule = base
    else:
        k = transfer_speedup or 1.0
        latency = 0.0 if math.isinf(k) else run.latency / k
        bandwidth = math.inf if math.isinf(k) else run.bandwidth * k
        seconds = duration / factor + (run.spill if spill else 0.0)
        schedule = simulate(run, workers or len(run.workers), threads or run.threads, seconds,
                            run.gaps, latency, bandwidth)
    return WhatIf(schedule.makespan, run.makespan, base.makespan / run.makespan - 1,
                  base.makespan, changes, run, schedule)


def suggest(store: PAGStore, end: int, path: CriticalPath) -> pd.DataFrame:
    """Candidate changes ranked by predicted seconds saved; see :meth:`crux_dask.PAG.suggest`."""
    run = extract(store, end)
    steps = path.to_frame()
    on_path = steps[steps["category"] == "compute"].groupby("label")["busy"].sum()
    on_path = on_path[on_path.index.isin(run.label_names.tolist())]  # not a shuffle's shards
    candidates: list[tuple[str, dict]] = [
        (f"{prefix} 2x faster", {"speedup": {prefix: 2.0}})
        for prefix in on_path.sort_values(ascending=False).index[:TOP_LABELS]]
    candidates += [
        (f"{len(run.workers) + 1} workers", {"workers": len(run.workers) + 1}),
        (f"{2 * run.threads} threads per worker", {"threads": 2 * run.threads}),
        ("free transfers", {"transfer_speedup": math.inf}),
        ("no spill", {"spill": False}),
    ]
    stragglers = stragglers_in(run)
    if stragglers:
        candidates.append((f"{stragglers} straggler{'s' * (stragglers > 1)} at their "
                           "group's median", {"stragglers": "median"}))
    rows = []
    for name, change in candidates:
        result = what_if(store, end, run=run, **change)
        rows.append({"change": name, "predicted": result.makespan, "saved": result.saved,
                     "saved_share": result.saved / result.baseline,
                     "replay_error": result.replay_error,
                     "path_then": _top_labels(result.path)})
    frame = pd.DataFrame(rows)
    return frame.sort_values("saved", ascending=False, kind="stable").reset_index(drop=True)


def suggest_apart(pieces: Any, end: int, niceness: int, answer: Any,
                  load: dict | None = None) -> None:
    """:func:`~crux_dask.advice.what_to_fix` for the store
    :meth:`~crux_dask.store.PAGStore.to_pieces` cut, on its observed path to ``end``,
    with the ``load`` columns, sent on the connection ``answer`` as ``(table, None)``, or
    ``(None, error)`` for a ``ValueError``.  The pieces come on the connection
    ``pieces``, one per message, until an empty one.

    What a process of its own runs, ``niceness`` less favoured than its
    parent, for a server whose event loop must not wait for it: a replay
    allocates millions of small objects, and a thread would hold the
    interpreter for every garbage collection they cause.
    """
    from crux_dask.advice import what_to_fix
    from crux_dask.wcp import critical_path

    os.nice(niceness)
    store = PAGStore.from_pieces(list(iter(pieces.recv_bytes, b"")))
    try:
        answer.send((what_to_fix(store, end, critical_path(store, default_end=end), load),
                     None))
    except ValueError as error:  # a run without tasks or timing
        answer.send((None, error))


def _stragglers_at_median(run: Run) -> np.ndarray:
    """The compute seconds of the run's tasks, each straggler's its group's median."""
    found = tasks(run.store)
    at = found.positions(run.state)
    straggler = found.stragglers()[at] != ""
    return np.where(straggler, found.median_seconds[found.group[at]], run.duration)


def stragglers_in(run: Run) -> int:
    """How many of the run's tasks are stragglers."""
    return int((tasks(run.store).stragglers() != "").sum())


def _top_labels(path: CriticalPath, top: int = TOP_LABELS) -> str:
    """The labels with the most busy seconds on a path, with their seconds."""
    steps = path.to_frame()
    busy = steps.groupby("label")["busy"].sum().sort_values(ascending=False).head(top)
    return ", ".join(f"{label} {seconds:.3f}s" for label, seconds in busy.items() if seconds > 0)


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float, np.number)) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
