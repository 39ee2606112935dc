"""The load of each process of a run, sampled, and the load each stage of a path ran under.

A stage of a step's scheduling (:data:`~crux_dask.costs.STAGES`) is long for a
reason the stage's own two moments do not tell: the process it ran in was
busy.  The scheduler samples, for itself and for every worker, what
distributed measures (:mod:`crux_dask.plugins.load`): the process's CPU, how
late its event loop ran, the tasks its threads were executing, its host's
cores, and the contention for the GIL where distributed measures it.
:func:`stage_loads` gives each stage of a path the samples of its process
during it.
"""

from __future__ import annotations

import math
from array import array
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LOAD_COLUMNS", "SCHEDULER", "LoadLog", "describe", "load_frame", "stage_loads"]

#: The columns of the load table, with their pandas dtypes: per sample, the
#: ``process`` (``scheduler`` or a worker's address), when it was taken (the
#: scheduler's clock), the process's ``cpu`` (1.0: one core busy), ``lag`` (how
#: late its event loop ran, in seconds), the tasks its threads were executing
#: (``busy``) of its ``threads``, its host's ``cores``, its ``gil``
#: contention (the share of time a thread waited for the GIL) and its
#: ``cpu_time``, the CPU seconds it has used since it started (all its threads),
#: and when distributed's system monitor ``measured`` its ``cpu`` and ``gil`` (the
#: scheduler's clock; a heartbeat carries the monitor's last reading, which a task
#: holding the GIL makes older than the heartbeat before); NaN where not measured.
LOAD_COLUMNS: dict[str, str] = {
    "process": "str", "time": "float64", "cpu": "float64", "lag": "float64",
    "busy": "float64", "threads": "float64", "cores": "float64", "gil": "float64",
    "cpu_time": "float64", "measured": "float64",
}
#: The process name of the scheduler in the load table.
SCHEDULER = "scheduler"
#: Samples kept, the newest (an hour of a scheduler and ten workers at 2 a second).
LOAD_MAX = 80_000
#: The processes each stage ran in: the worker of the step's first state (``source``),
#: the scheduler, the worker of the state the step made (``destination``).  A report
#: is a message from the first to the scheduler, a dispatch one from the scheduler
#: (after the rest of the transitions it made at once) to the second.
_STAGE_PROCESSES = {"report": ("source", SCHEDULER), "scheduler": (SCHEDULER,),
                    "dispatch": (SCHEDULER, "destination"), "worker": ("destination",)}
_NAN = float("nan")


#: The numbers of a sample, in order (every column but ``process``).
_NUMBERS = len(LOAD_COLUMNS) - 1


