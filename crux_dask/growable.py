"""Growable string and number columns: append-only, in chunks, out of the collector's way.

A :class:`Strings` is a list of strings that only grows, every
:data:`STRINGS_CHUNK` of them frozen into a numpy array the garbage collector
never walks; a :class:`StringTable` dictionary-encodes strings into dense
integer codes over one.  Each is safe to read from a thread up to the length it
had while it is appended to.  :class:`~crux_dask.store.PAGStore` is made of
them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

# pandas is imported where frames are made: a scheduler loads this module as it
# starts, and importing pandas takes a quarter of a second.
if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NO_CODE", "StringTable", "Strings"]

#: Sentinel for "no string" in a dictionary-encoded column.
NO_CODE = -1

#: Strings per chunk of :class:`Strings` (a power of two).
STRINGS_CHUNK = 1 << 14
_SHIFT = STRINGS_CHUNK.bit_length() - 1
_MASK = STRINGS_CHUNK - 1


class Strings:
    """A list of strings that only grows, out of the garbage collector's way.

    A full collection reads every element of every list a process holds: a
    graph's keys, one or more per task, would add about 13 ms per million to
    each full collection of the scheduler that keeps the graph, and hold its
    event loop that much longer.  The collector never walks a numpy array:
    every :data:`STRINGS_CHUNK` strings become one, and only the newest are a
    list.  Reads as a list: by index, by slice (a list), in order, and as a
    numpy array (``np.asarray``).

    Safe to read from a thread up to the length it had, while strings are
    appended: the chunks, their count and the newest strings change together,
    in one assignment.
    """

    __slots__ = ("_state",)

    def __init__(self, values: Iterable[str] = ()) -> None:
        # (chunks, strings in them, the newest strings)
        self._state: tuple[list[np.ndarray], int, list[str]] = ([], 0, [])
        self.extend(values)

    def __len__(self) -> int:
        _, frozen, newest = self._state
        return frozen + len(newest)

    def append(self, value: str) -> None:
        newest = self._state[2]
        newest.append(value)
        if len(newest) == STRINGS_CHUNK:
            self._freeze()

    def extend(self, values: Iterable[str]) -> None:
        values = values if isinstance(values, list) else list(values)
        start = 0
        while start < len(values):
            newest = self._state[2]
            room = STRINGS_CHUNK - len(newest)
            newest += values[start:start + room]
            start += room
            if len(newest) == STRINGS_CHUNK:
                self._freeze()

    def __iadd__(self, values: Iterable[str]) -> Strings:
        self.extend(values)
        return self

    def _freeze(self) -> None:
        chunks, frozen, newest = self._state
        chunk = np.fromiter(newest, dtype=object, count=len(newest))
        # New lists: a thread may be reading the old ones.
        self._state = ([*chunks, chunk], frozen + len(newest), [])

    def __getitem__(self, index: Any) -> Any:
        chunks, frozen, newest = self._state
        if isinstance(index, slice):
            start, stop, step = index.indices(frozen + len(newest))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return _gather(chunks, frozen, newest, start, stop)
        if index < 0:
            index += frozen + len(newest)
            if index < 0:
                raise IndexError("Strings index out of range")
        if index < frozen:
            return chunks[index >> _SHIFT][index & _MASK]
        return newest[index - frozen]

    def take(self, indices: np.ndarray) -> np.ndarray:
        """The strings at ``indices`` (integers, each in range), as an array of objects:
        a chunk's at once, not an index at a time."""
        chunks, frozen, newest = self._state
        taken = np.empty(len(indices), dtype=object)
        old = indices < frozen
        if old.any():
            picked = indices[old]
            which, within = picked >> _SHIFT, picked & _MASK
            found = np.empty(len(picked), dtype=object)
            for number in np.unique(which).tolist():
                here = which == number
                found[here] = chunks[number][within[here]]
            taken[old] = found
        if not old.all():
            taken[~old] = [newest[i - frozen] for i in indices[~old].tolist()]
        return taken

    def tolist(self) -> list[str]:
        """Every string, in a list."""
        chunks, frozen, newest = self._state
        return _gather(chunks, frozen, newest, 0, frozen + len(newest))

    def __iter__(self) -> Iterator[str]:
        chunks, _, newest = self._state
        for chunk in chunks:
            yield from chunk.tolist()
        yield from newest[:]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        chunks, _, newest = self._state
        tail = np.fromiter(newest, dtype=object, count=len(newest))
        return np.concatenate([*chunks, tail]) if chunks else tail

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Strings):
            other = list(other)
        return isinstance(other, list) and len(other) == len(self) and list(self) == other

    __hash__ = None  # type: ignore[assignment]

    def __sizeof__(self) -> int:
        chunks, _, newest = self._state
        return object.__sizeof__(self) + sum(c.nbytes for c in chunks) + sys.getsizeof(newest)

    def __repr__(self) -> str:
        return f"Strings({len(self)} strings)"


def _gather(chunks: list[np.ndarray], frozen: int, newest: list[str], start: int,
            stop: int) -> list[str]:
    """Strings ``start`` to ``stop`` of a :class:`Strings`' state, as a list."""
    out: list[str] = []
    while start < min(stop, frozen):
        offset = start & _MASK
        take = min(stop - start, STRINGS_CHUNK - offset)
        out += chunks[start >> _SHIFT][offset:offset + take].tolist()
        start += take
    if start < stop:
        out += newest[start - frozen:stop - frozen]
    return out


class StringTable:
    """Dictionary encoding of strings to dense integer codes.

    Attributes
    ----------
    values : Strings
        The string of each code.
    codes : dict
        The code of each string.
    """

    __slots__ = ("codes", "values")

    def __init__(self, values: list[str] | None = None) -> None:
        self.values = Strings()
        self.codes: dict[str, int] = {}
        for value in values or ():
            self.code(value)

    def code(self, value: str) -> int:
        """Return the code of ``value``, adding it if new."""
        code = self.codes.get(value)
        if code is None:
            code = self.codes[value] = len(self.values)
            self.values.append(value)
        return code

    def __len__(self) -> int:
        return len(self.values)

    def decode(self, codes: np.ndarray) -> pd.Series:
        """Strings of ``codes`` (``NO_CODE`` becomes missing) as a string Series."""
        import pandas as pd
        values = self.values
        if len(codes) * 8 < len(values):  # a few rows of a large table
            codes = np.asarray(codes)
            strings = np.full(len(codes), None, dtype=object)
            present = codes >= 0
            strings[present] = values.take(codes[present])
        else:
            strings = np.append(np.asarray(values), None)[codes]
        return pd.Series(strings, dtype="str")

    def nbytes(self) -> int:
        """Approximate memory held by the table, in bytes (the strings' from a sample of
        about a thousand: it is asked for on a scheduler's event loop)."""
        values = self.values
        total = sys.getsizeof(values) + sys.getsizeof(self.codes)
        if not values:
            return total
        sample = values[::max(1, len(values) // 1024)]
        return total + len(values) * sum(map(sys.getsizeof, sample)) // len(sample)
