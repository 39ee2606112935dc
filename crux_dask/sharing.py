"""How tasks running at once share the machine: the cores of a host, the GIL of a worker.

A task needs, per second of its run alone on an idle machine (its *solo*
seconds), ``density`` seconds of CPU (its CPU seconds over its solo seconds:
a pure-Python loop 1, a sleep 0), and holds the GIL for a share ``gil`` of
that CPU time (pure Python 1, a BLAS call or a read that releases it 0).
Tasks running at once share what they need, as fluids do:

* the threads of one host share its cores, less what other work on the
  host uses (its *background*), evenly among those that ask;
* the tasks of one worker process share its GIL, fairly: CPython hands it on
  every switch interval to a thread that waits for it (:func:`unit_times`);
* after each task, its worker's event loop works for it (reports it, sends
  its data, a shuffle's shards) for the worker's *loop* seconds, on a core and
  holding the GIL, beside the tasks still running there; and the scheduler
  works for it (hears its end, sends the tasks it freed) for its seconds a
  task, on a core of its host and holding its own process's GIL: one task's
  work at a time, however many workers end tasks at once.

:class:`Sharing` plays that forward for the what-if replay.  Recorded
seconds are stretched by the cores and the GIL the recorded tasks waited
for; :func:`solo_seconds` takes the waits out before a replay puts changed
ones in: the wait for a core as each task's thread clock measured it, the
wait for the GIL from the share of the time the others held it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from crux_dask.runs import Run

__all__ = ["LOOP_GIL", "Sharing", "intervals", "recorded", "solo_seconds", "task_cpu",
           "unit_times"]

#: The share of a worker's event loop's CPU seconds that holds the GIL: all of it (its
#: work is Python's: messages, pickling, a shuffle's bookkeeping).
LOOP_GIL = 1.0
#: What plans a task's end: ``push(time, task, worker)``.
Push = Callable[[float, int, int], None]


def unit_times(running: dict[int, int], density: list[float], gil: list[float],
               cores: float, background: float = 0.0) -> dict[int, float]:
    """The seconds a second of solo progress takes for each task ``running`` (task ->
    worker) on one host of ``cores`` cores, ``background`` of them busy with other work.

    The tasks share each worker's GIL fairly (:func:`_gil_shared`), and the
    cores, evenly, as far as what they would use were cores no limit asks
    for more than there are.
    """
    workers: dict[int, list[int]] = {}
    for i, w in running.items():
        workers.setdefault(w, []).append(i)
    times: dict[int, float] = {}
    for tasks in workers.values():
        times.update(_gil_shared(tasks, density, gil, 1.0))
    asked = background
    for i, unit in times.items():
        asked += density[i] / unit
    if asked > cores:
        for tasks in workers.values():
            times.update(_gil_shared(tasks, density, gil, asked / cores))
    return times


def _gil_shared(tasks: list[int], density: list[float], gil: list[float], over: float
                ) -> dict[int, float]:
    """The seconds a second of solo progress takes for each of one worker's ``tasks``,
    their CPU stretched by ``over``.

    A task's second is ``rest`` seconds without the GIL and ``locked`` with
    it: alone, it asks for the GIL ``locked / (rest + locked)`` of the time.
    CPython hands the GIL on every switch interval to a thread that waits for
    it, so the tasks share it fairly: where they ask for more than all of it,
    those that ask for most get an even share of what the others leave, and
    a second of theirs takes ``locked / share``.
    """
    times: dict[int, float] = {}
    holders: list[tuple[int, float, float]] = []  # task, locked, its ask
    asked = 0.0
    for i in tasks:
        d = density[i]
        locked = d * over * gil[i]
        times[i] = whole = 1.0 - d + d * over  # rest + locked
        if locked > 0.0:
            holders.append((i, locked, locked / whole))
            asked += locked / whole
    if asked <= 1.0:  # each has the GIL whenever it asks
        return times
    for (i, locked, _), share in zip(holders, _fair([ask for _, _, ask in holders])):
        times[i] = max(times[i], locked / share)
    return times


def _fair(asks: list[float]) -> list[float]:
    """Max-min fair shares of one unit among these asks (each gets at most its ask)."""
    if sum(asks) <= 1.0:
        return list(asks)
    left, open_ = 1.0, sorted(range(len(asks)), key=asks.__getitem__)
    shares = [0.0] * len(asks)
    while open_:
        level = left / len(open_)
        i = open_[0]
        if asks[i] <= level:
            shares[i] = asks[i]
            left -= asks[i]
            open_.pop(0)
        else:
            for i in open_:
                shares[i] = level
            break
    return shares


class Sharing:
    """The tasks running on each host, and how fast each progresses (for the replay).

    A task joins when it starts, with its solo seconds left to run, and
    leaves when they are done; at each change on a host, every task running
    there is advanced at its old rate and given its new one, and its new end
    is pushed where it moved (older ends are stale: :meth:`due`).

    A host is *unhurried* while its tasks ask for no more than its cores and
    each worker's for no more than its GIL: each then runs at its solo speed,
    and a task that joins or leaves changes no other's, which is known here
    without sharing the host out again.

    The work after task ``i`` of the ``n`` tasks (:meth:`after`) runs as task
    ``n + i`` (its worker's loop's) and ``2 n + i`` (the scheduler's, as one
    more worker on the first host): on the CPU throughout, holding the GIL
    (:data:`LOOP_GIL`).
    """

    def __init__(self, host_of: list[int], cores: list[float], background: list[float],
                 density: list[float], gil: list[float], loop: list[float] | None = None,
                 scheduler: float = 0.0) -> None:
        #: Per worker: its loop's seconds after a task (None: no loop work).
        self.loop = loop if loop and any(loop) else None
        #: The scheduler's seconds after a task (0: none), and the worker it runs as.
        self.scheduler, self.scheduler_worker = scheduler, len(host_of)
        self.n = len(density)
        #: Whether any work follows a task's end (:meth:`after`).
        self.busy_after = self.loop is not None or scheduler > 0.0
        if self.busy_after:
            density = density + [1.0] * 2 * self.n
            gil = gil + [LOOP_GIL] * 2 * self.n
            host_of = [*host_of, 0]
        self.host_of, self.cores, self.background = host_of, cores, background
        self.density, self.gil = density, gil
        #: The worker of each piece of work after a task that is running.
        self.pieces: dict[int, int] = {}
        hosts = len(cores)
        self.running: list[dict[int, int]] = [{} for _ in range(hosts)]  # task -> worker
        self.left: dict[int, float] = {}
        self.rate: dict[int, float] = {}
        self.ends: dict[int, float] = {}
        self.since = [0.0] * hosts
        # The CPU the tasks of each host ask for, and the GIL those of each worker do,
        # alone; whether each host's tasks all run at their solo speed.
        self.used = [0.0] * hosts
        self.locked = [0.0] * len(host_of)
        self.workers_of: list[list[int]] = [[] for _ in range(hosts)]
        for w, h in enumerate(host_of):
            self.workers_of[h].append(w)
        self.unhurried = [True] * hosts

    def join(self, t: float, task: int, worker: int, seconds: float, push: Push) -> None:
        """``task`` starts on ``worker`` at ``t`` with ``seconds`` of solo progress."""
        h = self.host_of[worker]
        self._advance(h, t)
        self.running[h][task] = worker
        self.left[task] = seconds
        density = self.density[task]
        self.used[h] += density
        self.locked[worker] += density * self.gil[task]
        if self.unhurried[h] and self.locked[worker] <= 1.0 and (
                self.used[h] + self.background[h] <= self.cores[h]):
            self.rate[task] = 1.0
            end = self.ends[task] = t + seconds
            push(end, task, worker)
        else:
            self._rates(h, t, push)

    def leave(self, t: float, task: int, worker: int, push: Push) -> None:
        """``task`` ended at ``t``."""
        h = self.host_of[worker]
        self._advance(h, t)
        running = self.running[h]
        del running[task], self.left[task], self.rate[task], self.ends[task]
        if not running:  # the sums start again from nothing, without rounding left over
            self.used[h] = 0.0
            for w in self.workers_of[h]:
                self.locked[w] = 0.0
            self.unhurried[h] = True
            return
        density = self.density[task]
        self.used[h] -= density
        self.locked[worker] -= density * self.gil[task]
        if not self.unhurried[h]:  # with less asked, every task still at solo speed
            self._rates(h, t, push)

    def after(self, t: float, task: int, worker: int, push: Push) -> None:
        """``task`` ended at ``t`` on ``worker``, whose loop and the scheduler now work
        for it."""
        seconds = self.loop[worker] if self.loop is not None else 0.0
        if seconds > 0.0:
            self.pieces[self.n + task] = worker
            self.join(t, self.n + task, worker, seconds, push)
        if self.scheduler > 0.0:
            self.pieces[2 * self.n + task] = self.scheduler_worker
            self.join(t, 2 * self.n + task, self.scheduler_worker, self.scheduler, push)

    def done(self, t: float, piece: int, push: Push) -> None:
        """The work after a task, ``piece`` (:meth:`after`), ended at ``t`` if planned so."""
        if self.due(piece, t):
            self.leave(t, piece, self.pieces.pop(piece), push)

    def due(self, task: int, t: float) -> bool:
        """Whether ``t`` is ``task``'s end as last planned (not a stale one)."""
        return self.ends.get(task) == t

    def _advance(self, h: int, t: float) -> None:
        dt = t - self.since[h]
        for task in self.running[h]:
            self.left[task] -= self.rate[task] * dt
        self.since[h] = t

    def _rates(self, h: int, t: float, push: Push) -> None:
        """Give each task running on host ``h`` its rate from ``t``, and push its end
        where it moved (an end that did not is still to come)."""
        running, rates, left, ends = self.running[h], self.rate, self.left, self.ends
        unhurried = True
        for task, unit in unit_times(running, self.density, self.gil, self.cores[h],
                                     self.background[h]).items():
            rate = rates[task] = 1.0 / unit
            unhurried = unhurried and rate == 1.0
            end = t + max(left[task], 0.0) / rate
            if ends.get(task) != end:
                ends[task] = end
                push(end, task, running[task])
        self.unhurried[h] = unhurried


