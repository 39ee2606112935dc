"""Event tuples put in columns: the encoder behind :class:`~crux_dask.columns.EventColumns`.

Every field of every event goes into one flat array first, so that a column
is one gather; every string of the batch goes into one table.  An event that
is not plain (a root, an annotated task, a task that used files or was sent twice,
a file's access, anything malformed) is marked ``OTHER`` and kept whole, for
the builder's one-by-one path to judge.
"""

from __future__ import annotations

from itertools import chain, count
from typing import Any

import numpy as np

from crux_dask.events import EVENT_KINDS, REQUIRED, Compute, Delete, Transfer

__all__ = ["COMPUTE", "DELETE", "EVENT_MOMENTS", "NONE", "NOT_RECORDED", "OTHER", "TRANSFER",
           "encode"]

#: Values of :attr:`EventColumns.kind`.
COMPUTE, TRANSFER, DELETE, OTHER = 0, 1, 2, 3
_KINDS = {"compute": COMPUTE, "transfer": TRANSFER, "delete": DELETE}
_C, _T, _D = ({name: i for i, name in enumerate(record._fields)}
              for record in (Compute, Transfer, Delete))
#: Each kind's fewest and most fields, the kind included.
_WIDTHS = {code: (REQUIRED[name] + 1, len(EVENT_KINDS[name]) + 1)
           for name, code in _KINDS.items()}
#: The integer columns and what stands for "none" in them.
NONE = -1
#: The moments an event carries (of a state's, :data:`~crux_dask.model.MOMENTS`): NaN
#: where not recorded.
EVENT_MOMENTS = ("requested", "received", "runnable")
#: The columns that are NaN where not recorded: the moments, a task's priority and
#: when the scheduler learnt it finished, and its CPU seconds and
#: wait for a core.
NOT_RECORDED = (*EVENT_MOMENTS, "priority", "announced", "cpu", "cpu_wait")


def encode(events: list) -> dict[str, Any]:
    """The columns of ``events``: the fields of :class:`~crux_dask.columns.EventColumns`.

    Raises whatever hostile input makes it raise; the caller keeps such
    events whole.

    Parameters
    ----------
    events : list
        Event tuples (or lists), as :mod:`crux_dask.events` describes them.

    Returns
    -------
    dict
        Each column by name, the table of strings (``strings``) and the
        events kept whole (``others``, by position).
    """
    rows = _Rows(events)
    numbers = _numeric_columns(rows)
    _mark_annotated(rows)
    c_inputs, input_count = _inputs(rows)
    strings, names, inputs = _string_columns(rows, c_inputs)
    return _keep_bad_whole(rows, events, dict(
        strings=strings, kind=rows.kind, **names, **numbers, input_count=input_count,
        inputs=inputs))


