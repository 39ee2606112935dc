"""The scheduler's task transitions, kept for the provenance export."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.plugins.protocol import key_string

# pandas is imported where frames are made: a scheduler loads this module as it
# starts, and importing pandas takes a quarter of a second.
if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CHUNK", "FIELDS", "TransitionLog", "transitions_frame"]

#: Transitions per chunk: the newest are rows until there are this many of them.
CHUNK = 4096
#: Values recorded per transition: key, start, finish, worker, stimulus, time.
FIELDS = 6


class TransitionLog:
    """Scheduler transitions, the newest ``capacity`` of them (give or take a chunk).

    A transition is six values appended to a list, the cheapest a hook can
    record (a tuple per transition would be one more object for the collector
    to track); every :data:`CHUNK` of them become columns of numpy arrays.  The
    garbage collector walks every list the scheduler's process holds, element
    by element, at each full collection (a million strings in lists add about
    40 ms to each here); it never walks a numpy array.

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
        self.rows: list[Any] = []  # the newest transitions, FIELDS values each
        # Each: key, start, finish, worker, stimulus (object arrays) and time (float64).
        self.chunks: list[tuple[np.ndarray, ...]] = []

    def __len__(self) -> int:
        return len(self.chunks) * self.chunk + len(self.rows) // FIELDS

    def append(self, key: Any, start: str, finish: str, worker: str | None,
               stimulus_id: str | None) -> None:
        """Record that ``key`` went from ``start`` to ``finish`` now."""
        rows = self.rows
        rows += (key, start, finish, worker, stimulus_id, time.time())
        if len(rows) == FIELDS * self.chunk:
            self._to_columns()

    def _to_columns(self) -> None:
        # A new list of rows, not the old one emptied: a thread may be reading it
        # (see :meth:`kept`); the list of chunks is copied there.
        self.chunks.append(_columns(self.rows))
        self.rows = []
        excess = len(self) - self.capacity
        if excess >= self.chunk:
            drop = excess // self.chunk
            del self.chunks[:drop]
            self.dropped += drop * self.chunk

    def kept(self) -> tuple[list, list, int]:
        """The transitions as they are now: what :meth:`frame` reads.

        Chunks are never changed, and the rows only grow at their end until
        they become a chunk (in a new list): a thread can make the frame of
        what was kept when this was called while transitions go on being
        recorded.
        """
        return list(self.chunks), self.rows, len(self.rows)

    def in_chunks(self, kept: tuple[list, list, int] | None = None
                  ) -> list[tuple[np.ndarray, ...]]:
        """The transitions kept (by default now, else when :meth:`kept` was called) as
        chunks of columns, oldest first: what :func:`transitions_frame` reads.

        Each can be pickled apart, a short hold of the interpreter: a million
        transitions pickled at once hold it (and a server's event loop) for as
        long as pickling each of their five million strings takes.
        """
        chunks, rows, n = kept or self.kept()
        return [*chunks, _columns(rows[:n])] if n or not chunks else list(chunks)

    def frame(self, kept: tuple[list, list, int] | None = None) -> pd.DataFrame:
        """:func:`transitions_frame` of the transitions kept (by default now, else when
        :meth:`kept` was called)."""
        return transitions_frame(self.in_chunks(kept))


def transitions_frame(chunks: list[tuple[np.ndarray, ...]]) -> pd.DataFrame:
    """The transitions of :meth:`TransitionLog.in_chunks`, oldest first.

    Returns
    -------
    pandas.DataFrame
        Columns ``key``, ``start``, ``finish``, ``time``, ``location`` (the
        worker, if any) and ``stimulus_id``.
    """
    import pandas as pd
    keys, starts, finishes, workers, stimuli, times = (
        np.concatenate(column) for column in zip(*chunks))
    return pd.DataFrame({
        "key": pd.Series([key_string(k) for k in keys.tolist()], dtype=object),
        "start": pd.Series(starts, dtype=object), "finish": pd.Series(finishes, dtype=object),
        "time": times, "location": pd.Series(workers, dtype=object),
        "stimulus_id": pd.Series(stimuli, dtype=object),
    })


def _columns(rows: list[Any]) -> tuple[np.ndarray, ...]:
    """Rows of :meth:`TransitionLog.append` as its chunks' columns."""
    n = len(rows) // FIELDS
    # fromiter: each value one element, keys that are tuples too.
    return (*(np.fromiter(rows[field::FIELDS], dtype=object, count=n)
              for field in range(FIELDS - 1)), np.array(rows[FIELDS - 1::FIELDS], dtype="float64"))
