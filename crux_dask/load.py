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
#: (``busy``) of its ``threads``, its host's ``cores`` and its ``gil``
#: contention (the share of time a thread waited for the GIL); NaN where not
#: measured.
LOAD_COLUMNS: dict[str, str] = {
    "process": "str", "time": "float64", "cpu": "float64", "lag": "float64",
    "busy": "float64", "threads": "float64", "cores": "float64", "gil": "float64",
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
            gil: float = _NAN) -> None:
        """Keep one sample (its fields those of :data:`LOAD_COLUMNS`)."""
        self._codes.append(self._processes.setdefault(process, len(self._processes)))
        self._numbers.extend((time, cpu, lag, busy, threads, cores, gil))
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

    by_process = {name: frame.sort_values("time") for name, frame in load.groupby("process")}
    rows = []
    for step in steps.itertuples(index=False):
        at = step.stop - step.cost + step.client
        for stage in ("report", "scheduler", "rescheduled", "dispatch", "worker"):
            seconds = getattr(step, stage)
            start, at = at, at + seconds
            if stage == "scheduler" and step.report + seconds == 0.0:
                at += step.scheduling  # the report and the decision, not told apart
            if seconds <= 0.0 or stage not in _STAGE_PROCESSES:
                continue
            for side in _STAGE_PROCESSES[stage]:
                process = _process(step, side)
                rows.append({"step": step.step, "stage": stage, "seconds": seconds,
                             "start": start, "stop": start + seconds, "process": process,
                             **_during(by_process, process, start, start + seconds)})
    columns = ["step", "stage", "seconds", "start", "stop", "process", "samples", "cpu",
               "lag", "busy", "threads", "cores", "host_busy", "gil"]
    return pd.DataFrame(rows, columns=columns)


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


def _process(step: tuple, side: str) -> str:
    """The process on ``side`` of ``step``: the scheduler, or a worker by address."""
    if side == SCHEDULER:
        return SCHEDULER
    location = getattr(step, side)
    return location.partition("@")[2] or location


def _during(by_process: dict[str, pd.DataFrame], process: str, start: float,
            stop: float) -> dict[str, float]:
    """The load of ``process`` from ``start`` to ``stop``: its samples then, else the
    nearest one; the tasks busy on its host summed over the host's workers."""
    samples = _samples(by_process.get(process), start, stop)
    if samples is None:
        return {"samples": 0, **dict.fromkeys(
            ("cpu", "lag", "busy", "threads", "cores", "host_busy", "gil"), _NAN)}
    host = _host(process)
    host_busy = sum(float(np.nanmean(found["busy"])) for name, frame in by_process.items()
                    if name != SCHEDULER and _host(name) == host
                    and (found := _samples(frame, start, stop)) is not None
                    and found["busy"].notna().any())
    return {"samples": len(samples), "cpu": _mean(samples["cpu"]),
            "lag": float(samples["lag"].max()), "busy": _mean(samples["busy"]),
            "threads": _mean(samples["threads"]), "cores": _mean(samples["cores"]),
            "host_busy": host_busy if process != SCHEDULER else _NAN,
            "gil": _mean(samples["gil"])}


def _samples(frame: pd.DataFrame | None, start: float, stop: float) -> pd.DataFrame | None:
    """The samples of ``frame`` (sorted by time) that measured ``start`` to ``stop``:
    those taken then, and the first one after (each measures the time since the one
    before it); the last one for a stage after them all; None if there is none."""
    if frame is None or not len(frame):
        return None
    times = frame["time"].to_numpy()
    lo = int(np.searchsorted(times, start, side="left"))
    hi = int(np.searchsorted(times, stop, side="right")) + 1
    lo = min(lo, len(times) - 1)
    return frame.iloc[lo:max(hi, lo + 1)]


def _host(process: str) -> str:
    """The host of a worker's address (``tcp://10.0.0.1:4000`` → ``10.0.0.1``)."""
    return process.rpartition("://")[2].rpartition(":")[0]


def _mean(values: pd.Series) -> float:
    return float(values.mean()) if values.notna().any() else _NAN
