"""Columnar, append-only storage of a program activity graph.

No Python object is kept per state or per mutation: every column is an
:class:`array.array` of machine numbers, and strings are dictionary-encoded into
small tables (:class:`~crux_dask.growable.StringTable`).  A state's id is its row number,
a mutation's id is its row number, and because a mutation is only ever
recorded towards a state created after its source, state ids are a
topological order of the graph.
"""

from __future__ import annotations

import pickle
import sys
from array import array
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from crux_dask.growable import Strings, StringTable
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

__all__ = ["NO_THREAD", "PAGStore"]

#: Sentinel for "no thread" in the integer thread column.
NO_THREAD = -1

_KIND_NAMES = np.array([k.name for k in MutationKind], dtype=object)

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
    again (``first_requested``), when the scheduler learnt it finished
    (``announced``), the CPU seconds its thread spent on it (``cpu``) and
    waited for a core (``cpu_wait``) and
    when its graph was ``submitted`` (NaN where not recorded, see
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
        self.state_announced = array("d")
        self.state_cpu = array("d")
        self.state_cpu_wait = array("d")
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
                if isinstance(value, (array, StringTable))}

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
                   if isinstance(value, array)}
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
            elif isinstance(value, array):
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

    def add_key(self, key: str, label: int, origin: int) -> int:
        """Like :meth:`key_code`, with the label and origin already encoded."""
        values = self.keys.values
        values.append(key)
        self.key_label.append(label)
        self.key_origin.append(origin)
        return len(values) - 1

    def nbytes(self) -> int:
        """Approximate memory held by the columns and string tables, in bytes."""
        columns = [v for v in vars(self).values() if isinstance(v, array)]
        tables = [self.keys, self.labels, self.locations, self.workers]
        return sum(sys.getsizeof(c) for c in columns) + sum(t.nbytes() for t in tables)

    # -- numpy access ---------------------------------------------------------
    def column(self, name: str, ids: np.ndarray | None = None) -> np.ndarray:
        """A numpy copy of one column (``state_time``, ``mutation_src``, ...).

        With ``ids``, only those rows, in that order.
        """
        view = np.asarray(getattr(self, name))
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