class _Rows:
    """The events of one :func:`encode`, laid out to be read a field at a time.

    Every field of every event is in one flat array: an event's fields start
    at its offset, so a column is one gather.  An event is of a plain kind
    (``kind``) if its first field names it and it has as many fields as the
    kind allows; ``compute``, ``transfer`` and ``delete`` are the positions of
    the events of each.  ``bad`` marks the events found not plain while their
    fields are read: they are kept whole.
    """

    __slots__ = ("bad", "compute", "delete", "flat", "kind", "lengths", "n", "offsets",
                 "transfer")

    def __init__(self, events: list) -> None:
        n = self.n = len(events)
        try:
            lengths = np.fromiter(map(len, events), np.int64, n)
        except TypeError:  # an event without a length: only lists and tuples go to columns
            events = [e if isinstance(e, (tuple, list)) else () for e in events]
            lengths = np.fromiter(map(len, events), np.int64, n)
        flat = np.fromiter(chain.from_iterable(events), object, int(lengths.sum()))
        offsets = np.cumsum(lengths) - lengths
        head = flat[np.minimum(offsets, max(len(flat) - 1, 0))] if len(flat) else flat
        kind = np.full(n, OTHER, np.int8)
        for name, code in _KINDS.items():
            fewest, most = _WIDTHS[code]
            kind[(lengths >= fewest) & (lengths <= most) & (head == name)] = code
        self.flat, self.lengths, self.offsets, self.kind = flat, lengths, offsets, kind
        self.compute, self.transfer, self.delete = (
            np.flatnonzero(kind == code) for code in (COMPUTE, TRANSFER, DELETE))
        self.bad = np.zeros(n, bool)

    def field(self, at: np.ndarray, index: int) -> list:
        """Field ``index`` of the events at positions ``at``."""
        return self.flat[self.offsets[at] + index].tolist()

    def trailing(self, at: np.ndarray, index: int) -> list:
        """A field that may be left out (then None)."""
        given = self.lengths[at] > index
        values = [None] * len(at)
        for i, value in zip(np.flatnonzero(given).tolist(), self.field(at[given], index)):
            values[i] = value
        return values

    def numbers(self, at: np.ndarray, index: int, number: type) -> np.ndarray:
        """A field that must be a ``number`` (``float``: finite); the events of others are bad."""
        values, wrong, _ = _numbers(self.field(at, index), number)
        self.bad[at] |= wrong
        return values

    def optional_integers(self, at: np.ndarray, values: list) -> np.ndarray:
        """An integer that may be None; a negative one given is left to one by one."""
        result, wrong, absent = _numbers(values, int, optional=True)
        self.bad[at] |= wrong | ((result < 0) if absent is None else (result < 0) & ~absent)
        return result

    def optional_numbers(self, at: np.ndarray, index: int) -> np.ndarray:
        """A number that may be None (NaN in the column); anything else not finite is bad."""
        values = self.trailing(at, index)
        if values.count(None) == len(values):
            return np.full(len(at), np.nan)
        present = np.fromiter((v is not None for v in values), bool, len(values))
        numbers, wrong, _ = _numbers([0.0 if v is None else v for v in values], float)
        self.bad[at] |= wrong | present & ~np.isfinite(numbers)
        return np.where(present, numbers, np.nan)


def _numeric_columns(rows: _Rows) -> dict[str, np.ndarray]:
    """The times, sizes, threads and roots, and the moments and priorities (NaN: none)."""
    n, ci, ti, di = rows.n, rows.compute, rows.transfer, rows.delete
    start, stop = np.zeros(n), np.zeros(n)
    nbytes = np.zeros(n, np.int64)
    thread = np.full(n, NONE, np.int64)
    root = np.full(n, NONE, np.int64)
    start[ci] = rows.numbers(ci, _C["start"], float)
    stop[ci] = rows.numbers(ci, _C["stop"], float)
    nbytes[ci] = rows.numbers(ci, _C["nbytes"], int)
    thread[ci] = rows.optional_integers(ci, rows.field(ci, _C["thread"]))
    root[ci] = rows.numbers(ci, _C["root"], int)
    start[ti] = rows.numbers(ti, _T["start"], float)
    stop[ti] = rows.numbers(ti, _T["stop"], float)
    nbytes[ti] = rows.optional_integers(ti, rows.trailing(ti, _T["nbytes"]))
    requested, received, runnable = (np.full(n, np.nan) for _ in EVENT_MOMENTS)
    requested[ci] = rows.optional_numbers(ci, _C["sent"])
    received[ci] = rows.optional_numbers(ci, _C["received"])
    runnable[ci] = rows.optional_numbers(ci, _C["runnable"])
    requested[ti] = rows.optional_numbers(ti, _T["requested"])
    priority, announced, cpu, cpu_wait = np.full((4, n), np.nan)
    priority[ci] = rows.optional_numbers(ci, _C["priority"])
    announced[ci] = rows.optional_numbers(ci, _C["announced"])
    cpu[ci] = rows.optional_numbers(ci, _C["cpu"])
    cpu_wait[ci] = rows.optional_numbers(ci, _C["cpu_wait"])
    start[di] = stop[di] = rows.numbers(di, _D["time"], float)
    return dict(start=start, stop=stop, nbytes=nbytes, thread=thread, root=root,
                requested=requested, received=received, runnable=runnable, priority=priority,
                announced=announced, cpu=cpu, cpu_wait=cpu_wait)


def _mark_annotated(rows: _Rows) -> None:
    """Mark bad the computations that go one by one: annotated, that used files, sent again."""
    ci = rows.compute
    for name in ("mutation", "location", "reads"):  # annotations
        rows.bad[ci] |= _is_not_none(rows.field(ci, _C[name]))
    rows.bad[ci] |= _is_not_none(rows.trailing(ci, _C["io"]))
    rows.bad[ci] |= _is_not_none(rows.trailing(ci, _C["first_requested"]))


