"""A finished task as the scheduler and its worker recorded it, and the builder's events of it.

Each side records what only it knows.  The worker reports what the task did
(:data:`~crux_dask.plugins.protocol.REPORT_FIELDS`: its run, inputs, size,
priority and moments, the shards it made) in its next batch; the scheduler
records, as it sends the task, when it did, which finished task freed the
queue slot it waited for, and the graph it came in (a
:class:`~crux_dask.plugins.entries.Sent` entry).  The
ingest joins the two by the task's key (:mod:`crux_dask.plugins.joins`), and
:func:`task_events` makes the builder's events of them.  The scheduler also
notes that the task finished, and where (a
:class:`~crux_dask.plugins.entries.Done` entry): a worker that
dies takes with it what it had not sent yet, and its tasks are then recorded
from what the scheduler knows (:class:`~crux_dask.plugins.joins.Reports`).

A task no worker reports is recorded whole by the scheduler as it finishes, a
:class:`~crux_dask.plugins.entries.Whole` entry: one that failed, one that ran on
a worker without Crux, and one that opened files, whose worker leaves what only it knows in the
task's metadata instead (:data:`~crux_dask.plugins.protocol.FILES`): the
workers' reports reach the scheduler in batches, each worker's in its own
order, but a task that reads a file another task wrote elsewhere must come
after it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from crux_dask.model import file_location
from crux_dask.plugins.entries import Whole
from crux_dask.plugins.protocol import FILES, REPORT_FIELDS, SHARDS, TIMES, key_string

__all__ = ["Finished", "priority_number", "reported_task", "scheduler_task", "task_events"]

#: Scales of :func:`priority_number`: a task's order within its graph stays
#: exact below ``2**32`` tasks, its graph's generation below ``2**20``.
_NAN = float("nan")
_ORDER_SCALE = 2.0**32
_GENERATION_SCALE = 2.0**20

class Finished(NamedTuple):
    """A task that finished, as :func:`task_events` reads it.

    ``sent`` is what the scheduler recorded as it sent the task
    (:meth:`Sending.take <crux_dask.plugins.joins.Sending.take>`), None if nothing;
    ``announced`` when the scheduler learnt that it finished, None if not known.
    """

    key: str
    erred: bool
    worker: str
    thread: Any
    start: float | None
    stop: float | None
    nbytes: int
    inputs: tuple[str, ...]
    prefix: Any
    group: Any
    annotation: Any
    priority: Any
    received: float | None = None
    runnable: float | None = None
    files: Any = None
    shards: Any = None
    sent: tuple | None = None
    announced: float | None = None
    cpu: float | None = None
    cpu_wait: float | None = None


def scheduler_task(entry: Whole) -> Finished:
    """The task of a :class:`~crux_dask.plugins.entries.Whole` entry: its ``compute``
    interval, if any, is its run, shifted to its worker's clock estimate as the worker
    left it in its metadata with the task's moments, files and shards.  Moments in a
    form other than two times or None, and a shift that is not a time, are left out."""
    (key, finish, worker, thread, startstops, nbytes, dependencies, prefix, group,
     annotation, priority, metadata, _) = entry
    start = stop = None
    for interval in startstops or ():
        if interval.get("action") == "compute":
            start, stop = interval["start"], interval["stop"]
    if isinstance(metadata, dict):
        moments, files, shards = (metadata.get(TIMES), metadata.get(FILES),
                                  metadata.get(SHARDS))
    else:
        moments = files = shards = None
    received, runnable, shift, cpu, cpu_wait = _moments(moments)
    if shift is not None and stop is not None:
        start, stop = start + shift, stop + shift
    return Finished(key_string(key), finish == "erred", worker, thread, start, stop,
                    nbytes or 0, tuple(key_string(d) for d in dependencies), prefix, group,
                    annotation, priority, received, runnable, files, shards,
                    announced=entry.time, cpu=cpu, cpu_wait=cpu_wait)


def reported_task(row: Any, worker: str) -> Finished:
    """The task a worker reported (:data:`~crux_dask.plugins.protocol.REPORT_FIELDS`).

    Raises
    ------
    ValueError
        If the report is not in that form.  Moments that are not times, and
        shards in another form, are only left out (see :func:`task_events`).
    """
    from distributed.utils import key_split_group  # not at import: the graph process's start

    if not (isinstance(row, (list, tuple)) and len(row) == len(REPORT_FIELDS)):
        raise ValueError(f"a task's report is an array of {len(REPORT_FIELDS)} fields")
    (key, thread, start, stop, nbytes, inputs, prefix, annotation, priority,
     received, runnable, shards, cpu, cpu_wait) = row
    key = _as_key(key)
    if not _is_key(key):
        raise ValueError(f"a reported task's key must be a Dask key, got {key!r:.80}")
    if not (_is_time(start) and _is_time(stop) and start <= stop):
        raise ValueError(f"task {key!r}: start and stop must be times in order")
    if not (type(nbytes) is int and nbytes >= 0):
        raise ValueError(f"task {key!r}: nbytes must be an integer >= 0")
    inputs = [_key_name(i) for i in inputs] if isinstance(inputs, list) else None
    if inputs is None or None in inputs:
        raise ValueError(f"task {key!r}: inputs must be an array of keys")
    if thread is not None and type(thread) is not int:
        raise ValueError(f"task {key!r}: thread must be an integer or None")
    received, runnable, *_ = _moments((received, runnable))
    if isinstance(priority, list) and priority:  # the worker adds its generation
        priority = tuple(priority[:-1])
    return Finished(key_string(key), False, worker, thread, start, stop, nbytes,
                    tuple(inputs),
                    prefix if type(prefix) is str else None, key_split_group(key), annotation,
                    priority, received, runnable, None, shards,
                    cpu=cpu if _is_seconds(cpu) else None,
                    cpu_wait=cpu_wait if _is_seconds(cpu_wait) else None)


def task_events(task: Finished, roots: Mapping[int, int] | None = None,
                wall: Callable[[], float] = time.time) -> list[tuple]:
    """The builder's events of a finished task.

    ``roots`` maps the number the scheduler gave the task's graph to the root
    state; without it, the number is the state.

    The task's ``compute`` event: start and stop are its run's (``wall()``, for
    a task that has none), kind, label, location and reads come from its
    ``crux`` annotation; a failed task makes a state of size zero whose origin
    is ``erred``.

    Before it, a ``file`` event for each file the task read; after it, one
    for each file it wrote, and a ``shard`` event for each shard a P2P
    transfer task made.  A task whose annotation says what it read or made
    (``reads``, ``location``, ``mutation``) and a failed one have none; nor
    have files and shards reported in any other form than the worker's.
    """
    root, sent_at, freed_key, freed_on, first = task.sent or (-1, None, None, None, None)
    if roots is not None:
        root = roots.get(root, -1)
    start, stop = task.start, task.stop
    if stop is None:
        start = stop = wall()
    annotation = task.annotation
    kind = label = location = reads = None
    if isinstance(annotation, dict):
        kind = annotation.get("mutation")
        label = annotation.get("label")
        location = annotation.get("location")
        reads = annotation.get("reads")
        reads = tuple(reads) if isinstance(reads, (list, tuple)) else None
    erred = task.erred
    name, worker, inputs = task.key, task.worker, task.inputs
    told = location is not None or reads is not None or kind is not None  # the annotation wins
    files = task.files
    io, host, opened = (None, None, ()) if erred or told or files is None else _files(files)
    compute = ("compute", name, worker, task.thread, start, stop, 0 if erred else task.nbytes,
               inputs, root, label or task.prefix, task.group, kind, location,
               "erred" if erred else None, reads, sent_at, task.received, task.runnable,
               freed_key, freed_on, priority_number(task.priority), io, first, task.announced,
               task.cpu, task.cpu_wait)
    shards = task.shards
    split, made = (stop, ()) if erred or told or shards is None else _shards(shards, start,
                                                                              stop)
    if not opened and not made:
        return [compute]
    return [
        *(("file", name, worker, file_location(host, path), False, start, size, sent_at, root,
           inputs, task.received) for path, written, size in opened if not written),
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
    """``(io, host, [(path, written, size), ...])`` from what a worker reported.

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
    """``(split time, [(destination, bytes), ...])`` from what a worker reported.

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


def _moments(moments: Any) -> tuple[float | None, ...]:
    """``(received, runnable[, shift[, cpu, cpu_wait]])`` as a worker recorded them:
    times, or None; the shift from distributed's clock estimate to the worker's and the
    task's CPU seconds and wait for a core, if given."""
    if not (isinstance(moments, (list, tuple)) and 2 <= len(moments) <= 5):
        return None, None, None, None, None
    received, runnable, shift, cpu, cpu_wait = (*moments, None, None, None)[:5]
    return (received if _is_time(received) else None,
            runnable if _is_time(runnable) else None,
            shift if _is_time(shift) else None, cpu if _is_seconds(cpu) else None,
            cpu_wait if _is_seconds(cpu_wait) else None)


def _as_key(value: Any) -> Any:
    """A key as msgpack gives it back, a tuple again (an array comes as a list)."""
    if type(value) is not list:
        return value
    return tuple([_as_key(v) if type(v) is list else v for v in value])


def _key_name(value: Any) -> str | None:
    """The string of a key as msgpack gives it back (:func:`_as_key`); None if it is not
    a Dask key."""
    if type(value) is str:
        return value
    key = _as_key(value)
    return key_string(key) if _is_key(key) else None


def _is_key(value: Any) -> bool:
    return isinstance(value, (str, bytes, int, float, tuple)) and type(value) is not bool


def _is_time(value: Any) -> bool:
    return type(value) is float and math.isfinite(value)


def _is_seconds(value: Any) -> bool:
    return type(value) is float and 0.0 <= value < math.inf
