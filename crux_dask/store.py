"""Columnar, append-only storage of a program activity graph.

No Python object is kept per state or per mutation: every column is an
:class:`array.array` of machine numbers (a :class:`ChunkedColumn` in a copy
appended to in blocks), and strings are dictionary-encoded into small
tables.  A state's id is its row number, a mutation's id is its row
number, and because a mutation is only ever recorded towards a state created
after its source, state ids are a topological order of the graph.
"""

from __future__ import annotations

import pickle
import sys
from array import array
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.model import (
    CAUSE_COLUMNS,
    MOMENT_COLUMNS,
    MOMENTS,
    MUTATION_COLUMNS,
    STATE_COLUMNS,
    CauseKind,
    MutationKind,
)

# pandas is imported where frames are made: a scheduler loads this module as it
# starts, and importing pandas takes a quarter of a second.
if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NO_CODE", "NO_THREAD", "ChunkedColumn", "PAGStore", "StringTable", "Strings"]

#: Sentinel for "no thread" in the integer thread column.
NO_THREAD = -1
#: Sentinel for "no string" in a dictionary-encoded column.
NO_CODE = -1

_KIND_NAMES = np.array([k.name for k in MutationKind], dtype=object)

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


#: What a store's columns are.
_COLUMNS = (array, ChunkedColumn)


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