def _inputs(rows: _Rows) -> tuple[list, np.ndarray]:
    """Each computation's inputs (a tuple or a list, else bad and none), and how many."""
    ci, nc = rows.compute, len(rows.compute)
    c_inputs = rows.field(ci, _C["inputs"])
    if not set(map(type, c_inputs)) <= {tuple, list}:
        rows.bad[ci] |= np.fromiter((type(v) not in (tuple, list) for v in c_inputs), bool, nc)
        c_inputs = [v if type(v) in (tuple, list) else () for v in c_inputs]
    input_count = np.zeros(rows.n, np.int64)
    input_count[ci] = np.fromiter(map(len, c_inputs), np.int64, nc)
    return c_inputs, input_count


def _string_columns(rows: _Rows, c_inputs: list) -> tuple[list[str], dict[str, np.ndarray],
                                                           np.ndarray]:
    """Every string in one table: the table, the columns that index it, the inputs' indices.

    Required strings (keys, locations) must be strings, else the event is
    bad; optional ones strings or None.  An input that is not a string has
    the index ``-1``, for :func:`_keep_bad_whole` to mark its computation.
    """
    n, ci, ti, di, bad = rows.n, rows.compute, rows.transfer, rows.delete, rows.bad
    plain = np.flatnonzero(rows.kind != OTHER)
    keys = rows.field(plain, _C["key"])  # the same place in every kind
    inputs = list(chain.from_iterable(c_inputs))
    places = [rows.field(ci, _C["worker"]), rows.field(ti, _T["destination"]),
              rows.field(di, _D["location"]), rows.field(ti, _T["source"])]
    maybe = {name: rows.field(ci, _C[name]) for name in ("label", "group", "origin")}
    # A queued task: the task whose end freed its slot, and that task's worker.
    maybe.update((name, rows.trailing(ci, _C[name])) for name in ("released_by", "released_on"))
    strings, key_codes, name_codes = _string_table(keys + inputs, [*places, *maybe.values()])
    c_worker, t_target, d_location, t_source, *optional_codes = name_codes
    key = np.full(n, NONE, np.int64)
    key[plain] = key_codes[:len(keys)]
    location = np.full(n, NONE, np.int64)
    location[ci], location[ti], location[di] = c_worker, t_target, d_location
    source = np.full(n, NONE, np.int64)
    source[ti] = t_source
    bad |= (key < 0) | (location < 0)
    bad[ti] |= t_source < 0
    columns = dict(key=key, location=location, source=source)
    columns.update(_optional_string_columns(rows, maybe, optional_codes))
    return strings, columns, key_codes[len(keys):]


def _optional_string_columns(rows: _Rows, values: dict[str, list], codes: list[np.ndarray]
                             ) -> dict[str, np.ndarray]:
    """The columns of a computation's strings that may be None (``values``, by name).

    ``codes`` are their indices in the string table; a computation with one
    that is neither a string nor None is bad.
    """
    ci = rows.compute
    columns = {}
    for (name, given), found in zip(values.items(), codes):
        column = np.full(rows.n, NONE, np.int64)
        column[ci] = found
        missing = np.flatnonzero(found < 0)
        if len(missing) and given.count(None) != len(missing):  # not a string
            named = _is_not_none(list(map(given.__getitem__, missing.tolist())))
            rows.bad[ci[missing[named]]] = True
        columns[name] = column
    return columns


def _keep_bad_whole(rows: _Rows, events: list, columns: dict[str, Any]) -> dict[str, Any]:
    """``columns`` with the bad events (and a computation with an input not a string) whole.

    They become ``OTHER``, lose their moments and inputs, and are kept in
    ``others``, by position, as ``events`` holds them.
    """
    bad, ci, kind = rows.bad, rows.compute, rows.kind
    input_count, inputs = columns["input_count"], columns["inputs"]
    input_event = np.repeat(ci, input_count[ci])
    bad[input_event[inputs < 0]] = True
    kind[bad] = OTHER
    for name in NOT_RECORDED:
        columns[name][bad] = np.nan
    columns["inputs"] = inputs[~bad[input_event]]
    input_count[bad] = 0
    whole = np.flatnonzero(kind == OTHER).tolist()
    columns["others"] = dict(zip(whole, map(events.__getitem__, whole)))
    return columns


