"""Array operations the windows are planned and applied with."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from crux_dask.columns import EventColumns
from crux_dask.store import PAGStore

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder

__all__ = ["as_of", "codes", "encode", "extend", "first", "follow", "same", "values_of"]

#: What a lookup finds in a slot released in the window, and in a slot nothing wrote.
DEAD, MISSING = -1, -2


def first(mask: np.ndarray, default: int) -> int:
    """Index of the first true value of ``mask``, or ``default``."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else default


def codes(columns: EventColumns, table: str, builder: PAGBuilder, indices: np.ndarray,
           lookup) -> np.ndarray:
    """Codes in the builder's ``table`` of the strings at ``indices`` (``-1``: not known).

    Each distinct string is looked up once per batch: known codes are cached
    (codes never change), unknown ones are tried again in the next window.
    """
    cache = columns.codes(table, builder)
    codes = cache[indices]
    unknown = codes < 0
    if unknown.any():
        strings = columns.strings
        for i in np.unique(indices[unknown]).tolist():
            code = lookup(strings[i])
            if code is not None:
                cache[i] = code
        codes = cache[indices]
    return codes


def encode(column, lookup, new_from: int | None = None) -> tuple[np.ndarray, list]:
    """Codes of the strings of ``column`` by ``lookup``, and the strings not known.

    An unknown string gets ``-1`` or, with ``new_from``, the code it will get
    when added: ``new_from`` on, in order of first appearance.
    """
    uniques = list(dict.fromkeys(column))
    codes = [lookup(u) if isinstance(u, str) else None for u in uniques]
    unknown = [u for u, code in zip(uniques, codes) if code is None and isinstance(u, str)]
    fresh = iter(range(new_from, new_from + len(unknown))) if new_from is not None else None
    mapping = {u: code if code is not None else
               next(fresh) if fresh is not None and isinstance(u, str) else -1
               for u, code in zip(uniques, codes)}
    return np.fromiter(map(mapping.__getitem__, column), np.int64, len(column)), unknown


def as_of(write_slot: np.ndarray, written: np.ndarray, lookup_slot: np.ndarray,
           lookup_event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each lookup, what the last event before it wrote to its slot (or ``MISSING``).

    Event ``i`` writes ``written[i]`` to ``write_slot[i]``; lookup ``j`` reads
    ``lookup_slot[j]`` just before event ``lookup_event[j]``.  Also returns
    the events in slot order (by slot, then in time), for what is held at the end.
    """
    n = len(write_slot)
    slot = np.concatenate([write_slot, lookup_slot])
    order = np.argsort(slot * (2 * n + 2)
                       + np.concatenate([2 * np.arange(n) + 1, 2 * lookup_event]))
    sorted_slot = slot[order]
    last_write = np.maximum.accumulate(np.where(order < n, np.arange(len(order)), 0))
    writer = order[last_write]
    found = (writer < n) & (sorted_slot[last_write] == sorted_slot)
    is_lookup = order >= n
    result = np.empty(len(lookup_slot), np.int64)
    result[order[is_lookup] - n] = np.where(found, written[np.minimum(writer, n - 1)],
                                            MISSING)[is_lookup]
    return result, order[~is_lookup]


def values_of(window: np.ndarray, states: np.ndarray, base: int, store: PAGStore,
               column: str) -> np.ndarray:
    """A column's values for ``states``: from the window for its own, else from the store."""
    out = np.empty(len(states), window.dtype)
    inside = states >= base
    out[inside] = window[states[inside] - base]
    if not inside.all():
        out[~inside] = store.column(column, states[~inside])
    return out


def follow(values: np.ndarray, targets: np.ndarray, sources: np.ndarray,
            rule: Callable[[np.ndarray, np.ndarray], np.ndarray], base: int, store: PAGStore,
            column: str) -> None:
    """``values[targets] = rule(values of sources, at)``, each source an earlier state.

    ``at`` are the positions in ``targets`` the values are for.  A source may
    be a target itself (a copy of a copy): repeat until nothing changes, as
    many rounds as the longest such chain.
    """
    at = np.arange(len(targets))
    outside = sources < base
    if outside.any():
        values[targets[outside]] = rule(store.column(column, sources[outside]), at[outside])
    targets, sources, at = targets[~outside], sources[~outside] - base, at[~outside]
    for _ in range(len(targets) + 1):
        new = rule(values[sources], at)
        if np.array_equal(new, values[targets]):
            return
        values[targets] = new


def same(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """A copy takes its source's value."""
    return values


def extend(column, values: np.ndarray) -> None:
    """Append ``values`` to an :class:`array.array` column, converted to its type."""
    column.frombytes(memoryview(np.ascontiguousarray(values, dtype=column.typecode)).cast("B"))
