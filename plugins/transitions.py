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
        half = max(1, self.capacity // 2)
        self.dropped += half
        for column in (self.keys, self.starts, self.finishes, self.times, self.workers,
                       self.stimuli):
            del column[:half]

    def frame(self) -> pd.DataFrame:
        """The transitions kept, oldest first.

        Returns
        -------
        pandas.DataFrame
            Columns ``key``, ``start``, ``finish``, ``time``, ``location`` (the
            worker, if any) and ``stimulus_id``.
        """
        import pandas as pd
        times = np.frombuffer(self.times, dtype="float64").copy() if self.times else np.empty(0)
        def text(values: list) -> pd.Series:  # object, even empty: pandas would make it float
            return pd.Series(values, dtype=object)

        return pd.DataFrame({
            "key": text([key_string(k) for k in self.keys]),
            "start": text(self.starts), "finish": text(self.finishes), "time": times,
            "location": text(self.workers), "stimulus_id": text(self.stimuli),
        })