def _string_table(keys: list, names: list[list]) -> tuple[list[str], np.ndarray,
                                                          list[np.ndarray]]:
    """One table of the distinct strings of ``keys`` and of the columns of ``names``.

    Returns the table, the index of each key in it and, for each column of
    names, the index of each name.  ``None`` and anything not a string get
    ``-1``.  Keys are many, names (locations, labels) few: each kind has its
    own dictionary, so the small one stays in the processor's cache, and a
    column of nothing but ``None`` is not looked at.  One dictionary probe per
    value is the dominant cost of encoding.
    """
    has = [column.count(None) != len(column) for column in names]
    given = [column for column, any_given in zip(names, has) if any_given]
    key_table, key_first = _first_uses(keys)
    name_table, name_first = _first_uses(list(chain.from_iterable(given)))
    # A key's index is the rank of its first use among the distinct keys.
    key_rank = np.zeros(len(keys) + 1, np.int64)
    key_rank[np.fromiter(key_table.values(), np.int64, len(key_table))] = np.arange(
        len(key_table))
    strings = list(key_table)
    name_index = np.empty(len(name_table), np.int64)
    for i, name in enumerate(name_table):
        arrival = key_table.get(name)
        if arrival is None:
            name_index[i] = len(strings)
            strings.append(name)
        else:
            name_index[i] = key_rank[arrival]
    name_rank = np.zeros(len(name_first) + 1, np.int64)
    name_rank[np.fromiter(name_table.values(), np.int64, len(name_table))] = name_index
    key_codes = np.where(key_first >= 0, key_rank[key_first], NONE)
    codes = iter(np.split(np.where(name_first >= 0, name_rank[name_first], NONE),
                          np.cumsum([len(column) for column in given])[:-1]))
    name_codes = [next(codes) if any_given else np.full(len(column), NONE, np.int64)
                  for column, any_given in zip(names, has)]
    types = list(map(type, strings))
    if types.count(str) == len(types):
        return strings, key_codes, name_codes
    is_text = np.fromiter((t is str for t in types), bool, len(types))
    index = np.full(len(strings) + 1, NONE, np.int64)  # the last one for None
    index[:-1][is_text] = np.arange(int(is_text.sum()))
    return ([u for u, text in zip(strings, is_text.tolist()) if text], index[key_codes],
            [index[codes] for codes in name_codes])


def _first_uses(values: list) -> tuple[dict, np.ndarray]:
    """A table of the distinct values, each with the number of its first use; every value's.

    ``None`` gets ``-1``; an unhashable value is replaced by :class:`_Unhashable`.
    """
    def probe(values: list) -> tuple[dict, np.ndarray]:
        table: dict = {None: NONE}
        first = np.fromiter(map(table.setdefault, values, count()), np.int64, len(values))
        del table[None]
        return table, first

    try:
        return probe(values)
    except TypeError:  # unhashable values: they and their events go one by one
        return probe([v if _hashable(v) else _Unhashable for v in values])


class _Unhashable:
    """Stands for an unhashable value among the strings (its event goes one by one)."""


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _is_not_none(values: list) -> np.ndarray:
    if values.count(None) == len(values):
        return np.zeros(len(values), bool)
    return np.fromiter((v is not None for v in values), bool, len(values))


def _numbers(column: list, number: type, optional: bool = False
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A numeric column, which of its values are not of that kind, and which are None.

    ``number`` is ``float`` (finite numbers) or ``int`` (64-bit integers);
    ``None`` is allowed where ``optional`` (it reads as ``NONE``).
    """
    dtype = np.float64 if number is float else np.int64
    n = len(column)
    if optional and column.count(None) == n:
        return np.full(n, NONE, dtype), np.zeros(n, bool), np.ones(n, bool)
    try:
        values = np.array(column)
    except (ValueError, TypeError, OverflowError):
        values = np.empty(0)
    if n and values.ndim == 1 and values.dtype.kind in ("iuf" if number is float else "i"):
        values = values.astype(dtype)
        wrong = ~np.isfinite(values) if number is float else np.zeros(n, bool)
        return values, wrong, None
    out = np.zeros(n, dtype)
    wrong = np.zeros(n, bool)
    absent = np.zeros(n, bool)
    for i, value in enumerate(column):
        if value is None and optional:
            out[i], absent[i] = NONE, True
        elif (type(value) is int and -2**63 <= value < 2**63) or (
                number is float and type(value) is float and value - value == 0.0):
            out[i] = value
        else:
            wrong[i] = True
    return out, wrong, absent