def solo_seconds(run: Run, gil: np.ndarray, cores_waited: np.ndarray,
                 loop: list[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each task's solo seconds and density: its recorded run, less the time it waited
    for a core and for the GIL.

    A task waits for the GIL while the other tasks of its worker hold it: each
    of them, over its run, held it at its recorded density times its GIL
    share, and at most one holds it at a time; and while its worker's event
    loop works after each of the others that ended during its run, for the
    worker's ``loop`` seconds (:data:`LOOP_GIL`).  Of the run off the CPU of a
    task that uses the CPU, and not waiting for a core the machine explains,
    the seconds the others held the GIL are a wait for it, whatever its own
    share: a thread that lets go of the GIL, for a call into C or a read, waits
    for it again behind the holder's switch interval: the 31 ``getitem`` tasks
    of TPC-H Q1 took 0.08 s on one thread, and 0.28 s, 0.10 s of it on the
    CPU, on two beside an ``astype`` that held the GIL.  A task without CPU
    seconds (a sleep) waits for nothing.  A wait on the run queue that the
    cores do not explain counts as off the CPU: a thread the GIL is handed to
    wakes and waits its turn for a core (eight pure-Python threads of one worker on two
    idle cores waited 0.47 s so, of 1.4 s of CPU).  The rest of the run off
    the CPU (a read, a sleep) stays.

    Parameters
    ----------
    gil : numpy.ndarray
        The GIL share of each task: of its CPU time, how much it held the GIL
        (which the others waited for).
    cores_waited : numpy.ndarray
        The seconds each task waited for a core, of those its thread's clock
        measured, that the replay's sharing of cores plays again.
    loop : list of float, optional
        Per recorded worker, its loop's seconds after a task.
    """
    begin, end, density = recorded(run)
    cpu = task_cpu(run)
    wall = run.duration
    waited = np.minimum(np.nan_to_num(run.store.column("state_cpu_wait", run.state),
                                      nan=0.0), wall)
    holding = density * gil
    held = np.zeros(run.n_tasks)  # seconds of each task's run the others held the GIL
    for w in np.unique(run.worker).tolist():
        mine = np.flatnonzero(run.worker == w)
        for since, until, running in intervals(begin[mine], end[mine]):
            if len(running) > 1:
                tasks = mine[running]
                others = holding[tasks].sum() - holding[tasks]
                held[tasks] += (until - since) * np.minimum(others, 1.0)
        if loop and loop[w] > 0.0:
            held[mine] += _overlaps(begin[mine], end[mine], loop[w]) * LOOP_GIL
    # Off the CPU and not waiting for a core the machine explains: a wait on the run
    # queue that the cores do not explain follows the GIL's handing over as often.
    explained = np.minimum(cores_waited, waited)
    off = np.maximum(wall - explained - cpu, 0.0)
    solo = np.maximum(wall - explained - (cpu > 0) * np.minimum(off, held),
                      np.minimum(cpu, wall))
    found = np.divide(cpu, solo, out=np.zeros(run.n_tasks), where=solo > 0).clip(0.0, 1.0)
    return solo, found


def _overlaps(begin: np.ndarray, end: np.ndarray, seconds: float) -> np.ndarray:
    """Of each run from ``begin`` to ``end``, the seconds it shares with the ``seconds``
    after each run's end: for an end before the run's, up to ``seconds`` after it, and
    none for its own."""
    ends = np.sort(end)
    total = np.concatenate([[0.0], np.cumsum(ends)])

    def between(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """How many ends lie in ``(lo, hi]``, and their sum."""
        a, b = np.searchsorted(ends, lo, side="right"), np.searchsorted(ends, hi, side="right")
        b = np.maximum(a, b)
        return b - a, total[b] - total[a]

    late = np.maximum(end - seconds, begin)  # ends from here on overlap it to its end
    whole, _ = between(begin, late)
    before, before_sum = between(begin - seconds, begin)
    after, after_sum = between(late, end)
    return (whole * seconds + before_sum + before * (seconds - begin)
            + after * end - after_sum)


def intervals(begin: np.ndarray, end: np.ndarray) -> Iterator[tuple[float, float, list[int]]]:
    """Each interval between two moments of these runs in which some ran: ``(since,
    until, the runs then)``; a run that ends as another starts is not with it, and a run
    of no time is with none."""
    n = len(begin)
    moments = np.concatenate([begin, end])
    running: dict[int, None] = {}
    lasting = (end > begin).tolist()
    last = 0.0
    for at in np.lexsort((np.r_[np.ones(n), np.zeros(n)], moments)).tolist():
        t = float(moments[at])
        if running and t > last:
            yield last, t, list(running)
        last = t
        if at < n:
            if lasting[at]:  # else its end came first, and it would stay
                running[at] = None
        else:
            running.pop(at - n, None)


def recorded(run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each task's recorded start and stop (seconds from the root) and density."""
    store = run.store
    end = store.column("state_time", run.state) - run.origin
    begin = end - run.duration
    wall = run.duration
    density = np.where(wall > 0, np.minimum(task_cpu(run) / np.maximum(wall, 1e-12), 1.0), 0.0)
    return begin, end, density


def task_cpu(run: Run) -> np.ndarray:
    """Each task's CPU seconds; where not known, the median of its label's known tasks'
    (at most its run), or, for a label with none, its run at the share of all the
    known tasks' runs that was on the CPU (0 in a run recorded without them: it
    competes for nothing).

    A worker does not know a task's seconds where its thread may have run another
    task before the end of the first was heard (:mod:`crux_dask.plugins.task_reports`):
    on two threads, a fifth of the tasks, and more of those that ran beside others,
    their runs stretched by the GIL: at its label's median share of the CPU, a
    ``getitem`` of TPC-H Q1 that had waited 0.2 s for an ``astype`` counted as 0.2 s
    of CPU (its label's 31 tasks 0.76 s, against 0.07 s on one thread).  With no
    known task, a label competed for nothing: all three long ``astype`` of one Q1 run.
    """
    cpu = run.store.column("state_cpu", run.state)
    known = np.isfinite(cpu)
    if known.all():
        return cpu
    wall = float(run.duration[known].sum())
    share = float(cpu[known].sum()) / wall if wall > 0 else 0.0
    typical = share * run.duration
    for label in np.unique(run.label[known]).tolist():
        mine = run.label == label
        typical[mine] = np.minimum(float(np.median(cpu[mine & known])), run.duration[mine])
    return np.where(known, cpu, typical)
