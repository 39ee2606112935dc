"""The entries of the scheduler's queue that are not the builder's events: named records.

The scheduler's hooks and the workers' RPC handler record into one queue
(:class:`~crux_dask.plugins.recorder.Recorder`): the builder's events
(:mod:`crux_dask.events`), the workers' batches, and these.  The ingest tells
them apart by their type.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Done", "Graph", "Lost", "Reported", "Sent", "TaskFiles", "Whole"]


class Sent(NamedTuple):
    """The scheduler sent a task to a worker."""

    key: Any
    time: float
    #: ``(key, worker)`` of the finished task that freed the queue slot it waited
    #: for, or None.
    freed: tuple | None
    #: The number the scheduler gave the task's graph (-1: unknown).
    root: int


class Done(NamedTuple):
    """The scheduler saw a task finish that its worker reports."""

    key: Any
    worker: str
    time: float
    nbytes: int


class Whole(NamedTuple):
    """A task the scheduler records whole as it finishes, in distributed's terms.

    ``finish`` is ``memory`` or ``erred``; ``metadata`` is what its worker
    sent with its completion; ``time`` when the scheduler recorded it.
    """

    key: Any
    finish: str
    worker: str
    thread: Any
    startstops: Any
    nbytes: int
    dependencies: list
    prefix: Any
    group: Any
    annotation: Any
    priority: Any
    metadata: Any
    time: float


class Lost(NamedTuple):
    """A worker left with its data."""

    worker: str
    time: float


class Graph(NamedTuple):
    """A graph reached the scheduler, in another process's queue: its root is made as
    the entry is taken, and the graph's tasks name it by ``number``."""

    number: int
    time: float
    label: str


class TaskFiles(NamedTuple):
    """The files of a task whose worker sized them after it reported the task (whose
    files it reported as :data:`~crux_dask.plugins.protocol.FOLLOW`)."""

    key: str
    worker: str
    files: Any


class Reported(NamedTuple):
    """The tasks a worker reported with a batch
    (:data:`~crux_dask.plugins.protocol.TASKS`), ``count`` of them: as received
    (msgpack), or, once a slice took some, the rest of them unpacked."""

    worker: Any
    reports: bytes | list
    count: int
