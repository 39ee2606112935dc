"""Growable string and number columns: append-only, in chunks, out of the collector's way.

A :class:`Strings` is a list of strings that only grows, every
:data:`STRINGS_CHUNK` of them frozen into a numpy array the garbage collector
never walks; a :class:`StringTable` dictionary-encodes strings into dense
integer codes over one; a :class:`ChunkedColumn` is a column of machine
numbers kept in chunks of :data:`COLUMN_CHUNK` rows, so that appending never
moves what is there.  Each is safe to read from a thread up to the length it
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

__all__ = ["NO_CODE", "ChunkedColumn", "StringTable", "Strings"]

#: Sentinel for "no string" in a dictionary-encoded column.
NO_CODE = -1

#: Strings per chunk of :class:`Strings` (a power of two).
STRINGS_CHUNK = 1 << 14
_SHIFT = STRINGS_CHUNK.bit_length() - 1
_MASK = STRINGS_CHUNK - 1
#: Rows per chunk of a :class:`ChunkedColumn` (a power of two): half a megabyte of
#: 8-byte numbers, under the 4 MiB from which numpy asks for huge pages.
COLUMN_CHUNK = 1 << 16
#: The memory page size (the kernel allocates a chunk's memory a page at a time).
PAGE_BYTES = 4096
_COLUMN_SHIFT = COLUMN_CHUNK.bit_length() - 1
_COLUMN_MASK = COLUMN_CHUNK - 1


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


class ChunkedColumn:
    """A column of machine numbers kept in chunks: appending never moves what is there.

    An :class:`array.array` that is full grows by about a sixteenth and
    copies itself, and the state columns of a store all have the same
    length: at a million states, all seventeen copy themselves in the same
    append, 10-24 ms.  A column that doubles its room instead still copies
    itself into fresh memory, and the first touch of fresh memory is what
    costs: numpy asks the kernel for huge pages from 4 MiB on, and a first
    touch of one took up to 15 ms in a scheduler's process.  Here the rows
    go into chunks of :data:`COLUMN_CHUNK` rows, under that size: an append
    writes only its own rows.  The next chunk is allocated, and its pages
    touched, once the last is ``ready_at`` full: the columns of a store, which
    fill together, each at a fill of its own, so that no append faults in the
    next chunks of them all at once (a fault costs several microseconds here,
    and a chunk of 8-byte numbers has 128 pages).

    Reads like an array of its type: ``len``, by index (a Python number) or
    slice (numpy), :meth:`tobytes`, ``np.asarray`` (a copy unless one chunk
    holds every row) and :meth:`take`.  Safe to read from a thread up to the
    length it had: the chunks and the length change in one assignment, and
    an append writes only past the length.

    Parameters
    ----------
    typecode : str
        The :mod:`array` type code of the numbers.
    ready_at : float
        How full the last chunk is (a fraction) when the next is made ready.
    """

    __slots__ = ("_next", "_ready_at", "_state", "typecode")

    def __init__(self, typecode: str, ready_at: float = 0.5) -> None:
        self.typecode = typecode
        self._state: tuple[tuple[np.ndarray, ...], int] = ((), 0)  # (chunks, rows)
        self._ready_at = int(ready_at * COLUMN_CHUNK)
        self._next: np.ndarray | None = None  # the next chunk, its pages touched

    def __len__(self) -> int:
        return self._state[1]

    @property
    def itemsize(self) -> int:
        """Bytes per number."""
        return np.dtype(self.typecode).itemsize

    @property
    def chunks(self) -> tuple[np.ndarray, ...]:
        """The chunks, each of :data:`COLUMN_CHUNK` rows, the last filled up to the length."""
        return self._state[0]

    def frombytes(self, data: Any) -> None:
        """Append the numbers in ``data`` (a bytes-like object of this type's numbers)."""
        rows = np.frombuffer(data, self.typecode)
        chunks, length = self._state
        added: list[np.ndarray] = []
        last = chunks[-1] if chunks else None
        done = 0
        while done < len(rows):
            offset = (length + done) & _COLUMN_MASK
            if offset == 0:
                last, self._next = self._next if self._next is not None else self._chunk(), None
                added.append(last)
            take = min(len(rows) - done, COLUMN_CHUNK - offset)
            last[offset:offset + take] = rows[done:done + take]
            done += take
        self._state = (chunks + tuple(added), length + len(rows))
        if self._next is None and (length + done) & _COLUMN_MASK >= self._ready_at:
            self._next = self._chunk()

    def _chunk(self) -> np.ndarray:
        """A new chunk, its pages touched (written once each)."""
        chunk = np.empty(COLUMN_CHUNK, self.typecode)
        chunk.view(np.uint8)[::PAGE_BYTES] = 0
        return chunk

    def _rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start`` to ``stop`` (``0 <= start <= stop <= len``): a view of one chunk,
        or a copy of those they span."""
        chunks = self._state[0]
        if start == stop:
            return np.empty(0, self.typecode)
        first, last = start >> _COLUMN_SHIFT, (stop - 1) >> _COLUMN_SHIFT
        lo, hi = start & _COLUMN_MASK, ((stop - 1) & _COLUMN_MASK) + 1
        if first == last:
            return chunks[first][lo:hi]
        return np.concatenate([chunks[first][lo:], *chunks[first + 1:last], chunks[last][:hi]])

    def __getitem__(self, index: Any) -> Any:
        length = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(length)
            if step != 1:
                return self._rows(0, length)[index]
            return self._rows(start, max(start, stop))
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError("column index out of range")
        return self._state[0][index >> _COLUMN_SHIFT][index & _COLUMN_MASK].item()

    def take(self, ids: np.ndarray | None = None) -> np.ndarray:
        """A new array of every row, or of rows ``ids`` in that order."""
        length = len(self)
        if ids is None or len(ids) * 8 > length:  # most of the column: all of it, once
            rows = self._rows(0, length)
            return rows.copy() if ids is None else rows[ids]
        ids = np.asarray(ids, np.int64)
        ids = np.where(ids < 0, ids + length, ids)
        if len(ids) and (ids.min() < 0 or ids.max() >= length):
            raise IndexError("column index out of range")
        out = np.empty(len(ids), self.typecode)
        which = ids >> _COLUMN_SHIFT
        for chunk in np.unique(which).tolist():
            mine = which == chunk
            out[mine] = self._state[0][chunk][ids[mine] & _COLUMN_MASK]
        return out

    def tobytes(self) -> bytes:
        return self._rows(0, len(self)).tobytes()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        rows = self._rows(0, len(self))
        if len(self._state[0]) == 1:  # a view of the chunk: read only
            rows = rows.view()
            rows.flags.writeable = False
        return rows if dtype is None and not copy else np.array(rows, dtype)

    def __sizeof__(self) -> int:
        return object.__sizeof__(self) + sum(chunk.nbytes for chunk in self._state[0])

    def __repr__(self) -> str:
        return f"ChunkedColumn({self.typecode!r}, {len(self)} rows)"




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
