"""The scheduler's task transitions, kept for the provenance export."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.plugins.logs import since
from crux_dask.plugins.protocol import key_string

# pandas is imported where frames are made: a scheduler loads this module as it
# starts, and importing pandas takes a quarter of a second.
if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CHUNK", "FIELDS", "TransitionLog", "transitions_frame"]

#: Transitions per chunk: the newest are in lists until there are this many of them.
CHUNK = 4096
#: Columns of each chunk: key, start, finish, stimulus and time of each transition; the
#: positions of those that finished a task (out of processing, in memory or erred), and
#: the worker of each.
FIELDS = 7
_FINISHED = frozenset({"memory", "erred"})
#: Finished tasks noted whose transition was not read, past which they are let go
#: after the scheduler's log let go of transitions before they were read.
_MOST_FINISHED = 100_000


class TransitionLog:
    """Scheduler transitions, the newest ``capacity`` of them (give or take a chunk).

    The scheduler logs each transition itself (``Scheduler.transition_log``, a
    deque of the newest ``distributed.admin.low-level-log-length``); :meth:`read`
    takes what it logged since the last read, a batch at a time: from a
    periodic callback, and from the transition hook once half the log's length
    was logged since (one graph submitted makes more transitions at once than
    the default log of 1,000 holds).  The worker a task finished on, which that
    log leaves out, the transition hook notes (:meth:`finished`) as it records
    the task.
    Each read copies the fields kept into columns, lists that every
    :data:`CHUNK` transitions become tuples of strings, keys and numbers: the
    garbage collector walks every list the scheduler's process holds, element
    by element, at each full collection (a million strings in lists add about
    40 ms to each here), but it stops tracking a tuple that holds only such
    values the first time it meets it (and a key that is a tuple of them).
    Made with ``zip``, without a step per value.  No entry of the scheduler's
    log is held: each is freed as the log lets go of it, one at a time, as
    without Crux.  Entries held for a chunk were freed thousands at once,
    which the collector's count of young objects does not take off (it stops
    at zero): on 9,000 tiny tasks the scheduler made 190 young collections
    instead of 134 without Crux (142 now).

    Parameters
    ----------
    capacity : int
        How many transitions to keep; past it, the oldest chunks are dropped.

    Attributes
    ----------
    dropped : int
        Transitions dropped to stay within ``capacity``.
    overruns : int
        Reads that found the scheduler's log had let go of transitions not
        read yet (more than its length between two reads).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.chunk = max(1, min(CHUNK, capacity // 4))
        self.dropped = 0
        self.overruns = 0
        # The newest transitions: key, start, finish, stimulus and time columns.
        self.columns: tuple[list, ...] = _new_columns()
        # Each: FIELDS columns of CHUNK transitions.
        self.chunks: list[tuple[tuple, ...]] = []
        # Tasks that finished, not in a chunk yet: key -> the worker they finished on.
        self.finished_on: dict[Any, str | None] = {}
        self._seen: Any = None  # the newest entry of the scheduler's log read

    def __len__(self) -> int:
        return len(self.chunks) * self.chunk + len(self.columns[0])

    def start(self, log: Sequence[Any]) -> None:
        """Read from now on: what ``log`` holds already is not this run's."""
        self._seen = log[-1] if log else None

    def finished(self, key: Any, worker: str | None) -> None:
        """The task ``key`` finished (in memory or erred) on ``worker``, now."""
        self.finished_on[key] = worker

    def read(self, log: Sequence[Any]) -> None:
        """Take the transitions the scheduler logged in ``log`` since the last read.

        Searched from the newest for the newest entry read before: if it is
        gone, the log let go of transitions before they were read
        (:attr:`overruns`).
        """
        fresh, lost = since(log, self._seen)
        if not fresh:
            return
        self._seen = fresh[-1]
        if lost:
            self.overruns += 1
            if len(self.finished_on) > _MOST_FINISHED:  # their transitions were missed
                self.finished_on.clear()
        taken = 0
        while taken < len(fresh):
            columns = self.columns
            room = self.chunk - len(columns[0])
            keys, starts, finishes, _, stimuli, times = zip(*fresh[taken:taken + room])
            for column, values in zip(columns, (keys, starts, finishes, stimuli, times)):
                column += values
            taken += len(keys)
            if len(columns[0]) == self.chunk:
                self._to_chunk()

    def _to_chunk(self) -> None:
        # New columns, not the old ones emptied: a thread may be reading them
        # (see :meth:`kept`); the list of chunks is copied there.
        self.chunks.append(_chunk(self.columns, len(self.columns[0]), self.finished_on,
                                  taken=True))
        self.columns = _new_columns()
        excess = len(self) - self.capacity
        if excess >= self.chunk:
            drop = excess // self.chunk
            del self.chunks[:drop]
            self.dropped += drop * self.chunk

    def kept(self) -> tuple[list, tuple[list, ...], int]:
        """The transitions as they are now: what :meth:`frame` reads.

        Chunks are never changed, and the columns only grow at their end until
        they become a chunk (new columns follow): a thread can make the frame
        of what was kept when this was called while transitions go on being
        recorded.
        """
        return list(self.chunks), self.columns, len(self.columns[0])

    def in_chunks(self, kept: tuple[list, tuple[list, ...], int] | None = None
                  ) -> list[tuple[tuple, ...]]:
        """The transitions kept (by default now, else when :meth:`kept` was called) as
        chunks of columns, oldest first: what :func:`transitions_frame` reads.

        Each can be pickled apart, a short hold of the interpreter: a million
        transitions pickled at once hold it (and a server's event loop) for as
        long as pickling each of their five million strings takes.
        """
        chunks, columns, n = kept or self.kept()
        return ([*chunks, _chunk(columns, n, self.finished_on, taken=False)] if n or not chunks
                else list(chunks))

    def frame(self, kept: tuple[list, tuple[list, ...], int] | None = None
              ) -> pd.DataFrame:
        """:func:`transitions_frame` of the transitions kept (by default now, else when
        :meth:`kept` was called)."""
        return transitions_frame(self.in_chunks(kept))


def transitions_frame(chunks: list[tuple[tuple, ...]]) -> pd.DataFrame:
    """The transitions of :meth:`TransitionLog.in_chunks`, oldest first.

    Returns
    -------
    pandas.DataFrame
        Columns ``key``, ``start``, ``finish``, ``time``, ``location`` (the
        worker a task finished on, on its transition out of processing) and
        ``stimulus_id``.
    """
    import pandas as pd
    keys, starts, finishes, stimuli, times = ([] for _ in range(5))
    workers: list[str | None] = []
    for chunk_keys, chunk_starts, chunk_finishes, chunk_stimuli, chunk_times, finished, on in (
            chunks):
        offset = len(keys)
        keys += chunk_keys
        starts += chunk_starts
        finishes += chunk_finishes
        stimuli += chunk_stimuli
        times += chunk_times
        workers += [None] * len(chunk_keys)
        for position, worker in zip(finished, on):
            workers[offset + position] = worker
    return pd.DataFrame({
        "key": pd.Series([key_string(k) for k in keys], dtype=object),
        "start": pd.Series(starts, dtype=object), "finish": pd.Series(finishes, dtype=object),
        "time": np.array(times, dtype="float64"),
        "location": pd.Series(workers, dtype=object),
        "stimulus_id": pd.Series(stimuli, dtype=object),
    })


def _new_columns() -> tuple[list, ...]:
    return [], [], [], [], []


def _chunk(columns: tuple[list, ...], n: int, finished_on: dict[Any, str | None], taken: bool
           ) -> tuple[tuple, ...]:
    """The first ``n`` transitions of ``columns`` as a chunk of
    :meth:`TransitionLog.in_chunks`; the positions of the tasks that finished,
    and the worker of each, from ``finished_on`` (taken out of it if ``taken``).
    A transition out of processing that finished nothing (its worker left)
    takes no worker: the task's next finish may be noted already."""
    keys, starts, finishes, stimuli, times = (tuple(column[:n]) for column in columns)
    finished = tuple([i for i, start in enumerate(starts)
                      if start == "processing" and finishes[i] in _FINISHED])
    find = finished_on.pop if taken else finished_on.get
    return keys, starts, finishes, stimuli, times, finished, tuple(
        [find(keys[i], None) for i in finished])
