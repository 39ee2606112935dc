"""Events that wait for an input not reported yet.

Events come from several sources with different latencies: the scheduler
learns that a task finished before the worker that fetched the task's input
has reported the fetch.  An event whose input is a state Dask will report
(data in a worker's memory or on its disk) waits here for it, keyed by the
``(key, location code)`` it needs, and is applied as soon as that state
appears, or with the best stand-in once it has waited long enough.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crux_dask.events import Event, event_time

__all__ = ["Waiting"]

Slot = tuple[str, int]


class Waiting:
    """The waiting events, by the state they wait for.

    Attributes
    ----------
    total : int
        Events that ever had to wait.
    """

    def __init__(self) -> None:
        self.events: dict[Slot, list[Event]] = {}
        self.since: dict[Slot, float] = {}
        self.arrived: list[Slot] = []  # slots that appeared while events waited for them
        self.total = 0

    def __len__(self) -> int:
        """How many events wait now."""
        return sum(len(v) for v in self.events.values())

    def __contains__(self, slot: Slot) -> bool:
        return slot in self.events

    def park(self, slot: Slot, event: Event, now: float) -> None:
        """``event`` waits for ``slot``; ``now`` is when it started waiting."""
        self.events.setdefault(slot, []).append(event)
        self.since.setdefault(slot, now)
        self.total += 1

    def appeared(self, slot: Slot) -> None:
        """The state of ``slot`` now exists: its events can go (see :meth:`pop_arrived`)."""
        if slot in self.events:
            self.arrived.append(slot)

    def pop_arrived(self) -> tuple[float, list[Event]]:
        """The events of one slot that appeared, removed from the waiting ones, and
        since when they waited (an event that waits again goes on from then)."""
        slot = self.arrived.pop()
        return self.since.pop(slot, 0.0), self.events.pop(slot, [])

    def take(self, older_than: float | None) -> list[tuple[Slot, float, Event]]:
        """Remove the events waiting since before ``older_than`` (all: ``None``).

        Returns ``(slot, since, event)`` for each.
        """
        taken = []
        for slot, since in list(self.since.items()):
            if older_than is None or since < older_than:
                del self.since[slot]
                taken += [(slot, since, event) for event in self.events.pop(slot, ())]
        return taken

    def adopt(self, other: Waiting, slot_of) -> None:
        """Take over the events of ``other``, their slots renamed by ``slot_of``."""
        for slot, events in other.events.items():
            mine = slot_of(slot)
            self.events.setdefault(mine, []).extend(events)
            self.since.setdefault(mine, other.since.get(slot, 0.0))

    def resolve(self, apply: Callable[[Event, float], Any],
                apply_with_stand_ins: Callable[[Event], Any], older_than: float | None,
                made_by: Callable[[Event], Slot | None]) -> None:
        """Apply waiting events, giving those whose input will never come a stand-in.

        An event waiting for data that another waiting event makes (the same
        key at the same place, ``made_by``) waits for that event to be applied
        first: event times alone cannot order them, as each worker's clock is
        converted with its own estimate of the scheduler's.  The others go
        with ``apply_with_stand_ins``; all of them, oldest first, so that
        chains resolve in order.  Events that wait again are not counted as
        new waits.  Matching what is made by place, not by key alone, keeps
        this to a round or two when a worker never reports: its fetches never
        come, but the tasks they copy are made elsewhere.
        """
        total = self.total
        while waiting := self.take(older_than):
            waiting.sort(key=lambda item: event_time(item[2]))
            made = {slot for _, _, event in waiting if (slot := made_by(event)) is not None}
            stand_ins = [event for slot, _, event in waiting if slot not in made]
            # Waiting for each other all round: the oldest goes first.
            chosen = {id(event) for event in stand_ins or [waiting[0][2]]}
            for _, since, event in waiting:
                if id(event) in chosen:
                    apply_with_stand_ins(event)
                else:  # applied, or waits again
                    apply(event, since)
        self.total = total
