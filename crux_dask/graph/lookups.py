"""What an event needs that may not be reported yet: an input, the task that freed its slot,
the data a release releases.

Workers report on their own schedule: an input fetched from another worker,
or the task whose completion released a task from the scheduler's queue, may
be reported after the event that needs it.  Such an event waits
(:mod:`crux_dask.graph.waiting`) until the state appears; once it has waited
long enough it takes the best stand-in, or goes without the cause.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crux_dask.events import Compute
from crux_dask.graph import operations

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder

__all__ = ["WAITS", "freed_by", "held", "missing", "released_at", "unheld"]

#: Locations whose data Dask reports itself, so a missing state is worth waiting for.
AWAITED = ("memory@", "disk@")
#: What :func:`freed_by` returns for an event that now waits.
WAITS = -2


def held(builder: PAGBuilder, key: str, location: int, event: Any, now: float) -> int | None:
    """The copy of ``key`` held at ``location``, else what :func:`missing` gives for it."""
    src = builder.holdings.at(key, location)
    return missing(builder, key, location, event, now) if src is None else src


def missing(builder: PAGBuilder, key: str, location: int, event: Any, now: float,
            created: float | None = None) -> int | None:
    """A state the event needs is unknown: park the event, or pick a stand-in.

    Returns the state to use, or ``None`` if the event now waits for it.
    """
    released = released_at(builder, key, location)
    if released is not None:
        return released
    store = builder.store
    where = store.locations.values[location]
    awaited = where.startswith(AWAITED)
    if awaited and builder.resolving is not event:
        builder.waiting.park((key, location), event, now)
        return None
    newest = builder.holdings.newest.get(key)
    if awaited:
        builder.n_fallbacks += 1
        if newest is not None:  # the newest copy anywhere else
            return newest
    return operations.unreported(builder, key, location, created)


def released_at(builder: PAGBuilder, key: str, location: int) -> int | None:
    """The copy of ``key`` released last at ``location``, in this segment or, shortly
    before it was spooled, in the one before."""
    released = builder.holdings.released_at(key, location)
    if released is None and builder.released_before:
        released = operations.released_before(builder, key, location)
    return released


def freed_by(builder: PAGBuilder, e: Compute, event: Any, now: float) -> int | None:
    """The state of the task whose completion freed ``e``'s queue slot.

    ``None`` if there is none; :data:`WAITS` if the event now waits for
    it (its report may come after this one's, while the task itself waits
    for an input), unless it is being resolved: then it goes without.
    """
    if e.released_by is None or e.released_on is None:
        return None
    where = builder.places.memory_of(e.released_on)
    state = builder.holdings.at(e.released_by, where)
    if state is None:
        state = released_at(builder, e.released_by, where)
    if state is None and builder.resolving is not event:
        builder.waiting.park((e.released_by, where), event, now)
        return WAITS
    return state


def unheld(builder: PAGBuilder, key: str, location: int, event: Any, now: float) -> None:
    """A release of data not held at ``location``: park it, unless there is nothing to wait for.

    The task that made the data may itself wait for an input a worker reports
    late; its release then waits for it.  A release of data already released
    there (reported twice), at a place Dask does not report, or being
    resolved is dropped.
    """
    if builder.resolving is event or builder.holdings.released_at(key, location) is not None:
        return
    if builder.store.locations.values[location].startswith(AWAITED):
        builder.waiting.park((key, location), event, now)
