"""Many events at once: routine runs a window at a time, the rest one by one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from crux_dask.build.window import apply_window
from crux_dask.codec import decode_batch
from crux_dask.columns import COLUMNS_FROM, EventColumns

if TYPE_CHECKING:
    from crux_dask.build.builder import PAGBuilder

__all__ = ["WINDOW_MAX", "Feed"]

#: The largest window of events planned at once: larger string tables leave the cache.
WINDOW_MAX = 16_384

OnError = Callable[[Sequence[Any], Exception], None]


class Feed:
    """Feeds a builder many events, exactly as one by one would.

    The window size adapts to the stream: it doubles while windows are taken
    whole, and shrinks to what the last one took when an event that is not
    routine ends it early, since planning costs the whole window.
    """

    def __init__(self, builder: PAGBuilder) -> None:
        self.builder = builder
        self.window = COLUMNS_FROM

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
                        continue
                    self.window = max(COLUMNS_FROM, min(2 * done, WINDOW_MAX))
                    stop = position + 1  # the event that ended the window
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