class PAGStore:
    """The columns of one run's program activity graph.

    Parameters
    ----------
    run_id : str
        Identifier of the run the graph belongs to.

    Notes
    -----
    Per key (indexed by key code): ``key_label`` and ``key_origin``, codes
    into :attr:`labels`; every state of a key shares them.

    Per state: ``time`` (creation, seconds since the epoch in the scheduler's
    clock), ``start`` (when the operation that created it began), ``ready``
    (when it would have been there had every transfer on its way started as
    soon as its source existed: the time the critical path ranks inputs by),
    ``size``
    (bytes), ``key``/``location``/``worker`` (codes), ``thread`` and ``pred``:
    the mutation through which the state's last-arriving input came (``-1``
    for none).

    Per state too, the moments of the operation that made it
    (``requested``, ``received``, ``runnable``), the task's ``priority``, its
    seconds on files (``io``), when it was first sent where it was sent
    again (``first_requested``) and when its graph was ``submitted``
    (NaN where not recorded, see
    :data:`~crux_dask.model.MOMENT_COLUMNS`) and ``cause``: the cause through
    which the resource freed last came (``-1`` for none).

    Per cause: ``src``, ``dst`` (state ids) and ``kind``
    (:class:`~crux_dask.model.CauseKind` value).

    Per mutation: ``src``, ``dst`` (state ids), ``kind``
    (:class:`~crux_dask.model.MutationKind` value) and ``busy``.  A
    mutation is part of the operation that created its target, so its
    ``start``/``stop`` are the target's ``start``/``time``, and its ``cost``,
    ``key``, ``worker`` and ``thread`` are derived from its endpoints.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        #: The store this is a copy of (see :meth:`copy`), which goes on growing.
        self.origin: PAGStore | None = None
        self.keys = StringTable()  # codes are not unique per key: see key_code
        self.labels = StringTable()
        self.locations = StringTable()
        self.workers = StringTable()
        self.key_label = array("i")
        self.key_origin = array("i")
        self.state_time = array("d")
        self.state_start = array("d")
        self.state_ready = array("d")
        self.state_size = array("q")
        self.state_key = array("i")
        self.state_location = array("i")
        self.state_worker = array("i")
        self.state_thread = array("q")
        self.state_pred = array("i")
        self.mutation_src = array("i")
        self.mutation_dst = array("i")
        self.mutation_kind = array("b")
        self.mutation_busy = array("d")
        self.state_requested = array("d")
        self.state_received = array("d")
        self.state_runnable = array("d")
        self.state_priority = array("d")
        self.state_io = array("d")
        self.state_first_requested = array("d")
        self.state_submitted = array("d")
        self.state_cause = array("i")
        self.cause_src = array("i")
        self.cause_dst = array("i")
        self.cause_kind = array("b")

    @property
    def n_states(self) -> int:
        return len(self.state_time)

    @property
    def n_mutations(self) -> int:
        return len(self.mutation_src)

    def key_code(self, key: str, label: str, origin: str | None = None) -> int:
        """A new code for ``key``, labelled ``label``, from ``origin`` (default: label).

        Keys are not looked up: data computed again after it was released
        gets a second code for the same string, so no index of every key ever
        seen has to be kept.
        """
        values = self.keys.values
        values.append(key)
        label_code = self.labels.code(label)
        self.key_label.append(label_code)
        self.key_origin.append(label_code if origin is None else self.labels.code(origin))
        return len(values) - 1

    def lengths(self) -> dict[str, int]:
        """The length of every column and string table: a point :meth:`copy` can copy up to."""
        return {name: len(value.values if isinstance(value, StringTable) else value)
                for name, value in vars(self).items()
                if isinstance(value, (*_COLUMNS, StringTable))}

    def copy(self, upto: dict[str, int] | None = None) -> PAGStore:
        """An independent copy (columns and string tables), up to ``upto`` (:meth:`lengths`).

        The store only grows at its end, and it is read a piece at a time
        (:meth:`_parts`), so that a copy up to lengths taken between two
        events can be made in another thread while events go on being
        applied: it is the graph as it was then.
        """
        other = PAGStore(self.run_id)
        other.origin = self.origin or self
        columns, tables = self._headings(upto)
        for name, typecode in columns.items():
            setattr(other, name, array(typecode))
        for name, codes in tables.items():
            table = StringTable()
            table.codes = codes
            setattr(other, name, table)
        for name, part in self._parts(upto):
            column = getattr(other, name)
            if isinstance(column, array):
                column.frombytes(memoryview(part).cast("B"))
            else:
                column.values += part
        return other

    def to_pieces(self, upto: dict[str, int] | None = None) -> list[bytes]:
        """The store up to ``upto`` (:meth:`lengths`, default: all of it) as pickled pieces
        of about :data:`PIECE_BYTES` each (:meth:`from_pieces`).

        Read as :meth:`copy` reads it: a thread can cut the store while events
        go on being applied, and a server can send it a piece per message.
        """
        columns, tables = self._headings(upto)
        header = {"run_id": self.run_id, "columns": columns, "tables": tables}
        return [pickle.dumps(header), *(
            pickle.dumps((name, _join(part) if isinstance(part, list) else part.tobytes()))
            for name, part in self._parts(upto))]

    def _headings(self, upto: dict[str, int] | None) -> tuple[dict, dict]:
        """Each column's typecode, and each string table's codes up to ``upto``."""
        upto = self.lengths() if upto is None else upto
        columns = {name: value.typecode for name, value in vars(self).items()
                   if isinstance(value, _COLUMNS)}
        tables = {name: {v: c for v, c in list(value.codes.items()) if c < upto[name]}
                  for name, value in vars(self).items() if isinstance(value, StringTable)}
        return columns, tables

    def _parts(self, upto: dict[str, int] | None) -> Iterator[tuple[str, array | list[str]]]:
        """``(name, rows)``: every column and string table up to ``upto``, in slices of
        about :data:`PIECE_BYTES` bytes, each taken in one short call."""
        upto = self.lengths() if upto is None else upto
        for name, value in vars(self).items():
            if isinstance(value, StringTable):
                rows, step = value.values, _strings_per_piece(value.values)
            elif isinstance(value, _COLUMNS):
                rows, step = value, max(1, PIECE_BYTES // value.itemsize)
            else:
                continue
            for start in range(0, upto[name], step):
                yield name, rows[start:min(start + step, upto[name])]

    @classmethod
    def from_pieces(cls, pieces: list[bytes]) -> PAGStore:
        """The store :meth:`to_pieces` cut."""
        header = pickle.loads(pieces[0])
        store = cls(header["run_id"])
        columns = {name: array(code) for name, code in header["columns"].items()}
        tables = {name: StringTable() for name in header["tables"]}
        for piece in pieces[1:]:
            name, part = pickle.loads(piece)
            if name in columns:
                columns[name].frombytes(part)
            else:
                tables[name].values += _split(part)
        for name, table in tables.items():
            table.codes = header["tables"][name]
        vars(store).update(columns, **tables)
        return store

    @classmethod
    def chunked(cls, run_id: str) -> PAGStore:
        """An empty store of :class:`ChunkedColumn`: for a copy of a graph appended to in
        blocks, on an event loop."""
        store = cls(run_id)
        columns = [(name, value) for name, value in vars(store).items()
                   if isinstance(value, array)]
        for number, (name, value) in enumerate(columns):  # ready, each at a fill of its own
            setattr(store, name, ChunkedColumn(value.typecode,
                                               0.25 + 0.5 * number / len(columns)))
        return store

    def add_key(self, key: str, label: int, origin: int) -> int:
        """Like :meth:`key_code`, with the label and origin already encoded."""
        values = self.keys.values
        values.append(key)
        self.key_label.append(label)
        self.key_origin.append(origin)
        return len(values) - 1

    def nbytes(self) -> int:
        """Approximate memory held by the columns and string tables, in bytes."""
        columns = [v for v in vars(self).values() if isinstance(v, _COLUMNS)]
        tables = [self.keys, self.labels, self.locations, self.workers]
        return sum(sys.getsizeof(c) for c in columns) + sum(t.nbytes() for t in tables)

    # -- numpy access ---------------------------------------------------------
    def column(self, name: str, ids: np.ndarray | None = None) -> np.ndarray:
        """A numpy copy of one column (``state_time``, ``mutation_src``, ...).

        With ``ids``, only those rows, in that order.
        """
        values = getattr(self, name)
        if isinstance(values, ChunkedColumn):
            return values.take(ids)
        view = np.asarray(values)
        # Copy at once: a live view would stop the array from growing.
        return view.copy() if ids is None else view[ids]

    # -- snapshots -----------------------------------------------------------
    def states_frame(self, ids: np.ndarray | None = None) -> pd.DataFrame:
        """The data-state table, or its rows ``ids`` in that order.

        Columns: :data:`crux_dask.model.STATE_COLUMNS`.
        """
        import pandas as pd
        ids = np.arange(self.n_states) if ids is None else np.asarray(ids, dtype="int64")
        key = self.column("state_key", ids)
        return pd.DataFrame(
            {
                "state_id": ids,
                "run_id": pd.Series([self.run_id] * len(ids), dtype="str"),
                "key": self.keys.decode(key),
                "label": self.labels.decode(self.column("key_label", key)),
                "size": self.column("state_size", ids),
                "time": self.column("state_time", ids),
                "origin": self.labels.decode(self.column("key_origin", key)),
                "location": self.locations.decode(self.column("state_location", ids)),
                "worker": self.workers.decode(self.column("state_worker", ids)),
                "thread": _nullable(self.column("state_thread", ids)),
            }
        ).astype(STATE_COLUMNS)

    def mutations_frame(self, ids: np.ndarray | None = None) -> pd.DataFrame:
        """The data-mutation table, or its rows ``ids`` in that order.

        Columns: :data:`crux_dask.model.MUTATION_COLUMNS`.
        """
        import pandas as pd
        ids = np.arange(self.n_mutations) if ids is None else np.asarray(ids, dtype="int64")
        src = self.column("mutation_src", ids).astype("int64")
        dst = self.column("mutation_dst", ids).astype("int64")
        stop = self.column("state_time", dst)
        return pd.DataFrame(
            {
                "mutation_id": ids,
                "run_id": pd.Series([self.run_id] * len(ids), dtype="str"),
                "src": src,
                "dst": dst,
                "kind": pd.Series(_KIND_NAMES[self.column("mutation_kind", ids)],
                                  dtype="str"),
                "cost": stop - self.column("state_time", src),
                "busy": self.column("mutation_busy", ids),
                "start": self.column("state_start", dst),
                "stop": stop,
                "key": self.keys.decode(self.column("state_key", dst)),
                "worker": self.workers.decode(self.column("state_worker", dst)),
                "thread": _nullable(self.column("state_thread", dst)),
            }
        ).astype(MUTATION_COLUMNS)

    @property
    def n_causes(self) -> int:
        return len(self.cause_src)

    def causes_frame(self, ids: np.ndarray | None = None) -> pd.DataFrame:
        """The cause table, or its rows ``ids`` in that order.

        Columns: :data:`crux_dask.model.CAUSE_COLUMNS`.
        """
        import pandas as pd
        ids = np.arange(self.n_causes) if ids is None else np.asarray(ids, dtype="int64")
        return pd.DataFrame({
            "cause_id": ids,
            "run_id": pd.Series([self.run_id] * len(ids), dtype="str"),
            "src": self.column("cause_src", ids).astype("int64"),
            "dst": self.column("cause_dst", ids).astype("int64"),
            "kind": pd.Series(_CAUSE_NAMES[self.column("cause_kind", ids)], dtype="str"),
        }).astype(CAUSE_COLUMNS)

    def moments_frame(self) -> pd.DataFrame:
        """The moments of the states that have any (:data:`crux_dask.model.MOMENT_COLUMNS`)."""
        import pandas as pd
        moments = {name: self.column(f"state_{name}") for name in MOMENTS}
        ids = np.flatnonzero(~np.all([np.isnan(v) for v in moments.values()], axis=0)) if (
            self.n_states) else np.zeros(0, np.int64)
        return pd.DataFrame({
            "state_id": ids,
            "run_id": pd.Series([self.run_id] * len(ids), dtype="str"),
            **{name: values[ids] for name, values in moments.items()},
        }).astype(MOMENT_COLUMNS)


_CAUSE_NAMES = np.array([k.name for k in CauseKind], dtype=object)

#: About how many bytes a piece of :meth:`PAGStore.to_pieces` holds.  Whoever receives
#: a piece unpickles it in one call, holding the interpreter, and the first touch of
#: the memory it fills costs more than the copy: 10 MB of keys at once held a
#: scheduler's event loop about 10 ms, a megabyte 4 ms when its pages were new.
PIECE_BYTES = 1 << 19


def _strings_per_piece(values: Strings) -> int:
    """How many strings of ``values`` make about :data:`PIECE_BYTES` (from a sample of
    about a thousand)."""
    sample = values[::max(1, len(values) // 1024)]
    mean = sum(map(len, sample)) / len(sample) if sample else 1.0
    return max(1, int(PIECE_BYTES / max(mean, 1.0)))


def _join(keys: list[str]) -> str | list[str]:
    """Keys as one string, NUL between them; the list itself if a key holds a NUL."""
    joined = "\0".join(keys)
    return joined if joined.count("\0") == len(keys) - 1 else keys


def _split(chunk: str | list[str]) -> list[str]:
    """The keys :func:`_join` made one (of a chunk of at least one key)."""
    return chunk if isinstance(chunk, list) else chunk.split("\0")


def _nullable(thread: np.ndarray) -> pd.arrays.IntegerArray:
    """Thread ids as a nullable integer array (``NO_THREAD`` becomes missing)."""
    import pandas as pd
    return pd.arrays.IntegerArray(thread.astype("int64"), thread == NO_THREAD)
