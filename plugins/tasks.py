"""What the scheduler's transition hook records about a task, and how it is read.

The hook keeps the entry in the scheduler's own terms, which costs it one
tuple; :func:`task_events` turns it into the builder's events later, when the
ingest applies it: the task's ``compute``, and around it the files it read
and wrote and the shards it split its data into.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from crux_dask.model import file_location
from crux_dask.plugins.protocol import FILES, MOMENTS, SHARDS, key_string

__all__ = ["TASK", "priority_number", "task_events"]

#: Scales of :func:`priority_number`: a task's order within its graph stays
#: exact below ``2**32`` tasks, its graph's generation below ``2**20``.
_NAN = float("nan")
_ORDER_SCALE = 2.0**32
_GENERATION_SCALE = 2.0**20

#: First field of the queue entries the transition hook records: a task that
#: finished or failed, ``(TASK, key, finish, worker, thread, startstops, nbytes,
#: dependencies, prefix, group, annotation, root, sent, priority, metadata)``:
#: ``sent`` is ``(when the scheduler sent it, (key, worker) of the task that
#: freed its queue slot or None[, when it first sent it, for a task it took
#: back and sent again])``, ``priority`` the task's priority tuple and
#: ``metadata`` what its worker sent with its completion, where the worker
#: plugin leaves the task's moments (``[received, runnable]``), the files it
#: opened (``[io, host, [[path, written, size], ...]]``) and the shards of a
#: P2P transfer task (``[split time, [[destination, bytes], ...]]``).
TASK = "task"


def task_events(item: Sequence[Any], roots: Mapping[int, int] | None = None) -> list[tuple]:
    """The builder's events of a :data:`TASK` entry of the queue.

    ``roots`` maps the entry's ``root`` (a number the scheduler gave its
    graph) to the root state; without it, ``root`` is the state.

    The task's ``compute`` event: start and stop come from the task's
    ``compute`` interval, kind, label, location and reads from its ``crux``
    annotation; a failed task makes a state of size zero whose origin is
    ``erred``.  Moments a worker left in a form other than two times or None
    are ignored.

    Before it, a ``file`` event for each file the task read; after it, one
    for each file it wrote, and a ``shard`` event for each shard a P2P
    transfer task made.  A task whose annotation says what it read or made
    (``reads``, ``location``, ``mutation``) and a failed one have none; nor
    have files and shards reported in any other form than the worker's.
    """
    (_, key, finish, worker, thread, startstops, nbytes, dependencies, prefix, group,
     annotation, root, sent, priority, metadata) = item
    if roots is not None:
        root = roots.get(root, -1)
    if isinstance(metadata, dict):
        moments, files, shards = (metadata.get(MOMENTS), metadata.get(FILES),
                                  metadata.get(SHARDS))
    else:
        moments = files = shards = None
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
    sent_at, freed, *first = sent if sent is not None else (None, None)
    received, runnable = _moments(moments)
    name = key_string(key)
    told = location is not None or reads is not None or kind is not None  # the annotation wins
    io, host, opened = (None, None, ()) if erred or told or files is None else _files(files)
    inputs = tuple(key_string(d) for d in dependencies)
    compute = ("compute", name, worker, thread, start, stop, 0 if erred else nbytes,
               inputs, root, label or prefix, group, kind, location,
               "erred" if erred else None, reads, sent_at, received, runnable,
               *((key_string(freed[0]), freed[1]) if freed is not None else (None, None)),
               priority_number(priority), io, first[0] if first else None)
    split, made = (stop, ()) if erred or told or shards is None else _shards(shards, start,
                                                                              stop)
    if not opened and not made:
        return [compute]
    return [
        *(("file", name, worker, file_location(host, path), False, start, size, sent_at, root,
           inputs) for path, written, size in opened if not written),
        compute,
        *(("file", name, worker, file_location(host, path), True, stop, size)
          for path, written, size in opened if written),
        *(("shard", name, worker, destination, size, start, split, inputs)
          for destination, size in made),
    ]


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


def _files(files: Any) -> tuple[float | None, str | None, list[tuple[str, bool, int]]]:
    """``(io, host, [(path, written, size), ...])`` from what a worker left in the metadata.

    Files that are gone (size ``-1``) are left out; anything not in the
    worker's form gives no files.  ``io`` is NaN where the worker could not
    measure it: a task that used files always has one, which tells the
    builder to look for the copies of what it read.
    """
    try:
        io, host, opened = files
        if not isinstance(host, str) or not (io is None or (type(io) is float and io >= 0.0)):
            return None, None, []
        found = [(path, written, size) for path, written, size in opened
                 if type(path) is str and type(written) is bool and type(size) is int
                 and size >= 0]
    except (TypeError, ValueError):
        return None, None, []
    return (_NAN if io is None else io) if found else None, host, found


def _shards(shards: Any, start: float, stop: float) -> tuple[float, list[tuple[str, int]]]:
    """``(split time, [(destination, bytes), ...])`` from what a worker left in the metadata.

    The split time is the task's stop unless the worker's lies within the
    task's run; anything not in the worker's form gives no shards.
    """
    try:
        split, made = shards
        made = [(destination, size) for destination, size in made]
    except (TypeError, ValueError):
        return stop, []
    if not all(type(d) is str and type(n) is int and n >= 0 for d, n in made):
        return stop, []
    if not (type(split) is float and start <= split <= stop):
        split = stop
    return split, made


def _moments(moments: Any) -> tuple[float | None, float | None]:
    """``(received, runnable)`` from what a worker left in the task's metadata."""
    if isinstance(moments, (list, tuple)) and len(moments) == 2 and all(
            m is None or (type(m) is float and m - m == 0.0) for m in moments):
        return moments[0], moments[1]
    return None, None
