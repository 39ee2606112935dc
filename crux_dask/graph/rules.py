"""The mapping rules of the data model, each written once.

The live builder applies events one at a time, its windows apply many at once
with numpy, and the offline rebuild derives the same columns from exported
tables.  Each rule below is what all three call: a scalar form for one event
and, beside it, an array form for many, which the tests hold to the scalar
one.

* **Kind** of a task's mutations: ``APPEND`` without inputs, ``CONVERT`` with
  one, ``MERGE`` with several (:func:`task_kind`); a single input that feeds
  several tasks of the same task group is a ``SPLIT`` (:class:`FanOut`).
* **Ready time** of a copy: its source's ready time plus the transfer's own
  duration, never later than the copy really arrived (:func:`copy_ready`).
  Dask moves an input only once its consumer can run, so the wait before a
  move belongs to what made the consumer ready.
* **Last-arriving input**: the input ready last, the first one on ties; a
  NaN time never wins (:func:`last_arriving`).
* **End of the graph**: the latest state that is neither a root nor a
  tombstone, except that a state made from the end becomes the end whatever
  the clocks say (:class:`EndTracker`): workers convert their times to the
  scheduler's clock with estimates that disagree by milliseconds.
* **Causes** besides data: a task that was runnable before the task ahead
  of it on its executor thread finished waited for that thread
  (:func:`thread_caused`); where the worker did not say when the task became
  runnable, it was runnable once it was sent and its inputs were ready
  (:func:`runnable`).  Of a step's causes, the one released last is the one
  the critical path follows.
* **Label** of a key without one: Dask's own ``key_split``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import repeat

import numpy as np
from dask.utils import key_split

from crux_dask.model import MOMENTS, MutationKind

__all__ = [
    "EndTracker",
    "FanOut",
    "ThreadLanes",
    "copies_ready",
    "copy_ready",
    "key_label",
    "last_arriving",
    "last_arriving_per_target",
    "moment",
    "runnable",
    "runnables",
    "task_kind",
    "task_kinds",
    "thread_caused",
]

APPEND, CONVERT, MERGE, SPLIT = (int(MutationKind.APPEND), int(MutationKind.CONVERT),
                                 int(MutationKind.MERGE), int(MutationKind.SPLIT))
_NAN = float("nan")
#: Seconds by which one worker's times may disagree among themselves: each is
#: converted to the scheduler's clock with the estimate of the moment, which
#: moves at every heartbeat.
CLOCK_SLACK = 0.01
#: What :class:`ThreadLanes` holds of a lane no task ran on yet.
_NO_LANE = (-1, np.nan)
#: What :class:`FanOut` remembers of a source before any task read it.
_NO_GROUP = -2


def key_label(key: str) -> str:
    """The label of a key given none: its task prefix (``"('inc-ab12', 0)"`` → ``"inc"``)."""
    return key_split(key)


# -- kinds ------------------------------------------------------------------
def task_kind(n_inputs: int) -> int:
    """The kind of the mutations of a task with ``n_inputs`` inputs (before ``SPLIT``)."""
    return APPEND if n_inputs == 0 else CONVERT if n_inputs == 1 else MERGE


def task_kinds(n_inputs: np.ndarray) -> np.ndarray:
    """:func:`task_kind` of many tasks."""
    return np.where(n_inputs == 0, APPEND, np.where(n_inputs > 1, MERGE, CONVERT))


class FanOut:
    """Which single-input mutations are ``SPLIT`` s: one source, several tasks of one group.

    Per source state it remembers the task group of the last single-input
    task that read it and, until a second one of that group comes, the
    mutation of the first (which then becomes a ``SPLIT`` too).
    """

    def __init__(self) -> None:
        # source state -> (task group code, its first single-input mutation, -1 once split)
        self.seen: dict[int, tuple[int, int]] = {}

    def kind(self, src: int, group: int, mutation: int, kinds: Sequence) -> int:
        """The kind of single-input ``mutation`` from ``src`` by a task of ``group``.

        ``kinds`` is the mutation-kind column: the first sibling's kind is
        changed there when a second one appears.
        """
        seen = self.seen.get(src)
        if seen is None or seen[0] != group:
            self.seen[src] = (group, mutation)
            return CONVERT
        if seen[1] >= 0:
            kinds[seen[1]] = SPLIT
            self.seen[src] = (group, -1)
        return SPLIT

    def kinds(self, src: np.ndarray, group: np.ndarray, mutation: np.ndarray,
              kinds: Sequence) -> np.ndarray:
        """:meth:`kind` of many single-input mutations, in the order of ``mutation``.

        A mutation is a ``SPLIT`` when the one before or after it from the
        same source is by the same task group.
        """
        order = np.argsort(src, kind="stable")
        src, group, mutation = src[order], group[order], mutation[order]
        first = np.ones(len(src), bool)
        first[1:] = src[1:] != src[:-1]
        last = np.ones(len(src), bool)
        last[:-1] = first[1:]
        seen = [self.seen.get(s, (_NO_GROUP, -1)) for s in src[first].tolist()]
        before = np.empty_like(group)
        before[1:] = group[:-1]
        before[first] = [g for g, _ in seen]
        same_before = group == before
        same_after = np.zeros(len(src), bool)
        same_after[:-1] = ~last[:-1] & (group[1:] == group[:-1])
        seen_mutation = np.asarray([m for _, m in seen], np.int64)
        for m in seen_mutation[same_before[first] & (seen_mutation >= 0)].tolist():
            kinds[m] = SPLIT  # a first sibling recorded earlier
        self.seen.update(zip(src[last].tolist(), zip(
            group[last].tolist(), np.where(same_before[last], -1, mutation[last]).tolist())))
        result = np.empty(len(src), np.int64)
        result[order] = np.where(same_before | same_after, SPLIT, CONVERT)
        return result

    def forget(self, src: int) -> None:
        """``src`` was released: no task reads it any more."""
        self.seen.pop(src, None)

    def forget_many(self, sources: list[int]) -> None:
        """:meth:`forget` of many sources."""
        deque(map(self.seen.pop, sources, repeat(None)), maxlen=0)


# -- ready times ------------------------------------------------------------
def copy_ready(source_ready: float, start: float, stop: float) -> float:
    """When a copy made between ``start`` and ``stop`` counts as ready."""
    ready = source_ready + (stop - start)
    return ready if ready < stop else stop


def copies_ready(source_ready: np.ndarray, start: np.ndarray, stop: np.ndarray
                 ) -> np.ndarray:
    """:func:`copy_ready` of many copies."""
    ready = source_ready + (stop - start)
    return np.where(ready < stop, ready, stop)


# -- the last-arriving input --------------------------------------------------
def last_arriving(ready: Sequence[float]) -> int:
    """Index of the input ready last (the first on ties; ``0`` if none has a time)."""
    best, best_time = 0, float("-inf")
    for i, time in enumerate(ready):
        if time > best_time:
            best, best_time = i, time
    return best


def last_arriving_segments(ready: np.ndarray, starts: np.ndarray, lengths: np.ndarray
                           ) -> np.ndarray:
    """:func:`last_arriving` of each segment of ``ready`` (all non-empty), as offsets."""
    if not len(starts):
        return np.zeros(0, np.int64)
    largest = np.fmax.reduceat(ready, starts)
    offset = np.arange(len(ready)) - np.repeat(starts, lengths)
    hits = np.where(ready == np.repeat(largest, lengths), offset, len(ready))
    first = np.minimum.reduceat(hits, starts)
    return np.where(first == len(ready), 0, first)


def last_arriving_per_target(ready: np.ndarray, mutations: np.ndarray, dst: np.ndarray,
                             n_states: int) -> np.ndarray:
    """Per state, which of ``mutations`` into it came from the input ready last.

    Parameters
    ----------
    ready : ndarray
        The ready time of each mutation's source.
    mutations, dst : ndarray
        Mutation ids, ascending, and their target states.
    n_states : int

    Returns
    -------
    ndarray
        A mutation id per state, ``-1`` for a state with none.
    """
    pred = np.full(n_states, -1, np.int64)
    if not len(mutations):
        return pred
    if np.any(dst[1:] < dst[:-1]):  # grouped by target, in mutation order
        order = np.argsort(dst, kind="stable")
        ready, mutations, dst = ready[order], mutations[order], dst[order]
    starts = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]])
    lengths = np.diff(np.r_[starts, len(dst)])
    best = last_arriving_segments(ready, starts, lengths)
    pred[dst[starts]] = mutations[starts + best]
    return pred


# -- causes besides data ------------------------------------------------------
#: An operation's moments (:data:`~crux_dask.model.MOMENTS`), none recorded.
NO_MOMENTS = (_NAN,) * len(MOMENTS)


def moment(value: float | None) -> float:
    """A recorded moment as a number: NaN for none.

    Raises
    ------
    TypeError, ValueError
        If the value is not a finite number.
    """
    if value is None:
        return _NAN
    value = value + 0.0
    if value - value != 0.0:
        raise ValueError(f"a moment must be a finite time, got {value!r}")
    return value


def runnable(moments: tuple[float, float, float], inputs_ready: float) -> float:
    """When a task could have run: recorded, or once sent and its inputs ready.

    ``moments`` are its ``requested`` (sent), ``received`` and ``runnable``
    times (NaN where not recorded).
    """
    recorded = moments[2]
    if recorded == recorded:
        return recorded
    sent = moments[0]
    if sent != sent:
        return inputs_ready
    return sent if not sent <= inputs_ready else inputs_ready


def runnables(requested: np.ndarray, recorded: np.ndarray, inputs_ready: np.ndarray
              ) -> np.ndarray:
    """:func:`runnable` of many tasks."""
    return np.where(np.isnan(recorded), np.fmax(requested, inputs_ready), recorded)


def thread_caused(runnable: float, freed: float, start: float, started_before: float) -> bool:
    """Whether a task runnable at ``runnable`` waited for its thread, freed at ``freed``
    by the task ahead of it, which started at ``started_before``.

    It did if it could have run before the task ahead of it finished, and
    started once that one had finished (within :data:`CLOCK_SLACK`) or at
    least after it had started.  A worker converts each task's times to the
    scheduler's clock with its estimate at the time, which a heartbeat moves:
    on a loaded machine by more than the slack, so that Dask's own task
    stream shows a thread's task starting before the one ahead of it stopped.
    """
    return runnable <= freed and (freed <= start + CLOCK_SLACK or started_before < start)


class ThreadLanes:
    """Per executor thread, the last task computed on it, and who waited for whom.

    Attributes
    ----------
    last : dict
        ``(memory location code, thread)`` -> the state of the last task
        computed on that thread of that worker, and when that task started.
    """

    def __init__(self) -> None:
        self.last: dict[tuple[int, int], tuple[int, float]] = {}

    def cause(self, memory: int, thread: int, state: int, runnable: float, start: float,
              time_of: Sequence[float]) -> int | None:
        """The task whose completion freed the thread ``state``'s task ran on, if it waited.

        ``state`` becomes the lane's last task; ``time_of`` is the state-time
        column.
        """
        lane = memory, thread
        before = self.last.get(lane)
        self.last[lane] = state, start
        if before is not None and thread_caused(runnable, time_of[before[0]], start,
                                                before[1]):
            return before[0]
        return None

    def causes(self, memory: np.ndarray, thread: np.ndarray, states: np.ndarray,
               runnable: np.ndarray, start: np.ndarray, time_of
               ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`cause` of many tasks, in the order of ``states`` (ascending).

        ``thread`` is ``-1`` for a task not run on a thread; ``time_of`` maps
        state ids to their times.  Returns the causes' sources and targets.
        """
        on_thread = np.flatnonzero(thread >= 0)
        if not len(on_thread):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        memory, thread, states = memory[on_thread], thread[on_thread], states[on_thread]
        # Lanes as small integers: thread ids are large, but a window holds few of them.
        threads, thread_code = np.unique(thread, return_inverse=True)
        lane = memory * len(threads) + thread_code.reshape(-1)
        order = np.argsort(lane, kind="stable")  # by lane, in state order within each
        lane = lane[order]
        first = np.r_[True, lane[1:] != lane[:-1]]
        last = np.r_[first[1:], True]
        start = start[on_thread]
        before = np.empty(len(order), np.int64)
        before[1:] = states[order][:-1]
        started_before = np.empty(len(order))
        started_before[1:] = start[order][:-1]
        pairs = list(zip(memory[order][first].tolist(), thread[order][first].tolist()))
        held = [self.last.get(pair, _NO_LANE) for pair in pairs]
        before[first] = [state for state, _ in held]
        started_before[first] = [started for _, started in held]
        self.last.update(zip(zip(memory[order][last].tolist(), thread[order][last].tolist()),
                             zip(states[order][last].tolist(), start[order][last].tolist())))
        previous = np.empty(len(order), np.int64)  # back in state order
        previous[order] = before
        previous_start = np.empty(len(order))
        previous_start[order] = started_before
        known = np.flatnonzero(previous >= 0)
        freed = time_of(previous[known])
        start = start[known]
        caused = known[(runnable[on_thread][known] <= freed)
                       & ((freed <= start + CLOCK_SLACK) | (previous_start[known] < start))]
        return previous[caused], states[caused]


