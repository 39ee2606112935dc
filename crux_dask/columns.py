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
one as before.  :meth:`EventColumns.event` gives back every event as its record
(:mod:`crux_dask.events`), equal to the one encoded.  The encoder is
:mod:`crux_dask.encoding`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count
from typing import Any

import numpy as np

from crux_dask.encoding import COMPUTE, DELETE, NONE, NOT_RECORDED, OTHER, TRANSFER, encode
from crux_dask.events import Compute, Delete, Event, Transfer, event_time

__all__ = [
    "COLUMNS", "COLUMNS_FROM", "COMPUTE", "DELETE", "NONE", "OTHER", "STRING_COLUMNS",
    "TRANSFER", "EventColumns",
]

#: From how many events on columns pay: putting events in columns, sending them
#: and planning a window from them cost about a millisecond whatever their
#: number, which fewer events than this would not repay.
COLUMNS_FROM = 512
#: Every column, in wire order, with its dtype on the wire: ``None`` for the
#: columns a batch does not send (they read as not recorded).  In memory a
#: kind is int8, a time or moment float64, any other number or string index int64.
COLUMNS: dict[str, str | None] = {
    "kind": "<i1", "key": "<i4", "location": "<i4", "source": "<i4", "start": "<f8",
    "stop": "<f8", "nbytes": "<i8", "thread": "<i8", "root": "<i8", "label": "<i4",
    "group": "<i4", "origin": "<i4", "input_count": "<i4", "inputs": "<i4",
    "requested": "<f8", "received": "<f8", "runnable": "<f8", "priority": None,
    "released_by": None, "released_on": None, "announced": None, "cpu": None,
    "cpu_wait": None,
}
#: The columns that hold indices into a batch's string table (``-1``: none).
STRING_COLUMNS = ("key", "location", "source", "label", "group", "origin", "inputs",
                  "released_by", "released_on")


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
    priority : ndarray of float64
        A computation's priority in Dask, as one number; NaN where not recorded.
    announced : ndarray of float64
        When the scheduler learnt that a computation finished; NaN where not
        recorded (never on the wire: the scheduler records it).
    cpu, cpu_wait : ndarray of float64
        The CPU seconds a computation's thread spent on it, and waited for a
        core; NaN where not recorded (never on the wire: they come with the
        task's report).
    released_by, released_on : ndarray
        Of a task the scheduler queued, the task whose completion freed its
        slot and that task's worker; ``-1`` for none.
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
    priority: np.ndarray
    announced: np.ndarray
    cpu: np.ndarray
    cpu_wait: np.ndarray
    released_by: np.ndarray
    released_on: np.ndarray
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
        thread = int(self.thread[i])
        label, group, origin, released_by, released_on = (
            None if j == NONE else s[j] for j in (
                int(self.label[i]), int(self.group[i]), int(self.origin[i]),
                int(self.released_by[i]), int(self.released_on[i])))
        return Compute("compute", key, location, None if thread == NONE else thread, start,
                       stop, nbytes, inputs, int(self.root[i]), label, group, None, None,
                       origin, None, requested, _moment(self.received[i]),
                       _moment(self.runnable[i]), released_by, released_on,
                       _moment(self.priority[i]), None, None, _moment(self.announced[i]),
                       _moment(self.cpu[i]), _moment(self.cpu_wait[i]))

    def events(self) -> list[Event]:
        """Every event, as tuples."""
        return [self.event(i) for i in range(len(self))]

    def take(self, order: np.ndarray) -> EventColumns:
        """The events in the order ``order`` (a permutation of their positions)."""
        counts = self.input_count[order]
        starts = self.input_offset[:-1][order]
        placed = np.cumsum(counts) - counts  # where each event's inputs start now
        inputs = self.inputs[np.repeat(starts - placed, counts) + np.arange(int(counts.sum()))]
        position = np.empty(len(order), np.int64)
        position[order] = np.arange(len(order))
        columns = {name: getattr(self, name)[order] for name in COLUMNS if name != "inputs"}
        return EventColumns(self.strings, **columns, inputs=inputs,
                            others={int(position[i]): e for i, e in self.others.items()})

    def times(self) -> np.ndarray:
        """When each event happened: a release's time, a computation's or transfer's stop.

        An event kept whole in :attr:`others` that is not an event has no time
        (``-inf``).
        """
        times = np.where(self.kind == DELETE, self.start, self.stop)
        for i, event in self.others.items():
            times[i] = event_time(event)
        return times

    def rows(self, lo: int, hi: int) -> EventColumns:
        """Events ``lo`` to ``hi`` (excluded), sharing this batch's string table."""
        offset = self.input_offset
        columns = {name: getattr(self, name)[lo:hi] for name in COLUMNS if name != "inputs"}
        return EventColumns(self.strings, **columns,
                            inputs=self.inputs[offset[lo]:offset[hi]],
                            others={i - lo: event for i, event in self.others.items()
                                    if lo <= i < hi})

    # -- building -------------------------------------------------------------
    @classmethod
    def from_events(cls, events: list) -> EventColumns:
        """Encode event tuples; whatever is not a plain event is kept whole.

        Never raises: events that cannot be read as columns all go to
        :attr:`others`, where the builder's one-by-one path judges them.
        """
        try:
            return cls(**encode(events))
        except Exception:  # something hostile in there: keep everything whole
            n = len(events)
            columns = {name: np.full(n, NONE, np.int64) for name in COLUMNS}
            columns.update(kind=np.full(n, OTHER, np.int8), start=np.zeros(n),
                           stop=np.zeros(n), input_count=np.zeros(n, np.int64),
                           inputs=np.zeros(0, np.int64),
                           **{name: np.full(n, np.nan) for name in NOT_RECORDED})
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
                remapped[name].append(remap[column] if name in STRING_COLUMNS else column)
            others.update((offset + i, event) for i, event in part.others.items())
            offset += len(part)
        return cls(list(table), **{name: np.concatenate(columns)
                                   for name, columns in remapped.items()}, others=others)


def _moment(value: float) -> float | None:
    """A moment column's value as an event field: NaN is None."""
    return None if value != value else float(value)

