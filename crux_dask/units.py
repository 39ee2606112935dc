"""Units of tasks: a large run replayed on fewer, longer tasks.

A replay costs about ten microseconds a task in Python, so a scaling over
two dozen shapes of a run of half a million tasks would take minutes.  For
such a run, tasks alike are replayed together: the tasks of one label at one
depth of the graph (the longest chain of inputs below them), taken in
priority order, are joined a few at a time into a *unit*, which computes for
their seconds in turn (plus a dispatch for each task after the first), holds
their bytes and needs all their inputs.  No task of a group is an input of
another of the same group, so units form a graph without cycles, as the
tasks do.

A group keeps at least :data:`SPARE` units for each thread of the largest
shape replayed, so that joining tasks does not take away parallelism a shape
could use; groups smaller than that stay as tasks, and so do groups whose
tasks take on average less than the run's round trip (the scheduler's gap
from a task's inputs computed to the task at its worker).  On a layered
graph of 20,000 tasks replayed on 12 shapes, units of about ten tasks
predicted each shape within 3.3 % of the tasks' replay where tasks took as
long as the round trip, but up to 13 % short at a third of it and 28 % at a
tenth: with tasks that short, the scheduler's gaps, paid once a unit, are
the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from crux_dask.replay import root_groups
from crux_dask.runs import Run

__all__ = ["SPARE", "UNITS", "Units", "units_of"]

#: The most units a replay plays, about (groups too small to join add more).
UNITS = 40_000
#: Units a group keeps at least per thread of the largest shape.
SPARE = 8


@dataclass(eq=False)
class Units:
    """A run's tasks joined into units.

    Attributes
    ----------
    run : Run
        The run of units: each unit's label, bytes, recorded seconds and inputs
        (units), ranked by its first task.
    of : numpy.ndarray
        The unit of each task.
    first : numpy.ndarray
        The first task (in priority) of each unit.
    tasks : numpy.ndarray
        How many tasks each unit joins.
    """

    run: Run
    of: np.ndarray
    first: np.ndarray
    tasks: np.ndarray

    def total(self, per_task: np.ndarray) -> np.ndarray:
        """Sum a value of each task over each unit."""
        return np.bincount(self.of, per_task, len(self.first))


def units_of(run: Run, threads: int, most: int = UNITS) -> Units | None:
    """Join ``run``'s tasks into about ``most`` units for shapes of up to ``threads``
    threads in all; None where the run has no more tasks than that, or where its
    ranks are not an order of its inputs (each task after all its inputs).  Found once
    per run and request, so that the replays keyed by them (the unchanged one) are too."""
    key = ("units", threads, most)
    if key not in run.memo:
        run.memo[key] = _units(run, threads, most)
    return run.memo[key]


def _units(run: Run, threads: int, most: int) -> Units | None:
    n = run.n_tasks
    join = math.ceil(n / most) if most > 0 else 1
    consumers = np.repeat(np.arange(n), np.diff(run.dep_ptr))
    if join <= 1 or (run.deps >= consumers).any():
        return None
    depth = _depth(run)
    key = run.label.astype(np.int64) * (int(depth.max()) + 1) + depth
    order = np.argsort(key, kind="stable")  # by group, then by rank
    starts = np.flatnonzero(np.r_[True, key[order][1:] != key[order][:-1]])
    sizes = np.diff(np.r_[starts, n])
    per_unit = np.clip(sizes // (SPARE * threads), 1, join)
    # Tasks shorter than the scheduler's round trip stay as tasks: there its gaps,
    # which a unit would pay once for all its tasks, decide the run.
    group = np.repeat(np.arange(len(sizes)), sizes)
    seconds = np.bincount(group, run.duration[order], len(sizes)) / sizes
    per_unit[seconds < run.gaps.local] = 1
    rank = np.arange(n) - np.repeat(starts, sizes)
    base = np.cumsum(np.r_[0, -(-sizes // per_unit)[:-1]])
    unit = np.empty(n, dtype=np.int64)
    unit[order] = np.repeat(base, sizes) + rank // np.repeat(per_unit, sizes)
    count = int(unit.max()) + 1
    first = np.full(count, n, dtype=np.int64)
    np.minimum.at(first, unit, np.arange(n))
    # Units ranked by their first task.
    by_first = np.argsort(first, kind="stable")
    renamed = np.empty(count, dtype=np.int64)
    renamed[by_first] = np.arange(count)
    unit, first = renamed[unit], first[by_first]
    pairs = np.unique(unit[consumers] * count + unit[run.deps])
    user, dep = np.divmod(pairs, count)
    outputs = np.unique(unit[run.outputs])
    delay = run.output_delay.max() if len(run.output_delay) else 0.0

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(unit, values, count)

    joined = replace(
        run, state=run.state[first], duration=total(run.duration), spill=total(run.spill),
        size=total(run.size).round().astype(run.size.dtype), label=run.label[first],
        worker=run.worker[first], dep_ptr=np.searchsorted(user, np.arange(count + 1)),
        deps=dep, outputs=outputs, output_delay=np.full(len(outputs), delay),
        memo={"rootish": root_groups(run)})
    return Units(joined, unit, first, np.bincount(unit, minlength=count))


def _depth(run: Run) -> np.ndarray:
    """The longest chain of inputs below each task (0 for a task without inputs), for
    tasks ranked after their inputs."""
    ptr, deps = run.dep_ptr.tolist(), run.deps.tolist()
    depth = [0] * run.n_tasks
    below = depth.__getitem__
    for task in range(run.n_tasks):
        lo, hi = ptr[task], ptr[task + 1]
        if lo < hi:
            depth[task] = 1 + max(map(below, deps[lo:hi]))
    return np.asarray(depth, dtype=np.int64)
