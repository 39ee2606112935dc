"""The scheduler's task transitions, kept for the provenance export."""

from __future__ import annotations

import time
from array import array
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.plugins.protocol import key_string

# pandas is imported where frames are made: a scheduler loads this module as it
# starts, and importing pandas takes a quarter of a second.
if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TransitionLog"]


class TransitionLog:
    """Scheduler transitions in columns, the newest ``capacity`` of them.

    Columns rather than a tuple per transition: the scheduler process holds
    many objects already, and every container added is one more for its
    garbage collector to walk.

    Parameters
    ----------
    capacity : int
        How many transitions to keep; past it, the oldest half is dropped.

    Attributes
    ----------
    dropped : int
        Transitions dropped to stay within ``capacity``.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.dropped = 0
        self.keys: list[Any] = []
        self.starts: list[str] = []
        self.finishes: list[str] = []
        self.times = array("d")
        self.workers: list[str | None] = []
        self.stimuli: list[str | None] = []

    def __len__(self) -> int:
        return len(self.keys)

    def append(self, key: Any, start: str, finish: str, worker: str | None,
               stimulus_id: str | None) -> None:
        """Record that ``key`` went from ``start`` to ``finish`` now."""
        if len(self.keys) >= self.capacity:
            self._drop_oldest_half()
        self.keys.append(key)
        self.starts.append(start)
        self.finishes.append(finish)
        self.times.append(time.time())
        self.workers.append(worker)
        self.stimuli.append(stimulus_id)

    def _drop_oldest_half(self) -> None:
        # New lists, not the old ones cut: a thread may be reading those (see :meth:`kept`).
        half = max(1, self.capacity // 2)
        self.dropped += half
        self.keys, self.starts, self.finishes, self.times, self.workers, self.stimuli = (
            column[half:] for column in (self.keys, self.starts, self.finishes, self.times,
                                         self.workers, self.stimuli))

    def kept(self) -> tuple[tuple, int]:
        """The columns as they are now, and how many rows: what :meth:`frame` reads.

        The columns only grow at their end until the oldest half is dropped,
        which makes new ones: a thread can make the frame of what was kept
        when this was called, while transitions go on being recorded.
        """
        return (self.keys, self.starts, self.finishes, self.times, self.workers,
                self.stimuli), len(self.keys)

    def frame(self, kept: tuple[tuple, int] | None = None) -> pd.DataFrame:
        """The transitions kept (by default now, else when :meth:`kept` was called),
        oldest first.

        Returns
        -------
        pandas.DataFrame
            Columns ``key``, ``start``, ``finish``, ``time``, ``location`` (the
            worker, if any) and ``stimulus_id``.
        """
        import pandas as pd
        (keys, starts, finishes, times, workers, stimuli), n = kept or self.kept()
        times = np.frombuffer(times[:n], dtype="float64") if n else np.empty(0)
        def text(values: list) -> pd.Series:  # object, even empty: pandas would make it float
            return pd.Series(values, dtype=object)

        return pd.DataFrame({
            "key": text([key_string(k) for k in keys[:n]]),
            "start": text(starts[:n]), "finish": text(finishes[:n]), "time": times,
            "location": text(workers[:n]), "stimulus_id": text(stimuli[:n]),
        })
