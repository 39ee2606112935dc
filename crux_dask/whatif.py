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
* **the machine**: where the run recorded its tasks' CPU seconds, the tasks
  running at once share their host's cores and their worker's GIL
  (:mod:`crux_dask.machine`), and their recorded seconds lose the stretch of
  what they competed for in the run; the load of the run (``load``) tells
  the cores, each worker's event loop's work after each task (which shares
  them too) and, where distributed measured GIL contention, which labels
  hold the GIL.  Where it cannot tell for a label that uses the CPU, the
  run is played both ways and the prediction is the range between;
* **transfers**: an input held elsewhere is fetched, starting the measured
  fetch lag after the task reached its worker, and takes latency + bytes /
  bandwidth, both fitted to the recorded transfers between workers;
* **scheduling gaps**: the medians measured in the run: from a task's release
  (its inputs computed, a queue slot freed, the graph's arrival) to its
  arrival at its worker, and from its inputs there and a thread free to its
  start (see :class:`~crux_dask.runs.Gaps`); on other threads per worker, the round trip and
  the dispatch scale with the threads that hold the GIL (:func:`_gaps_at`);
* **spill**: the seconds a worker spent spilling after a task, or loading its
  input back from disk, are added to that task (dropped with ``spill=False``);
* **stragglers**: with ``stragglers="median"``, each straggler
  (:mod:`crux_dask.groups`) computes for its group's median seconds; its
  bytes stay as recorded.

Not modelled: work stealing, the scheduler's own CPU as a limit on how many
tasks a second it can send, limits on concurrent transfers, memory limits
and pauses, and the order of ties Dask breaks by bytes held.

The makespan, recorded and predicted alike, is the time from the graph's
root (its arrival at the scheduler) to the run's end state (usually the
result reaching the client).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import pandas as pd

from crux_dask.gil import cpu_users
from crux_dask.groups import Tasks, tasks
from crux_dask.machine import Machine, core_waits, machine_of
from crux_dask.recording import extract
from crux_dask.replay import Schedule, simulate
from crux_dask.runs import Gaps, Run
from crux_dask.sharing import LOOP_GIL, solo_seconds
from crux_dask.store import PAGStore
from crux_dask.units import Units
from crux_dask.wcp import CriticalPath

__all__ = ["WhatIf", "suggest", "what_if"]

#: Candidate labels of :func:`suggest`: the top labels of the observed path.
TOP_LABELS = 3
#: A range narrower than this share of its high end is given as one number.
RANGE_MIN = 0.05


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
    range : tuple of float or None
        ``(low, high)``: the makespans predicted with the labels of
        ``gil_unknown`` releasing the GIL and holding it (``makespan`` is their
        mean); None where the run tells what the prediction needs.
    gil_unknown : list of str
        The labels that use the CPU and whose GIL share the run does not tell.
    """

    makespan: float
    recorded: float
    replay_error: float
    baseline: float
    changes: dict
    run: Run = field(repr=False)
    schedule: Schedule = field(repr=False)
    range: tuple[float, float] | None = None
    gil_unknown: list[str] = field(default_factory=list)

    @property
    def saved(self) -> float:
        """Seconds the change saves, against the unchanged replay."""
        return self.baseline - self.makespan

    @cached_property
    def path(self) -> CriticalPath:
        """The observed critical path of the predicted run (a PAG built from its events)."""
        from crux_dask.predicted import predicted_pag

        return predicted_pag(self.run, self.schedule).wcp()

    def summary(self) -> str:
        """One line: the change, predicted and recorded makespans, and the replay's error."""
        change = ", ".join(f"{k}={v}" for k, v in self.changes.items()) or "unchanged"
        between = "" if self.range is None else (
            f" (between {self.range[0]:.3f} s and {self.range[1]:.3f} s: the run does not "
            f"tell whether {', '.join(self.gil_unknown)} hold the GIL)")
        return (f"{change}: predicted {self.makespan:.3f} s{between} (saves "
                f"{self.saved:+.3f} s), recorded {self.recorded:.3f} s, unchanged replay "
                f"error {self.replay_error:+.1%}")


