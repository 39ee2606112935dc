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

__all__ = ["EVENT_KINDS", "REQUIRED", "Compute", "Delete", "Event", "FileAccess", "Root",
           "Shard", "Transfer", "event_time", "parse"]


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

    The moments that say why the task started when it did, where recorded:
    ``sent`` (the scheduler sent it to the worker), ``received`` (the worker
    got it), ``runnable`` (all its inputs were in the worker's memory), and,
    for a task the scheduler held back in its queue, ``released_by``: the key
    of the task whose completion freed its slot, computed on ``released_on``.
    ``priority`` is the priority Dask gave the task, as one number (lower runs
    first; see :func:`crux_dask.plugins.tasks.priority_number`), ``io``
    the seconds of its run it spent on files (off the CPU after it opened its
    first file), where measured, and ``first_requested``, for a task the
    scheduler took back from a worker and sent again (rescheduled), when it
    first sent it; ``announced``, when the scheduler learnt that it finished; ``cpu``,
    the CPU seconds its thread spent on it, and ``cpu_wait``, the seconds it waited
    for a core (the rest of its run it waited for the GIL, a file or the network).
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
    sent: float | None = None
    received: float | None = None
    runnable: float | None = None
    released_by: str | None = None
    released_on: str | None = None
    priority: float | None = None
    io: float | None = None
    first_requested: float | None = None
    announced: float | None = None
    cpu: float | None = None
    cpu_wait: float | None = None


class Transfer(NamedTuple):
    """The data of ``key`` moved from location ``source`` to ``destination``.

    ``requested`` is when the receiving worker asked for it, where recorded:
    from then until ``start`` the fetch waited for the worker's transfer
    capacity.  Of data a client gathered, it is when the scheduler saw the
    data's task finish and told the client: from then until ``start`` the
    client fetched it.
    """

    kind: str
    key: str
    source: str
    destination: str
    start: float
    stop: float
    nbytes: int | None = None
    requested: float | None = None


class Delete(NamedTuple):
    """The data of ``key`` was released at ``location``."""

    kind: str
    key: str
    location: str
    time: float


class FileAccess(NamedTuple):
    """The task ``key``, computed on ``worker``, read or wrote the file at ``location``.

    A read (``written`` false) comes before the task's ``compute`` event: the
    file's content reaches the worker's memory at ``time`` (the task's start),
    ``requested`` being when the scheduler sent the task, ``received`` when
    its worker got it, ``root`` the root state of the task's graph and
    ``inputs`` the keys of the task's inputs.  A write comes after
    it: the file, ``nbytes`` long, is made from the task's data at ``time``
    (the task's stop).
    """

    kind: str
    key: str
    worker: str
    location: str
    written: bool
    time: float
    nbytes: int
    requested: float | None = None
    root: int = -1
    inputs: tuple[str, ...] = ()
    received: float | None = None


class Shard(NamedTuple):
    """The P2P transfer task ``key``, computed on ``worker``, split its data for ``destination``.

    One shard per destination worker of the shuffle, ``nbytes`` long, made
    from the task's ``inputs`` between ``start`` and ``stop`` (the task's
    run until its data was split).  ``destination`` is the location the shard
    goes to: the worker's memory, or its disk where the shuffle keeps what it
    receives there.  The shard moves there (a ``transfer`` of the key
    :func:`crux_dask.model.shard_key` gives, unless it is already there),
    where the shuffle's barrier and output tasks take it.
    """

    kind: str
    key: str
    worker: str
    destination: str
    nbytes: int
    start: float
    stop: float
    inputs: tuple[str, ...] = ()


Event = Root | Compute | Transfer | Delete | FileAccess | Shard

#: Each kind's record type.
TYPES: dict[str, type] = {"root": Root, "compute": Compute, "transfer": Transfer,
                          "delete": Delete, "file": FileAccess, "shard": Shard}

_RECORDS = frozenset(TYPES.values())

#: Each kind's fields after the kind, in order: the plain tuple form.
EVENT_KINDS: dict[str, tuple[str, ...]] = {
    kind: record._fields[1:] for kind, record in TYPES.items()}
#: Each kind's fewest fields after the kind: a plain tuple may leave out the
#: trailing fields that have defaults (the moments, a priority, a transfer's size).
REQUIRED: dict[str, int] = {
    "root": 1, "compute": len(Compute._fields) - 12, "transfer": 5, "delete": 3, "file": 6,
    "shard": 6}


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
    if not REQUIRED[event[0]] < len(event) <= len(record._fields):
        raise ValueError(f"a {event[0]} event has {REQUIRED[event[0]]} to "
                         f"{len(record._fields) - 1} fields, got {len(event) - 1}")
    return record(*event)


def event_time(event: Sequence[Any]) -> float:
    """When an event happened: a computation's or transfer's stop, a release's or root's time.

    ``-inf`` for anything that is not an event or whose time is not a number.
    """
    try:
        record = parse(event)
        time = record.time if type(record) in (Delete, Root, FileAccess) else record.stop
        return float(time)
    except (ValueError, TypeError):
        return float("-inf")