# -- the end of the graph -----------------------------------------------------
class EndTracker:
    """The graph's end as states are created, in id order.

    A new state (not a root, not a tombstone) becomes the end if it is at
    least as late as every such state before it, or if it was made from the
    end: it comes after it, whatever the clocks of the workers that reported
    the two say.

    Attributes
    ----------
    end : int
        The end state, ``-1`` while there is none.
    latest : float
        The latest time of a state so far.
    """

    def __init__(self) -> None:
        self.end = -1
        self.latest = float("-inf")

    def add(self, state: int, time: float, sources: Sequence[int] = ()) -> None:
        """State ``state`` was created at ``time`` from ``sources``."""
        if time >= self.latest:
            self.end, self.latest = state, time
        elif self.end in sources:
            self.end = state

    def add_many(self, states: np.ndarray, times: np.ndarray, src: np.ndarray,
                 dst: np.ndarray) -> None:
        """:meth:`add` of ``states`` (ascending), made by the mutations ``src → dst``."""
        if not len(states):
            return
        so_far = np.fmax.accumulate(np.fmax(times, self.latest))
        latest = np.flatnonzero(times >= np.r_[self.latest, so_far[:-1]])
        end = int(states[latest[-1]]) if len(latest) else self.end
        self.latest = float(so_far[-1])
        candidate = np.zeros(int(states[-1]) + 1, bool)
        candidate[states] = True
        keep = dst < len(candidate)
        keep[keep] = candidate[dst[keep]]
        made, made_src = dst[keep], src[keep]
        while True:  # the first state made from the end, as long as there is one
            after = made[made_src == end]
            if not len(after):
                break
            end = int(after.min())
        self.end = end
