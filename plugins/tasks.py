"""What the scheduler's transition hook records about a task, and how it is read.

The hook keeps the entry in the scheduler's own terms, which costs it one
tuple; :func:`task_event` turns it into the builder's ``compute`` event later,
when the ingest applies it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from crux_dask.plugins.protocol import key_string

__all__ = ["TASK", "task_event"]

#: First field of the queue entries the transition hook records: a task that
#: finished or failed, ``(TASK, key, finish, worker, thread, startstops, nbytes,
#: dependencies, prefix, group, annotation, root)``.
TASK = object()


def task_event(item: Sequence[Any]) -> tuple:
    """The builder's ``compute`` event of a :data:`TASK` entry of the queue.

    Start and stop come from the task's ``compute`` interval, kind, label,
    location and reads from its ``crux`` annotation; a failed task makes a
    state of size zero whose origin is ``erred``.
    """
    (_, key, finish, worker, thread, startstops, nbytes, dependencies, prefix, group,
     annotation, root) = item
    start = stop = None
    for interval in startstops or ():
        if interval.get("action") == "compute":
            start, stop = interval["start"], interval["stop"]
    if stop is None:
        start = stop = time.time()
    kind = label = location = reads = None
    if isinstance(annotation, dict):
        kind = annotation.get("mutation")
        label = annotation.get("label")
        location = annotation.get("location")
        reads = annotation.get("reads")
        reads = tuple(reads) if isinstance(reads, (list, tuple)) else None
    erred = finish == "erred"
    return ("compute", key_string(key), worker, thread, start, stop, 0 if erred else nbytes,
            tuple(key_string(d) for d in dependencies), root, label or prefix, group, kind,
            location, "erred" if erred else None, reads)
