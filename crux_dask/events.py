"""Data-state events: what the plugins record and the builder turns into a graph.

An event is a named tuple whose first field names its kind, so that it
travels as a plain tuple (msgpack rows, :class:`~crux_dask.columns.EventColumns`)
and is read by name where it is used.  :func:`parse` turns a plain tuple back
into its named form and refuses one of the wrong length.

Times are seconds since the epoch in the scheduler's clock; locations are the
strings of :mod:`crux_dask.model` (``memory@<worker>``, ``disk@<worker>``,
``file@<host>:<path>``, ``client``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = ["EVENT_KINDS", "Compute", "Delete", "Event", "Root", "Transfer", "parse"]


class Root(NamedTuple):
    """A graph reached the scheduler: its tasks without inputs hang from this state."""

    kind: str
    time: float
    label: str = "graph"


class Compute(NamedTuple):
    """A task computed on ``worker`` from the data of ``inputs`` (keys).

    ``root`` is the root state of the task's graph (for a task without
    inputs); ``label`` defaults to the key's prefix and ``group`` (the task
    group, which tells a ``SPLIT``) to the label.  ``mutation`` and
    ``location`` override the kind of mutation and where the result lives
    (from ``dask.annotate(crux=...)``); ``origin`` says what produced the data
    (``"erred"`` for a task that failed); ``reads`` are keys of data the task
    read outside Dask.
    """

    kind: str
    key: str
    worker: str
    thread: int | None
    start: float
    stop: float
    nbytes: int
    inputs: tuple[str, ...] = ()
    root: int = -1
    label: str | None = None
    group: str | None = None
    mutation: str | None = None
    location: str | None = None
    origin: str | None = None
    reads: tuple[str, ...] | None = None


class Transfer(NamedTuple):
    """The data of ``key`` moved from location ``source`` to ``destination``."""

    kind: str
    key: str
    source: str
    destination: str
    start: float
    stop: float
    nbytes: int | None = None


class Delete(NamedTuple):
    """The data of ``key`` was released at ``location``."""

    kind: str
    key: str
    location: str
    time: float


Event = Root | Compute | Transfer | Delete

#: Each kind's record type.
TYPES: dict[str, type] = {"root": Root, "compute": Compute, "transfer": Transfer,
                          "delete": Delete}

_RECORDS = frozenset(TYPES.values())

#: Each kind's fields after the kind, in order: the plain tuple form.
EVENT_KINDS: dict[str, tuple[str, ...]] = {
    kind: record._fields[1:] for kind, record in TYPES.items()}


def parse(event: Sequence[Any]) -> Event:
    """The named form of an event given as a plain tuple ``(kind, *fields)``.

    Raises
    ------
    ValueError
        If the kind is unknown or the event has the wrong number of fields.
    """
    if type(event) in _RECORDS:
        return event
    try:
        record = TYPES[event[0]]
    except (KeyError, TypeError, IndexError):
        kind = event[0] if isinstance(event, (tuple, list)) and event else event
        raise ValueError(f"unknown event kind {kind!r}") from None
    if len(event) != len(record._fields):
        raise ValueError(f"a {event[0]} event has {len(record._fields) - 1} fields, "
                         f"got {len(event) - 1}")
    return record._make(event)
