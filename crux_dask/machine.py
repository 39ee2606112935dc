"""The machine of a recorded run: its hosts' cores, the work besides, each label's GIL share.

What the what-if's sharing of cores and GIL (:mod:`crux_dask.sharing`) needs,
as the run tells it:

* **CPU seconds**: each task's, from its thread's CPU clock (``cpu`` of the
  moments), and its wait for a core (``cpu_wait``); a task without them
  (recorded before they were) competes for nothing, as in a replay that
  ignores the machine.
* **Cores**: as Dask counts them on each worker's host (``cores`` of the
  load: the process's CPU affinity and cgroup quota, not only the host's
  processors; on a run on one host whose workers sent no heartbeat since
  Crux started, the scheduler's count).  The work besides the tasks is what
  the load measures: the scheduler's process on a run on one host, per task
  of the run (:func:`scheduler_seconds`), and each worker's process besides
  its tasks' threads, per task it ran (its *loop*: its event loop's messages,
  transfers and a shuffle's comms, :func:`loop_seconds`); what each process
  uses at rest (heartbeats, monitors), or where its CPU seconds were not
  sampled its mean CPU besides its tasks, is in its host's *background*: a
  run of another length spends it per second, not per task.  A task's wait
  for a core is taken out of its seconds as far as that work and the tasks
  running with it explain it (:func:`core_waits`); the rest (a program the
  load does not see, a burst) stays in them.
* **The GIL**: the share of each label's CPU time that holds it, as far as
  the run tells it (:mod:`crux_dask.gil`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from crux_dask.gil import gil_held, gil_most, gil_shares
from crux_dask.load import SCHEDULER
from crux_dask.sharing import Sharing, recorded, task_cpu

if TYPE_CHECKING:
    import pandas as pd

    from crux_dask.runs import Run

__all__ = ["Besides", "Machine", "core_waits", "loop_seconds", "machine_of", "scheduler_seconds"]

#: CPU seconds below which a task's wait for a core says nothing of its host.
WAIT_CPU = 0.001


class Besides(NamedTuple):
    """A process's CPU besides its tasks' threads, split in two by the samples of it taken
    while none of its tasks began or ended (NaN: not measured).

    Attributes
    ----------
    per_task : float
        CPU seconds per task: its event loop receiving, reporting and sending for each.
    rest : float
        Cores it used at rest, whatever ran: its heartbeats, its monitors, a client's
        wait in its process.  A run of another length spends as much per second.
    """

    per_task: float
    rest: float


@dataclass
class Machine:
    """The hosts of a run's workers, their cores, and the GIL share of each label.

    Attributes
    ----------
    host : list of int
        The host of each recorded worker (index into ``cores``).
    cores : list of float
        Cores of each host (``inf``: not known, no limit).
    background : list of float
        Cores each host spends on other work than the tasks, the workers' loops and
        the scheduler's work per task, and the workers' at rest: the scheduler's at
        rest on a run on one host, and a process's besides its tasks where that was
        not measured, at its mean over the run.
    gil : numpy.ndarray
        Per label code: the share of its tasks' CPU time that holds the GIL
        (NaN: the run has no evidence).
    gil_most : numpy.ndarray
        Per label code: the most that share can be (:func:`gil_most`).
    loop : list of float
        Per recorded worker: the CPU seconds its process spent besides its
        tasks' threads, per task (:func:`loop_seconds`; none: not measured).
    rest : list of float
        Per recorded worker: the cores its process used at rest (0: not measured,
        its mean CPU besides its tasks is in its host's background).
    scheduler : float
        On a run on one host, the scheduler's CPU seconds per task
        (:func:`scheduler_seconds`; 0: not measured, its mean CPU is in the
        host's background).
    """

    host: list[int]
    cores: list[float]
    background: list[float]
    gil: np.ndarray
    gil_most: np.ndarray
    loop: list[float] = field(default_factory=list)
    rest: list[float] = field(default_factory=list)
    scheduler: float = 0.0

    def sharing(self, workers: int, density: np.ndarray, gil: np.ndarray,
                background: list[float], loop: bool = True) -> Sharing | None:
        """What ``workers`` workers share, running tasks of these densities and GIL shares,
        with the ``background`` of each host and, with ``loop``, each worker's loop and
        the scheduler's work after each task; None where no task uses the CPU (a run
        recorded without CPU seconds): tasks then compete for nothing.

        The recorded workers stay on their hosts; workers added join the
        host of a run on one host (a local cluster grows on its machine),
        else each comes on a new host like the first one; an added worker's
        loop is the mean of the recorded workers'.  The scheduler stays on
        the first host.
        """
        if not density.any():
            return None
        hosts, cores, background = list(self.host[:workers]), list(self.cores), list(
            background)
        while len(hosts) < workers:
            if len(set(self.host)) == 1:
                hosts.append(self.host[0])
            else:
                cores.append(cores[self.host[0]])
                background.append(0.0)
                hosts.append(len(cores) - 1)
        for h, rest in zip(hosts, _each(self.rest, workers)):
            background[h] += rest
        seconds = _each(self.loop, workers) if loop else []
        return Sharing(hosts, cores, background, density.tolist(), gil.tolist(), seconds,
                       self.scheduler if loop else 0.0)

    def scheduler_cores(self, run: Run) -> float:
        """The cores the scheduler's work per task took, on average, over ``run``."""
        return self.scheduler * run.n_tasks / max(run.makespan, WAIT_CPU)

    @property
    def mean_loop(self) -> float:
        """The mean of the workers' loop seconds after a task (0 without them)."""
        return sum(self.loop) / len(self.loop) if self.loop else 0.0

    def host_rest(self, h: int) -> float:
        """The cores host ``h``'s recorded workers used at rest."""
        return sum(rest for rest, on in zip(self.rest, self.host) if on == h)


def _each(values: list[float], workers: int) -> list[float]:
    """``values`` of the recorded workers for ``workers`` workers: the first ones, and
    their mean for each added (none without values)."""
    if not values:
        return []
    return values[:workers] + [sum(values) / len(values)] * (workers - len(values))


def machine_of(run: Run, load: pd.DataFrame | None) -> Machine:
    """The machine of ``run`` as its ``load`` (:data:`~crux_dask.load.LOAD_COLUMNS`) tells
    it: no limit on cores and no evidence of the GIL without one."""
    names = [_host(worker) for worker in run.workers]
    hosts = list(dict.fromkeys(names))
    host = [hosts.index(name) for name in names]
    cores = [math.inf] * len(hosts)
    background = [0.0] * len(hosts)
    n_labels = len(run.store.labels)
    most = gil_most(run, n_labels)
    if load is None or not len(load):
        return Machine(host, cores, background, np.full(n_labels, np.nan), most)
    during = _during(load, run.origin, run.origin + run.makespan)
    for worker, h in zip(run.workers, host):
        counted = load.loc[load["process"] == worker, "cores"].dropna()
        if len(counted):
            cores[h] = float(counted.max())
    if len(hosts) == 1 and math.isinf(cores[0]):  # a local cluster, no heartbeat since
        counted = load.loc[load["process"] == SCHEDULER, "cores"].dropna()  # Crux's start
        if len(counted):
            cores[0] = float(counted.max())
    scheduler = 0.0
    if len(hosts) == 1:  # a local cluster: the scheduler's process shares the host
        measured = scheduler_seconds(run, load)
        if math.isnan(measured.per_task):  # not measured: its mean CPU
            background[0] = _mean_cpu(during, SCHEDULER)
        else:
            scheduler, background[0] = measured
    loop, rest = [], []
    cpu = task_cpu(run)
    for w, (worker, measured) in enumerate(zip(run.workers, loop_seconds(run, load))):
        if math.isnan(measured.per_task):  # not measured: its mean CPU besides its tasks
            tasks = float(cpu[run.worker == w].sum()) / max(run.makespan, WAIT_CPU)
            background[host[w]] += max(_mean_cpu(during, worker) - tasks, 0.0)
            measured = Besides(0.0, 0.0)
        loop.append(measured.per_task)
        rest.append(measured.rest)
    machine = Machine(host, cores, background, gil_shares(run, during, n_labels), most,
                      loop, rest, scheduler)
    held = gil_held(run, host, cores, core_waits(run, machine), n_labels)
    machine.gil = np.where(np.isnan(machine.gil) & held, most, machine.gil)
    return machine


def loop_seconds(run: Run, load: pd.DataFrame) -> list[Besides]:
    """Each worker's CPU besides its tasks' threads: what its event loop did for each of
    its tasks (received it, reported it, sent and fetched data, a shuffle's comms), and
    at rest.

    Between the two samples of the worker's CPU seconds (``cpu_time``) that
    bracket its tasks (the last before its first began and the first after its
    last ended, or the nearest there are), its process used their difference,
    and its tasks' threads their CPU seconds inside.  Of the rest, the
    intervals between samples in which none of its tasks began or ended give
    its use at rest (their median cores; none without such an interval), and
    the tasks that ended between the two share what is left.  NaN without two
    such samples: a load recorded before ``cpu_time`` was, or a worker that
    shares its process with others (a cluster of threads), whose CPU seconds
    are not its own.
    """
    begin, end, _ = recorded(run)
    cpu = task_cpu(run)
    return [_besides(load, worker, begin, end, cpu, np.flatnonzero(run.worker == w),
                     run.origin) for w, worker in enumerate(run.workers)]


def scheduler_seconds(run: Run, load: pd.DataFrame) -> Besides:
    """The scheduler's CPU seconds per task of the run, and at rest (its process's, as
    :func:`loop_seconds` measures a worker's over all the run's tasks, none of them
    its own): it hears each task's end, sends the tasks it freed and answers the
    client.  NaN where its CPU seconds were not sampled."""
    begin, end, _ = recorded(run)
    return _besides(load, SCHEDULER, begin, end, np.zeros(run.n_tasks),
                    np.arange(run.n_tasks), run.origin)


def _besides(load: pd.DataFrame, process: str, begin: np.ndarray, end: np.ndarray,
             cpu: np.ndarray, mine: np.ndarray, origin: float) -> Besides:
    """``process``'s CPU besides the CPU seconds ``cpu`` of its tasks ``mine`` (of runs from
    ``begin`` to ``end``, seconds from ``origin``), per task of them that ended between
    the two samples bracketing them and at rest (NaN without two)."""
    if not len(mine) or "cpu_time" not in load:
        return Besides(math.nan, math.nan)
    samples = load[(load["process"] == process) & load["cpu_time"].notna()]
    at = samples["time"].to_numpy() - origin
    since, until = begin[mine].min(), end[mine].max()
    first = max(int(np.searchsorted(at, since, side="right")) - 1, 0)
    last = min(int(np.searchsorted(at, until)), len(at) - 1)
    ended = (end[mine] > at[first]) & (end[mine] <= at[last]) if last > first else False
    if not np.any(ended):
        return Besides(math.nan, math.nan)
    at, used = at[first:last + 1], samples["cpu_time"].to_numpy()[first:last + 1]
    wall = end[mine] - begin[mine]  # each task's CPU seconds spread evenly over its run
    rate = np.divide(cpu[mine], wall, out=np.zeros_like(wall), where=wall > 0)
    besides = np.diff(used) - np.diff(_integral(begin[mine], end[mine], rate, at))
    moved = np.searchsorted(at, np.concatenate([begin[mine], end[mine]]), side="left")
    quiet = np.ones(len(at) - 1, bool)
    quiet[np.clip(moved - 1, 0, len(quiet) - 1)] = False
    rest = (float(np.median(np.clip(besides[quiet] / np.diff(at)[quiet], 0.0, None)))
            if quiet.any() else 0.0)
    left = float(besides.sum()) - rest * float(at[-1] - at[0])
    return Besides(max(left, 0.0) / int(ended.sum()), rest)


def core_waits(run: Run, machine: Machine) -> np.ndarray:
    """Each task's wait for a core as far as its host's cores explain it: the tasks
    running with it wanted, over their runs, their CPU seconds and waits, and the
    host's other work its background; where together they asked for more than its
    cores, each had its share of them, and waited the rest.  What its thread's
    clock measured beyond that stays in its seconds."""
    begin, end, _ = recorded(run)
    cpu = task_cpu(run)
    waited = np.nan_to_num(run.store.column("state_cpu_wait", run.state), nan=0.0)
    host = np.asarray(machine.host)[run.worker]
    explained = np.zeros(run.n_tasks)
    for h, cores in enumerate(machine.cores):
        mine = np.flatnonzero(host == h)
        if not math.isfinite(cores) or not len(mine):
            continue
        wanted = (cpu[mine] + waited[mine]) / np.maximum(end[mine] - begin[mine], WAIT_CPU)
        loops = sum(seconds * float(np.sum(run.worker == w))
                    for w, seconds in enumerate(machine.loop) if machine.host[w] == h)
        asked = (_demand(begin[mine], end[mine], wanted) + machine.background[h]
                 + machine.host_rest(h)
                 + loops / max(run.makespan, WAIT_CPU)
                 + (machine.scheduler_cores(run) if h == 0 else 0.0))
        explained[mine] = np.minimum(waited[mine],
                                     cpu[mine] * np.maximum(asked / cores - 1.0, 0.0))
    return explained


def _demand(begin: np.ndarray, end: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The mean, over each task's run, of the cores the tasks running then wanted."""
    spent = _integral(begin, end, wanted, np.concatenate([begin, end]))
    return np.divide(spent[len(begin):] - spent[:len(begin)], end - begin,
                     out=wanted.copy(), where=end > begin)


def _integral(begin: np.ndarray, end: np.ndarray, rate: np.ndarray,
              at: np.ndarray) -> np.ndarray:
    """The sum of the ``rate`` of runs from ``begin`` to ``end`` over time, up to each
    moment of ``at``: from each moment a run begins or ends to the next, the rates of
    the runs begun less those ended."""
    moments = np.unique(np.concatenate([begin, end]))
    first, last = np.searchsorted(moments, begin), np.searchsorted(moments, end)
    step = np.bincount(first, rate, len(moments)) - np.bincount(last, rate, len(moments))
    area = np.concatenate([[0.0], np.cumsum(np.cumsum(step)[:-1] * np.diff(moments))])
    return np.interp(at, moments, area)


def _during(load: pd.DataFrame, begin: float, end: float) -> pd.DataFrame:
    """The samples of each process that measured the time from ``begin`` to ``end``: those
    taken then, and its first one after (each measures the time since the one before:
    a run shorter than the interval between two has no other)."""
    after = load[load["time"] > end].groupby("process")["time"].min()
    last = load["process"].map(after).fillna(end)
    return load[(load["time"] >= begin) & (load["time"] <= last)]


def _mean_cpu(load: pd.DataFrame, process: str) -> float:
    """The mean cores ``process`` used over these load samples (0 without any)."""
    used = load.loc[load["process"] == process, "cpu"].dropna()
    return float(used.mean()) if len(used) else 0.0


def _host(address: str) -> str:
    """The host of a worker's address (``tcp://10.0.0.1:4000`` -> ``10.0.0.1``)."""
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest
