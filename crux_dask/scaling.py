"""How many workers are enough: the what-if over a range of cluster shapes.

Each shape (workers × threads per worker) is replayed from the recorded run
by :func:`~crux_dask.whatif.what_if`, on the machine the run tells
(:mod:`crux_dask.machine`): workers added to a run on one host share its
cores.  The shape named *enough* is the smallest (fewest threads in all, then
fewest workers) whose predicted makespan is within :data:`ENOUGH` of the
best one's, as Sparklens names the fewest executors that keep an
application's time.  Where the run cannot tell whether a label holds the
GIL, a shape's prediction is a range, and a shape is enough only if its
high end is within :data:`ENOUGH` of the best high end.  A run of more tasks
than :data:`~crux_dask.units.UNITS` is replayed on units of its tasks
(:mod:`crux_dask.units`): two dozen replays of half a million tasks would
take a minute or more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from crux_dask.machine import Machine, machine_of
from crux_dask.recording import extract
from crux_dask.runs import Run
from crux_dask.store import PAGStore
from crux_dask.units import UNITS, units_of
from crux_dask.whatif import what_if

__all__ = ["ENOUGH", "SCALING_COLUMNS", "Scaling", "scaling"]

#: A shape is enough within this share of the best predicted makespan.
ENOUGH = 0.05
#: The columns of :attr:`Scaling.table`.
SCALING_COLUMNS = ("workers", "threads", "predicted", "low", "high", "change", "enough")


@dataclass
class Scaling:
    """Predicted makespans over cluster shapes.

    Attributes
    ----------
    table : pandas.DataFrame
        One row per shape, fewest threads in all first: ``workers``,
        ``threads`` (per worker), ``predicted`` makespan, ``low`` and ``high``
        (the range where the run cannot tell whether a label holds the GIL,
        else both the prediction), ``change`` (predicted over recorded) and
        ``enough`` (true for the shape named enough).
    recorded : float
        The recorded run's makespan.
    shape : tuple of int
        The recorded run's workers and threads per worker.
    enough : tuple of int
        The smallest shape within :data:`ENOUGH` of the best.
    gil_unknown : list of str
        The labels whose GIL share the run does not tell.
    cores : bool
        Whether the cores of the run's hosts are known (from its load): else
        they are no limit, and more workers on one host always help.
    """

    table: pd.DataFrame
    recorded: float
    shape: tuple[int, int]
    enough: tuple[int, int]
    gil_unknown: list[str]
    cores: bool

    def summary(self) -> str:
        """One line: the shape that is enough, its prediction, and the best's."""
        row = self.table[self.table["enough"]].iloc[0]
        best = self.table["high"].min()
        unsure = (f"; the run does not tell whether {', '.join(self.gil_unknown)} hold the "
                  "GIL, so each prediction is a range" if self.gil_unknown else "")
        if not self.cores:
            unsure += "; the cores of its hosts are not known (no load): they are no limit"
        return (f"{self.enough[0]} worker{'s' * (self.enough[0] > 1)} × {self.enough[1]} "
                f"thread{'s' * (self.enough[1] > 1)} {'are' if self.enough[0] > 1 else 'is'} "
                f"enough: predicted {row.predicted:.3f} s, within {ENOUGH:.0%} of the best "
                f"({best:.3f} s); recorded {self.recorded:.3f} s on {self.shape[0]} × "
                f"{self.shape[1]}{unsure}")


def scaling(store: PAGStore, end: int, workers: Iterable[int], threads: Iterable[int],
            load: pd.DataFrame | None = None, run: Run | None = None,
            machine: Machine | None = None, most: int = UNITS) -> Scaling:
    """Predict the run on every shape of ``workers`` × ``threads``; see
    :meth:`crux_dask.PAG.scaling`.  ``run`` and ``machine`` (as
    :func:`~crux_dask.whatif.what_if` takes them) may be given to save finding them again.
    A run of more than ``most`` tasks is replayed on about as many units of its tasks
    (:mod:`crux_dask.units`).

    Raises
    ------
    ValueError
        For no shape, a number of workers or threads below one, or a run
        without tasks or timing.
    """
    shapes = sorted({(w, t) for w in workers for t in threads}, key=lambda s: (s[0] * s[1], s[0]))
    if not shapes:
        raise ValueError("scaling needs at least one number of workers and of threads")
    run = extract(store, end) if run is None else run
    machine = machine_of(run, load) if machine is None else machine
    units = units_of(run, max(w * t for w, t in shapes), most)
    rows, unknown = [], set()
    for w, t in shapes:
        result = what_if(store, end, workers=w, threads=t, run=run, machine=machine,
                         units=units)
        low, high = result.range or (result.makespan, result.makespan)
        unknown.update(result.gil_unknown)
        rows.append({"workers": w, "threads": t, "predicted": result.makespan, "low": low,
                     "high": high, "change": result.makespan / result.recorded})
    table = pd.DataFrame(rows, columns=list(SCALING_COLUMNS[:-1]))
    enough = int((table["high"] <= (1 + ENOUGH) * table["high"].min()).to_numpy().argmax())
    table["enough"] = table.index == enough
    return Scaling(table, run.makespan, (len(run.workers), run.threads),
                   (int(table.at[enough, "workers"]), int(table.at[enough, "threads"])),
                   sorted(unknown), all(math.isfinite(c) for c in machine.cores))
