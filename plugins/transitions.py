"""The scheduler's task transitions, kept for the provenance export."""

from __future__ import annotations

from time import time
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.plugins.protocol import key_string

# pandas is imported where frames are made: a scheduler loads this module as it
# starts, and importing pandas takes a quarter of a second.
if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CHUNK", "FIELDS", "TransitionLog", "chunks_of_log", "transitions_frame"]

#: Transitions per chunk: the newest are in lists until there are this many of them.
CHUNK = 4096
#: Columns of each chunk: key, start, finish, stimulus and time of each transition; the
#: positions of those that finished a task (out of processing, in memory or erred), and
#: the worker of each.
FIELDS = 7
#: Values of each transition in the newest rows: the five columns, and its worker.
_WIDTH = 6


class TransitionLog:
    """Scheduler transitions, the newest ``capacity`` of them (give or take a chunk).

    The scheduler's transition hook records each as it is called
    (:meth:`record`): the task, where it went from and to, the stimulus and
    the time; and, for a transition that finished a task, the worker it
    finished on (:meth:`finished`), which distributed's own log
    (``Scheduler.transition_log``) leaves out.  Every transition is kept, however
    short that log is (``distributed.admin.low-level-log-length``).

    A transition is six values added to the end of one list, in one call that
    leaves no object the garbage collector tracks (the tuple of the six is
    freed as soon as it is copied); every :data:`CHUNK` transitions, the list becomes
    columns, tuples of strings, keys and numbers: the collector walks every
    list the process holds, element by element, at each full collection (a
    million strings in lists add about 40 ms to each here), but it stops
    tracking a tuple that holds only such values the first time it meets it
    (and a key that is a tuple of them).  Before, the hook's transitions were
    read from distributed's log every ``apply-interval``: copying a field of an
    entry logged a fraction of a second before costs a miss of the processor's
    cache, two to three times what the hook spends while the values are at hand,
    and ``zip(*entries)`` made an iterator per entry, a young collection every
    700 of them.

    Parameters
    ----------
    capacity : int
        How many transitions to keep; past it, the oldest chunks are dropped.

    Attributes
    ----------
    dropped : int
        Transitions dropped to stay within ``capacity``.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.chunk = max(1, min(CHUNK, capacity // 4))
        self.dropped = 0
        # The newest transitions, _WIDTH values each: key, start, finish, stimulus,
        # time, and the worker it finished a task on (or None).
        self.rows: list = []
        # Each: FIELDS columns of CHUNK transitions.
        self.chunks: list[tuple[tuple, ...]] = []

    def __len__(self) -> int:
        return len(self.chunks) * self.chunk + len(self.rows) // _WIDTH

    def record(self, key: Any, start: str, finish: str, stimulus: str | None) -> None:
        """The task ``key`` went from ``start`` to ``finish`` now, for ``stimulus``."""
        rows = self.rows
        if len(rows) >= self.chunk * _WIDTH:  # full: a chunk, before the next row
            self._to_chunk()
            rows = self.rows
        rows += (key, start, finish, stimulus, time(), None)

    def finished(self, worker: str | None) -> None:
        """The transition recorded last finished its task (in memory or erred) on
        ``worker``."""
        if self.rows:
            self.rows[-1] = worker

    def _to_chunk(self) -> None:
        # A new list, not the old one emptied: a thread may be reading it (see
        # :meth:`kept`); the list of chunks is copied there.
        self.chunks.append(_chunk(self.rows, len(self.rows) // _WIDTH))
        self.rows = []
        excess = len(self) - self.capacity
        if excess >= self.chunk:
            drop = excess // self.chunk
            del self.chunks[:drop]
            self.dropped += drop * self.chunk

    def kept(self) -> tuple[list, list, int]:
        """The transitions as they are now: what :meth:`frame` reads.

        Chunks are never changed, and the newest rows only grow at their end
        (the worker of the last one is set in the same call of the hook) until
        they become a chunk (a new list follows): a thread can make the frame of
        what was kept when this was called while transitions go on being
        recorded.
        """
        return list(self.chunks), self.rows, len(self.rows) // _WIDTH

    def in_chunks(self, kept: tuple[list, list, int] | None = None
                  ) -> list[tuple[tuple, ...]]:
        """The transitions kept (by default now, else when :meth:`kept` was called) as
        chunks of columns, oldest first: what :func:`transitions_frame` reads.

        Each can be pickled apart, a short hold of the interpreter: a million
        transitions pickled at once hold it (and a server's event loop) for as
        long as pickling each of their five million strings takes.
        """
        chunks, rows, n = kept or self.kept()
        return [*chunks, _chunk(rows, n)] if n or not chunks else list(chunks)

    def frame(self, kept: tuple[list, list, int] | None = None) -> pd.DataFrame:
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


def chunks_of_log(entries: list) -> list[tuple[tuple, ...]]:
    """Entries of distributed's own transition log (``Scheduler.transition_log``: key,
    start, finish, recommendations, stimulus and time each) as the chunks of
    :meth:`TransitionLog.in_chunks`, oldest first.  That log does not say which worker
    a task finished on: no transition has one."""
    chunks = []
    for first in range(0, len(entries), CHUNK):
        keys, starts, finishes, _, stimuli, times = zip(*entries[first:first + CHUNK])
        chunks.append((keys, starts, finishes, stimuli, times, (), ()))
    return chunks or [_chunk([], 0)]


def _chunk(rows: list, n: int) -> tuple[tuple, ...]:
    """The first ``n`` transitions of ``rows`` as a chunk of
    :meth:`TransitionLog.in_chunks`: five columns, the positions of the
    transitions that finished a task, and the worker of each."""
    end = n * _WIDTH
    keys, starts, finishes, stimuli, times = (tuple(rows[field:end:_WIDTH])
                                              for field in range(_WIDTH - 1))
    workers = rows[_WIDTH - 1:end:_WIDTH]
    finished = tuple([i for i, worker in enumerate(workers) if worker is not None])
    return keys, starts, finishes, stimuli, times, finished, tuple(
        [workers[i] for i in finished])
