"""Events from the scheduler and the workers, applied together in the order they happened.

The scheduler reports a task when it finishes; the worker that fetched its
inputs reports the fetches in its next batch.  Applied as received, the task
would wait for them; in the order things happened, most events find what they
need (clocks permitting).  A run is the events the ingest applies together: the
workers' batches received in columns, and event tuples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.columns import EventColumns
from crux_dask.events import event_time

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder
    from crux_dask.plugins.joins import Announced

__all__ = ["Refuse", "apply_run", "in_time_order"]

#: What is told of an event (or a task, or a report) that cannot be applied, and why.
Refuse = Callable[[Any, Exception], None]


def apply_run(builder: PAGBuilder, announced: Announced, parts: list[EventColumns],
              events: list[tuple], now: float, refuse: Refuse) -> None:
    """Apply batches received in columns, then ``events``, as one run, in time order.

    Parameters
    ----------
    builder : PAGBuilder
        What applies the run.
    announced : Announced
        When the scheduler saw the latest tasks finish: the gathers of the run
        without a ``requested`` moment get their task's first.
    parts : list of EventColumns
        The batches in columns (``events`` in columns are appended to it).
    events : list of tuple
        Events in the builder's form (gathers given a moment in place).
    now : float
        The ingest's clock, by which the builder times out waiting events.
    refuse : callable
        Told of each event that cannot be applied, and why.
    """
    for part in parts:
        announced.gathers_in(part)
    announced.gathers(events)
    if not parts:
        if events:
            builder.apply_many(in_time_order(events), now, on_error=refuse)
        return
    if events:
        parts.append(EventColumns.from_events(events))
    columns = EventColumns.concat(parts)
    order = np.argsort(columns.times(), kind="stable")
    if np.any(order[1:] < order[:-1]):
        columns = columns.take(order)
    builder.apply_columns(columns, now, on_error=refuse)


def in_time_order(events: list[tuple]) -> list[tuple]:
    """``events`` sorted by when they happened (stable, by
    :func:`~crux_dask.events.event_time`: one without a time first, for the builder to
    refuse)."""
    return sorted(events, key=event_time)
