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

__all__ = ["TASK", "priority_number", "task_event"]

#: Scales of :func:`priority_number`: a task's order within its graph stays
#: exact below ``2**32`` tasks, its graph's generation below ``2**20``.
_ORDER_SCALE = 2.0**32
_GENERATION_SCALE = 2.0**20

#: First field of the queue entries the transition hook records: a task that
#: finished or failed, ``(TASK, key, finish, worker, thread, startstops, nbytes,
#: dependencies, prefix, group, annotation, root, sent, moments, priority)``:
#: ``sent`` is ``(when the scheduler sent it, (key, worker) of the task that
#: freed its queue slot or None)``, ``moments`` what its worker left in its
#: metadata, ``[received, runnable]``, ``priority`` the task's priority tuple.
TASK = object()


def task_event(item: Sequence[Any]) -> tuple:
    """The builder's ``compute`` event of a :data:`TASK` entry of the queue.

    Start and stop come from the task's ``compute`` interval, kind, label,
    location and reads from its ``crux`` annotation; a failed task makes a
    state of size zero whose origin is ``erred``.  Moments a worker left in a
    form other than two times or None are ignored.
    """
    (_, key, finish, worker, thread, startstops, nbytes, dependencies, prefix, group,
     annotation, root, sent, moments, priority) = item
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
    sent_at, freed = sent if sent is not None else (None, None)
    received, runnable = _moments(moments)
    return ("compute", key_string(key), worker, thread, start, stop, 0 if erred else nbytes,
            tuple(key_string(d) for d in dependencies), root, label or prefix, group, kind,
            location, "erred" if erred else None, reads, sent_at, received, runnable,
            *((key_string(freed[0]), freed[1]) if freed is not None else (None, None)),
            priority_number(priority))


def priority_number(priority: Any) -> float | None:
    """Dask's priority tuple of a task as one number that sorts the same way.

    The scheduler gives each task ``(-user priority, generation, order)``:
    lower runs first, the annotated priority before the graph's generation
    (sub-tasks' generations are a hundredth below their parent's) before the
    task's place in ``dask.order``.  The number is exact for orders below
    ``2**32`` and generations below ``2**20`` with no user priority; with one,
    tasks a few places apart in one graph may tie.  None for anything that is
    not such a tuple.
    """
    if not (isinstance(priority, tuple) and len(priority) == 3):
        return None
    user, generation, order = priority
    if not all(type(v) in (int, float) for v in priority):
        return None
    number = (user * _GENERATION_SCALE + generation) * _ORDER_SCALE + order
    return float(number) if number - number == 0.0 else None


def _moments(moments: Any) -> tuple[float | None, float | None]:
    """``(received, runnable)`` from what a worker left in the task's metadata."""
    if isinstance(moments, (list, tuple)) and len(moments) == 2 and all(
            m is None or (type(m) is float and m - m == 0.0) for m in moments):
        return moments[0], moments[1]
    return None, None
