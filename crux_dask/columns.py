"""Events in columns: the form a batch of events is planned and sent in.

A list of event tuples holds a Python object per field of every event; the
builder's windows need the fields as arrays and the strings as small integers.
:class:`EventColumns` holds the three plain kinds (``compute``, ``transfer``,
``delete``) as numpy columns, with every string of the batch (keys, locations,
workers, labels) in one table that the columns index.  A producer that encodes
its events this way (a worker, before sending them) saves the receiver from
flattening tuples and looking every string up; the receiver then maps each
*distinct* string once.

Anything else (a root, an annotated task, a malformed event) is kept whole,
by position, in :attr:`EventColumns.others`, and the builder applies it one by
one as before.  :meth:`EventColumns.event` gives back every event as a tuple
equal to the one encoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, count
from typing import Any

import numpy as np

from crux_dask.events import EVENT_KINDS, REQUIRED, Compute, Delete, Event, Transfer

__all__ = ["COLUMNS_FROM", "COMPUTE", "DELETE", "OTHER", "TRANSFER", "EventColumns"]

#: From how many events on columns pay: putting events in columns, sending them
#: and planning a window from them cost about a millisecond whatever their
#: number, which fewer events than this would not repay.
COLUMNS_FROM = 512
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
#: The numeric and string-index columns, with their dtypes, in wire order.
COLUMNS: dict[str, str] = {
    "kind": "i1", "key": "i8", "location": "i8", "source": "i8", "start": "f8",
    "stop": "f8", "nbytes": "i8", "thread": "i8", "root": "i8", "label": "i8",
    "group": "i8", "origin": "i8", "input_count": "i8", "inputs": "i8", "requested": "f8",
    "received": "f8", "runnable": "f8",
}


@dataclass(eq=False)
class EventColumns:
    """A batch of events in columns.

    Every column has one row per event except ``inputs``, which holds the
    inputs of all computations one after the other (``input_count`` of them
    per event).  String columns hold indices into :attr:`strings`, ``-1`` for
    none.

    Attributes
    ----------
    strings : list of str
        Every string the columns refer to, once.
    kind : ndarray of int8
        ``COMPUTE``, ``TRANSFER``, ``DELETE``, or ``OTHER`` for an event kept
        whole in :attr:`others`.
    key : ndarray
        The data's key.
    location : ndarray
        A computation's worker, a transfer's destination, a release's location.
    source : ndarray
        A transfer's source location.
    start, stop : ndarray of float64
        When the work started and stopped; a release's time in both.
    nbytes : ndarray
        Size in bytes; ``-1`` for a transfer that does not say.
    thread : ndarray
        A computation's thread, ``-1`` for none.
    root : ndarray
        The root state a computation without inputs hangs from.
    label, group, origin : ndarray
        A computation's label, task group and origin, ``-1`` for none.
    input_count, inputs : ndarray
        A computation's inputs.
    requested, received, runnable : ndarray of float64
        The moments of a computation (``requested``: when the scheduler sent
        it) and of a transfer (``requested``: when its destination asked for
        it); NaN where not recorded.
    others : dict of int to tuple
        Events of any other form, by position.
    """

    strings: list[str]
    kind: np.ndarray
    key: np.ndarray
    location: np.ndarray
    source: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    nbytes: np.ndarray
    thread: np.ndarray
    root: np.ndarray
    label: np.ndarray
    group: np.ndarray
    origin: np.ndarray
    input_count: np.ndarray
    inputs: np.ndarray
    requested: np.ndarray
    received: np.ndarray
    runnable: np.ndarray
    others: dict[int, Any] = field(default_factory=dict)
    _input_offset: np.ndarray | None = field(default=None, repr=False)
    #: Codes of the strings in one builder's tables, filled as windows look them up.
    _codes: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _codes_for: Any = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def input_offset(self) -> np.ndarray:
        """Where each event's inputs start in :attr:`inputs` (one more entry at the end)."""
        if self._input_offset is None:
            offset = np.zeros(len(self) + 1, np.int64)
            np.cumsum(self.input_count, out=offset[1:])
            self._input_offset = offset
        return self._input_offset

    def codes(self, table: str, owner: Any) -> np.ndarray:
        """The cache of ``table`` codes of :attr:`strings` for ``owner`` (``-1``: not known)."""
        if self._codes_for is not owner:
            self._codes, self._codes_for = {}, owner
        cache = self._codes.get(table)
        if cache is None:
            cache = self._codes[table] = np.full(len(self.strings), NONE, np.int64)
        return cache

    # -- back to tuples ---------------------------------------------------------
    def event(self, i: int) -> Event:
        """Event ``i``, as it was encoded."""
        kind = int(self.kind[i])
        if kind == OTHER:
            return self.others[i]
        s = self.strings
        key, location = s[self.key[i]], s[self.location[i]]
        start, stop = float(self.start[i]), float(self.stop[i])
        if kind == DELETE:
            return Delete("delete", key, location, start)
        nbytes = int(self.nbytes[i])
        requested = _moment(self.requested[i])
        if kind == TRANSFER:
            return Transfer("transfer", key, s[self.source[i]], location, start, stop,
                            None if nbytes == NONE else nbytes, requested)
        offset = self.input_offset
        inputs = tuple(s[j] for j in self.inputs[offset[i]:offset[i + 1]].tolist())
        thread, label, group, origin = (int(self.thread[i]), int(self.label[i]),
                                        int(self.group[i]), int(self.origin[i]))
        return Compute("compute", key, location, None if thread == NONE else thread, start,
                       stop, nbytes, inputs, int(self.root[i]),
                       None if label == NONE else s[label], None if group == NONE else s[group],
                       None, None, None if origin == NONE else s[origin], None, requested,
                       _moment(self.received[i]), _moment(self.runnable[i]))

    def events(self) -> list[Event]:
        """Every event, as tuples."""
        return [self.event(i) for i in range(len(self))]

    # -- building -------------------------------------------------------------
    @classmethod
    def from_events(cls, events: list) -> EventColumns:
        """Encode event tuples; whatever is not a plain event is kept whole.

        Never raises: events that cannot be read as columns all go to
        :attr:`others`, where the builder's one-by-one path judges them.
        """
        try:
            return _encode(events)
        except Exception:  # something hostile in there: keep everything whole
            n = len(events)
            columns = {name: np.full(n, NONE, np.int64) for name in COLUMNS}
            columns.update(kind=np.full(n, OTHER, np.int8), start=np.zeros(n),
                           stop=np.zeros(n), input_count=np.zeros(n, np.int64),
                           inputs=np.zeros(0, np.int64),
                           **{name: np.full(n, np.nan) for name in _MOMENTS})
            return cls([], **columns, others=dict(enumerate(events)))

    @classmethod
    def concat(cls, parts: list[EventColumns]) -> EventColumns:
        """One batch of the events of ``parts``, in order, with one string table."""
        if len(parts) == 1:
            return parts[0]
        # One probe per string of each part: a new string keeps the number the
        # counter gave it on arrival, which ``dense`` turns into its index.
        table: dict[str, int] = {}
        counter = count()
        arrivals = [np.fromiter(map(table.setdefault, part.strings, counter), np.int64,
                                len(part.strings)) for part in parts]
        dense = np.zeros(sum(map(len, arrivals)) + 1, np.int64)
        dense[np.fromiter(table.values(), np.int64, len(table))] = np.arange(len(table))
        remapped: dict[str, list[np.ndarray]] = {name: [] for name in COLUMNS}
        others: dict[int, Any] = {}
        offset = 0
        for part, arrival in zip(parts, arrivals):
            remap = np.append(dense[arrival], NONE)  # -1 stays -1
            for name in COLUMNS:
                column = getattr(part, name)
                remapped[name].append(remap[column] if name in _STRING_COLUMNS else column)
            others.update((offset + i, event) for i, event in part.others.items())
            offset += len(part)
        return cls(list(table), **{name: np.concatenate(columns)
                                   for name, columns in remapped.items()}, others=others)


