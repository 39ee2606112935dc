"""Many events at once: routine runs a window at a time, the rest one by one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from crux_dask.codec import decode_batch
from crux_dask.columns import COLUMNS_FROM, EventColumns
from crux_dask.graph.window import apply_window

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder

__all__ = ["WINDOW_MAX", "Feed"]

#: The largest window of events planned at once: larger string tables leave the cache.
WINDOW_MAX = 16_384
#: Events applied one by one after a window that took less than a quarter of what
#: it planned, doubled for each such window in a row (up to ``WINDOW_MAX``).
#: Planning a window costs about as much as applying 25 events one by one, so a
#: stream that is not routine (events waiting for inputs a worker reports late)
#: must not be planned event after event.
PAUSE_MIN = 64

OnError = Callable[[Sequence[Any], Exception], None]


class Feed:
    """Feeds a builder many events, exactly as one by one would.

    The window size adapts to the stream: it doubles while windows are taken
    whole, and shrinks to what the last one took when an event that is not
    routine ends it early, since planning costs the whole window.  After a
    window that took little, the next events go one by one for a while
    (:data:`PAUSE_MIN`, doubled for each such window in a row).
    """

    def __init__(self, builder: PAGBuilder) -> None:
        self.builder = builder
        self.window = COLUMNS_FROM
        self.pause = 0  # events to apply one by one after the last window

    def apply_many(self, events: Iterable[Sequence[Any]], now: float,
                   on_error: OnError | None) -> None:
        events = events if isinstance(events, list) else list(events)
        if len(events) < COLUMNS_FROM:
            self.one_by_one(events, now, on_error)
            return
        for start in range(0, len(events), WINDOW_MAX):  # small string tables stay in cache
            piece = events[start:start + WINDOW_MAX]
            self.windows(EventColumns.from_events(piece), piece.__getitem__, now, on_error)

    def apply_columns(self, columns: EventColumns, now: float,
                      on_error: OnError | None) -> None:
        if len(columns) < COLUMNS_FROM:
            self.one_by_one(columns.events(), now, on_error)
        else:
            self.windows(columns, columns.event, now, on_error)

    def apply_batch(self, data: bytes, now: float) -> int:
        batch = decode_batch(data)
        if batch.columns is not None:
            self.apply_columns(batch.columns, now, None)
        else:
            self.apply_many(batch.rows, now, None)
        return len(batch)

    def windows(self, columns: EventColumns, event_at: Callable[[int], Sequence[Any]],
                now: float, on_error: OnError | None) -> None:
        """Routine events of ``columns`` a window at a time, the others one by one."""
        position, n = 0, len(columns)
        while position < n:
            stop = n  # too few left for a window: one by one
            if n - position >= COLUMNS_FROM:
                size = min(self.window, n - position)
                try:
                    done = apply_window(self.builder, columns, position, position + size)
                except Exception:  # malformed somewhere: one by one, which names it
                    self.window = COLUMNS_FROM
                    stop = position + size
                else:
                    position += done
                    if done == size:
                        self.window = min(2 * self.window, WINDOW_MAX)
                        self.pause = 0
                        continue
                    self.window = max(COLUMNS_FROM, min(2 * done, WINDOW_MAX))
                    self.pause = (min(max(PAUSE_MIN, 2 * self.pause), WINDOW_MAX)
                                  if 4 * done < size else 0)
                    # The event that ended the window, and the pause after a poor one.
                    stop = min(n, position + 1 + self.pause)
            self.one_by_one(map(event_at, range(position, stop)), now, on_error)
            position = stop

    def one_by_one(self, events: Iterable[Sequence[Any]], now: float,
                   on_error: OnError | None) -> None:
        apply = self.builder.apply
        for event in events:
            if on_error is None:
                apply(event, now)
                continue
            try:
                apply(event, now)
            except Exception as error:
                on_error(event, error)
