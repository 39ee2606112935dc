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

__all__ = ["COMPUTE", "DELETE", "MOMENTS", "NONE", "NOT_RECORDED", "OTHER", "TRANSFER",
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
#: The columns of moments: NaN where not recorded.
MOMENTS = ("requested", "received", "runnable")
#: The columns that are NaN where not recorded: the moments and a task's priority.
NOT_RECORDED = (*MOMENTS, "priority")


def encode(events: list) -> dict[str, Any]:
    """The columns of ``events``: the fields of :class:`~crux_dask.columns.EventColumns`.

    Raises whatever hostile input makes it raise; the caller keeps such
    events whole.
    """
    originals = events
    n = len(events)
    try:
        lengths = np.fromiter(map(len, events), np.int64, n)
    except TypeError:  # an event without a length: only lists and tuples go to columns
        events = [e if isinstance(e, (tuple, list)) else () for e in events]
        lengths = np.fromiter(map(len, events), np.int64, n)
    # Every field of every event in one flat array: an event's fields start at
    # its offset, so a column is one gather.
    flat = np.fromiter(chain.from_iterable(events), object, int(lengths.sum()))
    offsets = np.cumsum(lengths) - lengths
    head = flat[np.minimum(offsets, max(len(flat) - 1, 0))] if len(flat) else flat
    kind = np.full(n, OTHER, np.int8)
    for name, code in _KINDS.items():
        fewest, most = _WIDTHS[code]
        kind[(lengths >= fewest) & (lengths <= most) & (head == name)] = code
    ci, ti, di = (np.flatnonzero(kind == code) for code in (COMPUTE, TRANSFER, DELETE))
    nc = len(ci)
    bad = np.zeros(n, bool)

    def field(at: np.ndarray, index: int) -> list:
        return flat[offsets[at] + index].tolist()

    def trailing(at: np.ndarray, index: int) -> list:
        """A field that may be left out (then None)."""
        given = lengths[at] > index
        values = [None] * len(at)
        for i, value in zip(np.flatnonzero(given).tolist(), field(at[given], index)):
            values[i] = value
        return values

    def moments(at: np.ndarray, index: int) -> np.ndarray:
        """A number that may be None (NaN in the column); anything else not finite is bad."""
        values = trailing(at, index)
        if values.count(None) == len(values):
            return np.full(len(at), np.nan)
        present = np.fromiter((v is not None for v in values), bool, len(values))
        numbers, wrong, _ = _numbers([0.0 if v is None else v for v in values], float)
        bad[at] |= wrong | present & ~np.isfinite(numbers)
        return np.where(present, numbers, np.nan)

    def numbers(at: np.ndarray, index: int, number: type) -> np.ndarray:
        values, wrong, _ = _numbers(field(at, index), number)
        bad[at] |= wrong
        return values

    def optional(at: np.ndarray, values: list) -> np.ndarray:
        """An integer that may be None; a negative one given is left to one by one."""
        result, wrong, absent = _numbers(values, int, optional=True)
        bad[at] |= wrong | ((result < 0) if absent is None else (result < 0) & ~absent)
        return result

    start, stop = np.zeros(n), np.zeros(n)
    nbytes = np.zeros(n, np.int64)
    thread = np.full(n, NONE, np.int64)
    root = np.full(n, NONE, np.int64)
    start[ci], stop[ci] = numbers(ci, _C["start"], float), numbers(ci, _C["stop"], float)
    nbytes[ci] = numbers(ci, _C["nbytes"], int)
    thread[ci] = optional(ci, field(ci, _C["thread"]))
    root[ci] = numbers(ci, _C["root"], int)
    start[ti], stop[ti] = numbers(ti, _T["start"], float), numbers(ti, _T["stop"], float)
    nbytes[ti] = optional(ti, trailing(ti, _T["nbytes"]))
    requested, received, runnable = (np.full(n, np.nan) for _ in _MOMENTS)
    requested[ci] = moments(ci, _C["sent"])
    received[ci] = moments(ci, _C["received"])
    runnable[ci] = moments(ci, _C["runnable"])
    requested[ti] = moments(ti, _T["requested"])
    priority = np.full(n, np.nan)
    priority[ci] = moments(ci, _C["priority"])
    start[di] = stop[di] = numbers(di, _D["time"], float)
    for name in ("mutation", "location", "reads"):  # annotations: one by one
        bad[ci] |= _is_not_none(field(ci, _C[name]))
    bad[ci] |= _is_not_none(trailing(ci, _C["io"]))  # a task that used files: one by one
    bad[ci] |= _is_not_none(trailing(ci, _C["first_requested"]))  # and one sent again
    c_inputs = field(ci, _C["inputs"])
    if not set(map(type, c_inputs)) <= {tuple, list}:
        bad[ci] |= np.fromiter((type(v) not in (tuple, list) for v in c_inputs), bool, nc)
        c_inputs = [v if type(v) in (tuple, list) else () for v in c_inputs]
    input_count = np.zeros(n, np.int64)
    input_count[ci] = np.fromiter(map(len, c_inputs), np.int64, nc)

    # Every string, in one table: required ones must be strings, optional
    # ones strings or None.
    plain = np.flatnonzero(kind != OTHER)
    keys = field(plain, _C["key"])  # the same place in every kind
    inputs = list(chain.from_iterable(c_inputs))
    places = [field(ci, _C["worker"]), field(ti, _T["destination"]),
              field(di, _D["location"]), field(ti, _T["source"])]
    maybe = {name: field(ci, _C[name]) for name in ("label", "group", "origin")}
    # A queued task: the task whose end freed its slot, and that task's worker.
    maybe.update((name, trailing(ci, _C[name])) for name in ("released_by", "released_on"))
    strings, key_codes, name_codes = _string_table(keys + inputs, [*places, *maybe.values()])
    key_, inputs = key_codes[:len(keys)], key_codes[len(keys):]
    c_worker, t_target, d_location, t_source, *optional_names = name_codes
    key = np.full(n, NONE, np.int64)
    key[plain] = key_
    location = np.full(n, NONE, np.int64)
    location[ci], location[ti], location[di] = c_worker, t_target, d_location
    source = np.full(n, NONE, np.int64)
    source[ti] = t_source
    bad |= (key < 0) | (location < 0)
    bad[ti] |= t_source < 0
    input_event = np.repeat(ci, input_count[ci])
    bad[input_event[inputs < 0]] = True
    columns = dict(zip(maybe, optional_names))
    for name, values in columns.items():
        column = np.full(n, NONE, np.int64)
        column[ci] = values
        missing = np.flatnonzero(values < 0)
        if len(missing) and maybe[name].count(None) != len(missing):  # not a string
            given = _is_not_none(list(map(maybe[name].__getitem__, missing.tolist())))
            bad[ci[missing[given]]] = True
        columns[name] = column

    kind[bad] = OTHER
    for column in (requested, received, runnable, priority):
        column[bad] = np.nan
    dropped = bad[input_event]
    input_count[bad] = 0
    whole = np.flatnonzero(kind == OTHER).tolist()
    original = dict(zip(whole, map(originals.__getitem__, whole)))
    return dict(strings=strings, kind=kind, key=key, location=location, source=source,
                start=start, stop=stop, nbytes=nbytes, thread=thread, root=root,
                input_count=input_count, inputs=inputs[~dropped], requested=requested,
                received=received, runnable=runnable, priority=priority, others=original,
                **columns)


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


_MOMENTS = ("requested", "received", "runnable")