_STRING_COLUMNS = frozenset(
    ["key", "location", "source", "label", "group", "origin", "inputs"])


def _encode(events: list) -> EventColumns:
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
        """A time that may be None (NaN in the column); anything else not finite is bad."""
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
    start[di] = stop[di] = numbers(di, _D["time"], float)
    for name in ("mutation", "location", "reads"):  # annotations: one by one
        bad[ci] |= _is_not_none(field(ci, _C[name]))
    bad[ci] |= _is_not_none(trailing(ci, _C["released_by"]))  # a queued task: one by one
    bad[ci] |= _is_not_none(trailing(ci, _C["released_on"]))
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
    strings, key_codes, name_codes = _string_table(keys + inputs, [*places, *maybe.values()])
    key_, inputs = key_codes[:len(keys)], key_codes[len(keys):]
    c_worker, t_target, d_location, t_source, label, group, origin = name_codes
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
    columns = {"label": label, "group": group, "origin": origin}
    for name, values in columns.items():
        column = np.full(n, NONE, np.int64)
        column[ci] = values
        missing = np.flatnonzero(values < 0)
        if len(missing) and maybe[name].count(None) != len(missing):  # not a string
            given = _is_not_none(list(map(maybe[name].__getitem__, missing.tolist())))
            bad[ci[missing[given]]] = True
        columns[name] = column

    kind[bad] = OTHER
    for column in (requested, received, runnable):
        column[bad] = np.nan
    dropped = bad[input_event]
    input_count[bad] = 0
    whole = np.flatnonzero(kind == OTHER).tolist()
    original = dict(zip(whole, map(originals.__getitem__, whole)))
    return EventColumns(strings, kind, key, location, source, start, stop, nbytes, thread,
                        root, input_count=input_count, inputs=inputs[~dropped],
                        requested=requested, received=received, runnable=runnable,
                        others=original, **columns)


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


def _moment(value: float) -> float | None:
    """A moment column's value as an event field: NaN is None."""
    return None if value != value else float(value)