class LoadLog:
    """The load samples of a run, the newest :data:`LOAD_MAX` of them, in columns.

    Attributes
    ----------
    dropped : int
        Samples let go to keep the newest.
    """

    def __init__(self, most: int = LOAD_MAX) -> None:
        self.most = most
        self.dropped = 0
        self._processes: dict[str, int] = {}
        self._codes = array("i")
        self._numbers = array("d")  # _NUMBERS a sample

    def __len__(self) -> int:
        return len(self._codes)

    def add(self, process: str, time: float, cpu: float = _NAN, lag: float = _NAN,
            busy: float = _NAN, threads: float = _NAN, cores: float = _NAN,
            gil: float = _NAN, cpu_time: float = _NAN, measured: float = _NAN) -> None:
        """Keep one sample (its fields those of :data:`LOAD_COLUMNS`)."""
        self._codes.append(self._processes.setdefault(process, len(self._processes)))
        self._numbers.extend((time, cpu, lag, busy, threads, cores, gil, cpu_time,
                             measured))
        extra = len(self._codes) - self.most
        if extra >= max(self.most // 10, 1):  # let the oldest go, a tenth at a time
            del self._codes[:extra]
            del self._numbers[:extra * _NUMBERS]
            self.dropped += extra

    def columns(self) -> dict[str, Any]:
        """The samples as arrays, oldest first: what :func:`load_frame` reads (and what
        pickles in one copy)."""
        return {"processes": list(self._processes),
                "codes": np.array(self._codes, np.int32),
                "numbers": np.array(self._numbers).reshape(-1, _NUMBERS)}

    def frame(self) -> pd.DataFrame:
        """The samples as a table of :data:`LOAD_COLUMNS`, oldest first."""
        return load_frame(self.columns())


def load_frame(load: pd.DataFrame | dict[str, Any] | None) -> pd.DataFrame:
    """A load table of :data:`LOAD_COLUMNS`: ``load`` itself, the table of
    :meth:`LoadLog.columns`, or an empty one for None."""
    import pandas as pd

    if isinstance(load, pd.DataFrame):
        return load
    if load is None:
        return pd.DataFrame(columns=list(LOAD_COLUMNS)).astype(LOAD_COLUMNS)
    names = np.asarray(load["processes"] or [""], object)
    frame = pd.DataFrame(load["numbers"].reshape(-1, _NUMBERS), columns=list(LOAD_COLUMNS)[1:])
    frame.insert(0, "process", names[load["codes"]])
    return frame.astype(LOAD_COLUMNS)


def stage_loads(steps: pd.DataFrame, load: pd.DataFrame) -> pd.DataFrame:
    """Each stage of each step with the load of each process it ran in, during it.

    Each sample measures the time since the one before it: a stage gets the
    samples taken during it and the first one after it.  ``host_busy`` adds up
    the tasks executing on every worker of the process's host at that time:
    more than its ``cores`` is oversubscription.

    Parameters
    ----------
    steps : DataFrame
        A path's steps (:meth:`~crux_dask.path.CriticalPath.to_frame`).
    load : DataFrame
        The run's load table (:data:`LOAD_COLUMNS`).

    Returns
    -------
    DataFrame
        One row per stage longer than zero and process it ran in: ``step``,
        ``stage``, ``seconds``, ``start`` and ``stop``, the ``process``, and its
        ``samples`` during the
        stage, mean ``cpu``, largest ``lag``, mean ``busy``, ``threads``,
        ``cores``, ``host_busy`` and mean ``gil``; the load is NaN where no
        sample was taken.
    """
    import pandas as pd

    rows = _stage_rows(steps)
    n = len(rows["step"])
    found = {name: np.zeros(n) if name == "samples" else np.full(n, _NAN)
             for name in ("samples", *_MEASURES, "host_busy")}
    series = {name: _Series(frame) for name, frame in load.groupby("process")}
    processes = rows["process"]
    for process in set(processes.tolist()):
        at = np.flatnonzero(processes == process)
        sampled = series.get(process)
        if sampled is None:
            continue
        start, stop = rows["start"][at], rows["stop"][at]
        lo, hi = sampled.window(start, stop)
        found["samples"][at] = hi - lo
        for name in _MEASURES:
            found[name][at] = (sampled.largest(name, lo, hi) if name == "lag"
                               else sampled.mean(name, lo, hi))
        if process != SCHEDULER:
            found["host_busy"][at] = sum(
                np.nan_to_num(other.mean("busy", *other.window(start, stop)))
                for name, other in series.items()
                if name != SCHEDULER and _host(name) == _host(process))
    frame = pd.DataFrame({**rows, **found})
    return frame.astype({"samples": "int64"})[[
        "step", "stage", "seconds", "start", "stop", "process", "samples", "cpu", "lag",
        "busy", "threads", "cores", "host_busy", "gil"]]


def describe(row: pd.Series | dict) -> str:
    """One line of a stage's load, e.g. ``worker 62 %: its event loop lagged 40 ms;
    4 busy threads on 2 cores``."""
    if not row["samples"]:
        return f"{row['stage']}: no load sampled"
    said = [f"{row['stage']} {row['seconds']:.3f} s in {row['process']}"]
    if not math.isnan(row["cpu"]):
        said.append(f"CPU {row['cpu']:.0%}")
    if not math.isnan(row["lag"]):
        said.append(f"its event loop lagged {row['lag'] * 1e3:.0f} ms")
    if not math.isnan(row["host_busy"]) and not math.isnan(row["cores"]):
        said.append(f"{row['host_busy']:.0f} busy threads on its host's "
                    f"{row['cores']:.0f} cores")
    if not math.isnan(row["gil"]):
        said.append(f"GIL contention {row['gil']:.0%}")
    return "; ".join(said)


#: The measures of a sample averaged over a stage (its lag: the largest).
_MEASURES = ("cpu", "lag", "busy", "threads", "cores", "gil")


def _stage_rows(steps: pd.DataFrame) -> dict[str, np.ndarray]:
    """One row per stage of a step longer than zero and process it ran in, in the order
    of the steps, their stages and the processes of each: ``step``, ``stage``,
    ``seconds``, ``start``, ``stop`` and ``process``."""
    at = (steps["stop"] - steps["cost"] + steps["client"]).to_numpy()
    processes = {SCHEDULER: np.full(len(steps), SCHEDULER, object),
                 **{side: np.array([location.partition("@")[2] or location
                                    for location in steps[side]], object)
                    for side in ("source", "destination")}}
    parts: list[dict[str, np.ndarray]] = []
    for order, stage in enumerate(("report", "scheduler", "rescheduled", "dispatch",
                                   "worker")):
        seconds = steps[stage].to_numpy()
        start, at = at, at + seconds
        if stage == "scheduler":  # the report and the decision, not told apart
            at = at + np.where(steps["report"].to_numpy() + seconds == 0.0,
                               steps["scheduling"].to_numpy(), 0.0)
        taken = seconds > 0.0
        for side, where in enumerate(_STAGE_PROCESSES.get(stage, ())):
            parts.append({"step": steps["step"].to_numpy()[taken],
                          "order": np.full(taken.sum(), 2 * order + side),
                          "stage": np.full(taken.sum(), stage, object),
                          "seconds": seconds[taken], "start": start[taken],
                          "stop": start[taken] + seconds[taken],
                          "process": processes[where][taken]})
    rows = {name: np.concatenate([part[name] for part in parts]) if parts
            else np.zeros(0, object if name in ("stage", "process") else float)
            for name in ("step", "order", "stage", "seconds", "start", "stop", "process")}
    order = np.lexsort((rows.pop("order"), rows["step"]))
    return {name: values[order] for name, values in rows.items()}


class _Series:
    """The samples of one process, sorted by time, with running sums to average any
    run of them at once."""

    def __init__(self, frame: pd.DataFrame) -> None:
        frame = frame.sort_values("time", kind="stable")
        self.times = frame["time"].to_numpy()
        self.values = {name: frame[name].to_numpy(float) for name in _MEASURES}
        self.sums = {name: np.concatenate([[0.0], np.cumsum(np.nan_to_num(v))])
                     for name, v in self.values.items()}
        self.counts = {name: np.concatenate([[0], np.cumsum(~np.isnan(v))])
                       for name, v in self.values.items()}

    def window(self, start: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The samples that measured each ``start`` to ``stop``: those taken then, and
        the first one after (each measures the time since the one before it); the
        last one for a stage after them all.  As ranges ``lo`` to ``hi``."""
        last = len(self.times) - 1
        lo = np.minimum(np.searchsorted(self.times, start, side="left"), last)
        hi = np.searchsorted(self.times, stop, side="right") + 1
        return lo, np.minimum(np.maximum(hi, lo + 1), last + 1)

    def mean(self, name: str, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The mean of measure ``name`` over each range (NaN where never measured)."""
        counts = self.counts[name][hi] - self.counts[name][lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, (self.sums[name][hi] - self.sums[name][lo])
                            / np.maximum(counts, 1), _NAN)

    def largest(self, name: str, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The largest of measure ``name`` over each range (NaN where never measured)."""
        values = np.append(self.values[name], _NAN)
        ranges = np.empty(2 * len(lo), np.int64)
        ranges[0::2], ranges[1::2] = lo, hi
        return np.fmax.reduceat(values, ranges)[0::2] if len(lo) else np.zeros(0)


def _host(process: str) -> str:
    """The host of a worker's address (``tcp://10.0.0.1:4000`` → ``10.0.0.1``)."""
    return process.rpartition("://")[2].rpartition(":")[0]
