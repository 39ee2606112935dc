"""The scheduler's sampler of the load of itself and of its workers, from distributed's
own measures.

Every worker's heartbeat carries its metrics (its system monitor's last reading
of its CPU and, where enabled, GIL contention, and the moment of that reading;
the mean interval of its event loop's ticks; the tasks it is executing); the
worker plugin adds its host's cores
(:data:`~crux_dask.plugins.protocol.CORES_METRIC`) and its process's CPU seconds
so far (:data:`~crux_dask.plugins.protocol.CPU_TIME_METRIC`).  The scheduler's own
CPU and GIL come from its system monitor, its CPU seconds from its process's
clock, the cores of its host from Dask's count, and its event loop's lag from
how late the sampler itself runs.  Each new heartbeat
becomes one sample of the :class:`~crux_dask.load.LoadLog`.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import Counter
from typing import TYPE_CHECKING

import dask
from dask.system import CPU_COUNT
from tornado.ioloop import PeriodicCallback

from crux_dask.load import SCHEDULER, LoadLog
from crux_dask.plugins.protocol import CORES_METRIC, CPU_TIME_METRIC

if TYPE_CHECKING:
    from distributed import Scheduler

__all__ = ["HEAR_TIMEOUT", "LOAD_INTERVAL", "LoadSampler"]

#: Seconds between two samples: as often as the workers of a small cluster send
#: their heartbeats.
LOAD_INTERVAL = 0.5
#: Seconds :meth:`LoadSampler.hear_workers` waits at most: a heartbeat of a small
#: cluster's worker comes every half second, of a large one's less often.
HEAR_TIMEOUT = 2.0
_NAN = float("nan")


class LoadSampler:
    """Sample the load of the scheduler and its workers every :data:`LOAD_INTERVAL`.

    Attributes
    ----------
    log : LoadLog
        The samples so far.
    """

    def __init__(self, scheduler: Scheduler, interval: float = LOAD_INTERVAL) -> None:
        self.scheduler = scheduler
        self.interval = interval
        self.log = LoadLog()
        self._tick = dask.utils.parse_timedelta(
            dask.config.get("distributed.admin.tick.interval"), "s")
        self._heard: dict[str, float] = {}  # worker -> its metrics' time last sampled
        self._due = time.time()
        #: What takes the samples, among the scheduler's periodic callbacks.
        self.callback = PeriodicCallback(self.sample, interval * 1000)
        self.sample()  # a run shorter than the interval still has its hosts' cores

    def sample(self) -> None:
        """Take a sample of the scheduler, and one of each worker heard from since."""
        now = time.time()
        lag = max(now - self._due, 0.0)
        self._due = now + self.interval
        recent = self.scheduler.monitor.recent()
        self.log.add(SCHEDULER, now, _share(recent.get("cpu")), lag, cores=float(CPU_COUNT),
                     gil=_number(recent.get("gil_contention")), cpu_time=time.process_time(),
                     measured=_number(recent.get("time")))
        self._sample_workers()

    async def hear_workers(self, since: float, timeout: float = HEAR_TIMEOUT) -> None:
        """Wait (at most ``timeout`` seconds) for a heartbeat of each worker after
        ``since`` that carries its process's CPU seconds, and sample the workers then:
        a run that started or ended at ``since`` has a sample of them on that side."""
        deadline = time.monotonic() + timeout
        workers = self.scheduler.workers
        while time.monotonic() < deadline and any(
                workers[address].last_seen <= since
                or CPU_TIME_METRIC not in workers[address].metrics
                for address in self._alone() if address in workers):
            await asyncio.sleep(0.01)
        self._sample_workers()

    def _alone(self) -> set[str]:
        """The workers whose process runs no other worker and not the scheduler (a
        cluster of threads shares one): the CPU seconds of its process are theirs."""
        pids = Counter(ws.pid for ws in self.scheduler.workers.values())
        pids[os.getpid()] += 1
        return {address for address, ws in self.scheduler.workers.items()
                if pids[ws.pid] == 1}

    def _sample_workers(self) -> None:
        """Take a sample of each worker heard from since its last one (its process's CPU
        seconds where they are its own)."""
        alone = self._alone()
        for address, ws in self.scheduler.workers.items():
            metrics = ws.metrics
            heard = metrics.get("time")
            if heard is None or self._heard.get(address) == heard:
                continue
            self._heard[address] = heard
            interval = _number(metrics.get("event_loop_interval"))
            counts = metrics.get("task_counts")  # of the states a task is in; none: 0
            # The monitor's reading is as old as its time: on the worker's clock, which the
            # heartbeat's delay (its latency and the clocks' offset) takes to the scheduler's.
            self.log.add(address, ws.last_seen, _share(metrics.get("cpu")),
                         max(interval - self._tick, 0.0) if interval == interval else _NAN,
                         _number(counts.get("executing", 0)) if isinstance(counts, dict)
                         else _NAN, float(ws.nthreads), _number(metrics.get(CORES_METRIC)),
                         _number(metrics.get("gil_contention")),
                         _number(metrics.get(CPU_TIME_METRIC)) if address in alone else _NAN,
                         _number(heard) + ws.time_delay)
        for address in set(self._heard) - set(self.scheduler.workers):
            del self._heard[address]


def _number(value: object) -> float:
    """A measure as a float: NaN if it is not a number."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return _NAN
    return number if math.isfinite(number) else _NAN


def _share(percent: object) -> float:
    """A CPU percentage (100: one core) as a share of one core."""
    return _number(percent) / 100