def what_if(store: PAGStore, end: int, workers: int | None = None, threads: int | None = None,
            speedup: dict[str, float] | None = None, transfer_speedup: float | None = None,
            spill: bool = True, stragglers: str | None = None, run: Run | None = None,
            load: pd.DataFrame | None = None, machine: Machine | None = None,
            units: Units | None = None) -> WhatIf:
    """Replay a recorded run with changes; see :meth:`crux_dask.PAG.what_if`.

    ``machine`` (:func:`~crux_dask.machine.machine_of` the run and its
    ``load``) may be given to save finding it again.  With ``units``
    (:func:`~crux_dask.units.units_of` the run), the replays, unchanged and
    changed, play them instead of the tasks, as a scaling of a large run does.

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
    k = transfer_speedup or 1.0
    latency = 0.0 if math.isinf(k) else run.latency / k
    bandwidth = math.inf if math.isinf(k) else run.bandwidth * k
    shape = (workers or len(run.workers), threads or run.threads)
    machine = machine_of(run, load) if machine is None else machine
    bases, schedules = [], []
    stretch = np.divide(duration, run.duration, out=np.ones(run.n_tasks),
                        where=run.duration > 0)
    for gil in _gil_cases(run, machine):
        solo, density, background, base = _solo(run, machine, gil, units)
        bases.append(base)
        schedules.append(bases[-1] if not changes else _play(
            run, machine, gil, solo * stretch / factor, density, background, *shape,
            run.spill if spill else 0.0, latency, bandwidth, units))
    low, high = min(s.makespan for s in schedules), max(s.makespan for s in schedules)
    base = float(np.mean([b.makespan for b in bases]))
    unknown = sorted(set(run.label_names[_gil_unknown(run, machine)].tolist()))
    between = high - low > RANGE_MIN * high
    return WhatIf((low + high) / 2, run.makespan, base / run.makespan - 1, base, changes,
                  run if units is None else units.run, schedules[-1],
                  (low, high) if between else None, unknown if between else [])


def suggest(store: PAGStore, end: int, path: CriticalPath,
            load: pd.DataFrame | None = None, run: Run | None = None,
            machine: Machine | None = None) -> pd.DataFrame:
    """Candidate changes ranked by predicted seconds saved; see :meth:`crux_dask.PAG.suggest`.

    ``run`` and ``machine`` (as :func:`what_if` takes them) may be given to save finding
    them again."""
    run = extract(store, end) if run is None else run
    machine = machine_of(run, load) if machine is None else machine
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
    rows = [{"change": name} | suggestion_row(what_if(store, end, run=run, machine=machine,
                                                      **change))
            for name, change in candidates]
    frame = pd.DataFrame(rows)
    return frame.sort_values("saved", ascending=False, kind="stable").reset_index(drop=True)


def suggestion_row(result: WhatIf) -> dict:
    """The figures of one change in :func:`suggest`'s table: ``predicted``, ``low`` and
    ``high`` (NaN without a range), ``saved``, ``saved_share``, ``replay_error`` and
    ``path_then``."""
    low, high = result.range or (math.nan, math.nan)
    return {"predicted": result.makespan, "low": low, "high": high, "saved": result.saved,
            "saved_share": result.saved / result.baseline,
            "replay_error": result.replay_error, "path_then": _top_labels(result.path)}


def _gil_unknown(run: Run, machine: Machine) -> np.ndarray:
    """Which tasks are of a label that uses the CPU
    (:func:`~crux_dask.gil.cpu_users`) and whose GIL share the run does not tell."""
    return (np.isnan(machine.gil) & cpu_users(run, len(machine.gil)))[run.label]


def _gil_cases(run: Run, machine: Machine) -> list[np.ndarray]:
    """The GIL share of each task, as the run tells it; where it does not for a label that
    uses the CPU, two cases: releasing the GIL, and holding it as much as it can have."""
    gil = np.nan_to_num(machine.gil[run.label], nan=0.0)  # no CPU: no GIL either
    unknown = _gil_unknown(run, machine)
    if not unknown.any():
        return [gil]
    return [np.where(unknown, 0.0, gil), np.where(unknown, machine.gil_most[run.label], gil)]


def _solo(run: Run, machine: Machine, gil: np.ndarray, units: Units | None) -> tuple:
    """:func:`~crux_dask.sharing.solo_seconds`, with the waits for a core the machine
    explains, its background, and the unchanged replay of them (on ``units``, if
    given): once per run, machine and GIL case (a scaling or suggest() replays many
    changes of one run)."""
    memo = run.memo.setdefault("solo", {})
    seen, known = memo.get(gil.tobytes(), (None, None))
    if seen is not machine:
        known = solo_seconds(run, gil, core_waits(run, machine), machine.loop), {}
        memo[gil.tobytes()] = machine, known
    (solo, density), bases = known
    if units not in bases:
        bases[units] = _play(run, machine, gil, solo, density, machine.background,
                             len(run.workers), run.threads, run.spill, run.latency,
                             run.bandwidth, units)
    return solo, density, machine.background, bases[units]


def _play(run: Run, machine: Machine, gil: np.ndarray, solo: np.ndarray,
          density: np.ndarray, background: list[float], workers: int, threads: int,
          spill: np.ndarray | float, latency: float, bandwidth: float,
          units: Units | None) -> Schedule:
    """A replay on ``workers`` × ``threads`` of these solo seconds, sharing the machine
    with the ``background`` of each host: of the tasks, or of ``units``, each for its
    tasks' seconds and a dispatch for each task after the first.

    A unit's tasks run one after another on its thread, each beside its worker's
    loop's work after the one before: the unit asks for the loop's CPU seconds
    after each of its tasks (the workers' mean) and lasts, for each task after
    the first, as long as the loop took of the GIL from it.  (Played as tasks of
    their own, as after tasks, the loop's work doubled a scaling's time.)  The
    scheduler's work then takes its recorded mean of its host's cores, in its
    background.
    """
    seconds = solo + spill
    cpu = density * solo
    gaps = _gaps_at(run, gil, cpu, threads)
    if units is not None:
        loop = machine.mean_loop
        background = [b + machine.scheduler_cores(run) * (h == 0)
                      for h, b in enumerate(background)]
        seconds = units.total(seconds) + (units.tasks - 1) * gaps.dispatch
        cpu, gil, run = units.total(cpu), gil[units.first], units.run
        share = np.divide(cpu, seconds, out=np.zeros(run.n_tasks), where=seconds > 0)
        seconds = seconds + (units.tasks - 1) * loop * LOOP_GIL * gil * share
        cpu = cpu + units.tasks * loop
    share = np.divide(cpu, seconds, out=np.zeros(run.n_tasks), where=seconds > 0)
    return simulate(run, workers, threads, seconds, gaps, latency, bandwidth,
                    sharing=machine.sharing(workers, share, gil, background,
                                            loop=units is None))


def _gaps_at(run: Run, gil: np.ndarray, cpu: np.ndarray, threads: int) -> Gaps:
    """The run's scheduling gaps on workers of ``threads`` threads.

    A worker's event loop, which reports a task's end and starts the next, waits
    for the GIL behind the threads that hold it: on one worker running the same
    pure-Python graph on 1, 2 and 8 threads the median round trip was 12, 25 and
    111 ms and the median dispatch 0.9, 2.0 and 10.8 ms.  The round trip and the
    dispatch scale with one plus the other threads, each counted for the share of
    the run's CPU seconds that holds the GIL.
    """
    held = float((gil * cpu).sum() / cpu.sum()) if cpu.sum() > 0 else 0.0
    factor = (1.0 + held * (threads - 1)) / (1.0 + held * (run.threads - 1))
    if factor == 1.0:
        return run.gaps
    return replace(run.gaps, local=run.gaps.local * factor, slot=run.gaps.slot * factor,
                   dispatch=run.gaps.dispatch * factor)


def _stragglers_at_median(run: Run) -> np.ndarray:
    """The compute seconds of the run's tasks, each straggler's its group's median."""
    found = _tasks_of(run)
    at = found.positions(run.state)
    straggler = found.stragglers(at=at) != ""
    return np.where(straggler, found.median_seconds[found.group[at]], run.duration)


def stragglers_in(run: Run) -> int:
    """How many of the run's tasks are stragglers."""
    return int((_tasks_of(run).stragglers() != "").sum())


def _tasks_of(run: Run) -> Tasks:
    """The tasks of the run's graph, with their groups' medians
    (:func:`~crux_dask.groups.tasks`): found once per run."""
    found = run.memo.get("tasks")
    if found is None:
        found = run.memo["tasks"] = tasks(run.store)
    return found


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
