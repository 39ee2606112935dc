"""Which copies of which data are held where, as the builder sees it.

A key's data may be held in several places at once (its worker's memory, a
peer that fetched it, the disk it was spilled to, a file a task wrote).  Each
copy is a state; the newest is where a task's input is looked for first.
Workers report on their own schedule, so a fetch from a copy may arrive after
the copy's release: the states released last are remembered too.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

import numpy as np

from crux_dask.model import MutationKind
from crux_dask.store import PAGStore

__all__ = ["Holdings"]

_DELETE = int(MutationKind.DELETE)
#: New mutations up to which releases are found with a Python loop rather than numpy.
_SCAN_FROM = 256


class Holdings:
    """The live copies of every key, and the recently released ones.

    Parameters
    ----------
    store : PAGStore
        The graph the states belong to.
    max_released : int
        How many released copies to remember as sources of late reports.

    Attributes
    ----------
    newest : dict of str to int
        Each held key's newest copy.  Read it freely; change it through the
        methods, which keep :attr:`others` in step.
    others : dict of str to dict of int to int
        For keys held in several places: location code -> state of each copy
        other than the newest (or of the newest, where it is held at a
        location other than the one it was made at).
    """

    def __init__(self, store: PAGStore, max_released: int) -> None:
        self.store = store
        self.max_released = max_released
        self.newest: dict[str, int] = {}
        self.others: dict[str, dict[int, int]] = {}
        # (key, location) -> the state released there last, indexed from the
        # DELETE mutations only when a lookup needs it.
        self._released: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._released_upto = 0

    def __len__(self) -> int:
        """How many copies are held."""
        return len(self.newest) + sum(len(c) for c in self.others.values())

    def states(self) -> list[int]:
        """The states of every copy held, ascending."""
        states = list(self.newest.values())
        for copies in self.others.values():
            states.extend(copies.values())
        return sorted(states)

    def at(self, key: str, location: int) -> int | None:
        """The copy of ``key`` held at ``location``, if any."""
        newest = self.newest.get(key)
        if newest is None:
            return None
        if self.store.state_location[newest] == location:
            return newest
        copies = self.others.get(key)
        return copies.get(location) if copies else None

    def add(self, key: str, location: int, state: int) -> None:
        """``state`` is now held at ``location`` and is the newest copy of ``key``.

        ``location`` differs from the state's own for data held in two places
        at once (a task that wrote a file and kept its result in memory).
        """
        previous = self.newest.get(key)
        self.newest[key] = state
        where = self.store.state_location
        copies = self.others.get(key)
        if previous is not None and previous != state:
            previous_location = where[previous]
            if previous_location != location:
                if copies is None:
                    copies = self.others[key] = {}
                copies[previous_location] = previous
        if location != where[state]:
            if copies is None:
                copies = self.others[key] = {}
            copies[location] = state
        elif copies:
            copies.pop(location, None)

    def drop(self, key: str, location: int) -> int | None:
        """``key`` is no longer held at ``location``: the state that held it there."""
        newest = self.newest.get(key)
        if newest is None:
            return None
        where = self.store.state_location
        copies = self.others.get(key)
        if where[newest] == location:
            if copies:  # the newest other copy takes over
                held_at, state = copies.popitem()
                self.newest[key] = state
                if where[state] != held_at:
                    copies[held_at] = state  # still held there, under another location
                if not copies:
                    del self.others[key]
            else:
                del self.newest[key]
            return newest
        state = copies.pop(location, None) if copies else None
        if state is not None and not copies:
            del self.others[key]
        return state

    def released_at(self, key: str, location: int) -> int | None:
        """The state of ``key`` released last at ``location``, among recent releases."""
        self._catch_up()
        return self._released.get((key, location))

    def latest_released(self, n: int) -> list[tuple[str, int, int]]:
        """The ``n`` copies released last, newest first: ``(key, location, state)`` each."""
        self._catch_up()
        return [(key, location, state) for (key, location), state
                in itertools.islice(reversed(self._released.items()), n)]

    def released_elsewhere(self, key: str, location: int, state: int) -> None:
        """Remember ``state`` as the copy of ``key`` released last at ``location``, its
        release being in another graph (a segment spooled before this one)."""
        self._released[(key, location)] = state

    def _catch_up(self) -> None:
        """Index the releases made since the last lookup."""
        store = self.store
        start, stop = self._released_upto, store.n_mutations
        if start < stop:
            self._released_upto = stop
            if stop - start <= _SCAN_FROM:  # a few new mutations: numpy would cost more
                kinds = store.mutation_kind
                deletes = [m for m in range(start, stop) if kinds[m] == _DELETE]
            else:
                deletes = (start + np.flatnonzero(store.column(
                    "mutation_kind", np.arange(start, stop)) == _DELETE)).tolist()
            self._index_releases(deletes)

    def _index_releases(self, deletes: list[int]) -> None:
        """Remember the states that the DELETE mutations ``deletes`` released."""
        store = self.store
        mutation_src, mutation_dst = store.mutation_src, store.mutation_dst
        location_of, key_of = store.state_location, store.state_key
        released = self._released
        names = store.keys.values
        for mutation in deletes[-self.max_released:]:
            src, dst = mutation_src[mutation], mutation_dst[mutation]
            where, code = location_of[dst], key_of[dst]
            # Only releases: a tombstone of the same key at the same place.
            if location_of[src] == where and key_of[src] == code:
                slot = (names[code], where)
                released.pop(slot, None)  # the latest release is remembered longest
                released[slot] = src
        for _ in range(len(released) - self.max_released):
            released.popitem(last=False)
