"""Each kind of event applied to a builder, one event at a time.

The handlers apply the mapping rules of the data model
(:mod:`crux_dask.graph.rules`):

* a graph reaching the scheduler creates a ``root`` state;
* a task computed on worker ``W`` from inputs ``D1..Dn`` (each a state in
  ``W``'s memory) creates ``key@memory@W`` with one mutation per input:
  ``APPEND`` from the graph's root for ``n = 0``, ``CONVERT`` for ``n = 1``,
  ``MERGE`` for ``n >= 2``, and ``SPLIT`` where one input feeds ``k > 1``
  single-input siblings of the same task group;
* moving data between locations (worker to worker, spill, file I/O, client)
  is a ``TRANSFER``; releasing data is a ``DELETE`` to a zero-size tombstone.

Each takes the builder, the event (a record of :mod:`crux_dask.events` or a
plain tuple of the same fields) and the caller's clock ``now``, and returns
the id of the state created, or ``None`` if the event waits for an input
(:mod:`crux_dask.graph.lookups`) or creates nothing.  The builder dispatches
to them by the event's name; a shard is applied by
:func:`crux_dask.graph.shuffles.shard`.
"""

from __future__ import annotations

from operator import index
from typing import TYPE_CHECKING, Any

from crux_dask.events import Compute, Delete, FileAccess, Root, Shard, Transfer, parse
from crux_dask.graph import lookups, operations, rules
from crux_dask.growable import NO_CODE
from crux_dask.model import CauseKind, MutationKind, file_path, shard_key
from crux_dask.store import NO_THREAD

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder

__all__ = ["compute", "delete", "file", "made_by", "root", "transfer"]

_TRANSFER, _DELETE = int(MutationKind.TRANSFER), int(MutationKind.DELETE)
_THREAD, _SLOT = int(CauseKind.THREAD), int(CauseKind.SLOT)


def root(builder: PAGBuilder, event: Any, now: float = 0.0) -> int:
    """A graph reached the scheduler: its root state (the run's root if it is the first)."""
    event = event if type(event) is Root else Root(*event)
    time = event.time + 0.0  # a number, or refused
    sid = builder.add_state(builder.root_key, builder.places.root, NO_CODE, NO_THREAD, 0,
                            time, time, time, -1)
    builder.roots.add(sid)
    if builder.run_root < 0:
        builder.run_root = sid
    builder.n_applied += 1
    return sid


def compute(builder: PAGBuilder, event: Any, now: float = 0.0) -> int | None:
    """A task computed: its output in its worker's memory (or at the location it names)."""
    e = event if type(event) is Compute else Compute(*event)
    busy = e.stop - e.start  # refuse a malformed event before anything changes
    index(e.nbytes)
    if e.thread is not None:
        index(e.thread)
    moments = (rules.moment(e.sent), rules.moment(e.received), rules.moment(e.runnable),
               rules.moment(e.priority), rules.moment(e.io),
               rules.moment(e.first_requested), rules.moment(e.announced), rules.moment(e.cpu),
               rules.moment(e.cpu_wait),
               builder.submitted(e.root))
    kind = None if e.mutation is None else int(MutationKind.parse(e.mutation))
    memory = builder.places.memory_of(e.worker)
    taken = _sources(builder, e, memory, event, now)
    if taken is None:
        return None
    sources, freed_by = taken
    store = builder.store
    labels = store.labels
    label = labels.code(e.label if e.label is not None else rules.key_label(e.key))
    previous = builder.holdings.newest.get(e.key)
    if previous is None:
        key = store.add_key(e.key, label, label if e.origin is None
                            else labels.code(e.origin))
    else:
        key = store.state_key[previous]
    if kind is None:
        kind = rules.task_kind(len(sources))
        if kind == rules.CONVERT:
            kind = builder.fanout.kind(sources[0], label if e.group is None
                                       else labels.code(e.group), store.n_mutations,
                                       store.mutation_kind)
    if not sources:
        graph_root = e.root
        if graph_root not in builder.roots:
            graph_root = builder.run_root if builder.run_root >= 0 else root(
                builder, Root("root", e.start))
        sources.append(graph_root)
    location = memory if e.location is None else builder.places.code(e.location)
    causes = _causes(builder, e, memory, sources, moments, freed_by)
    dst = builder.new_state(key, location, builder.places.worker[memory], e.thread, e.nbytes,
                            e.start, e.stop, e.stop, sources, kind, busy, moments, causes)
    if location != memory:
        builder.hold(e.key, memory, dst)
    return builder.applied(dst)


def _sources(builder: PAGBuilder, e: Compute, memory: int, event: Any, now: float
             ) -> tuple[list[int], int | None] | None:
    """The states task ``e`` is computed from, and the one whose end freed its queue slot.

    Its inputs in its worker's memory (``memory``, a location code), the
    shards of a shuffle it takes, the newest copy of data it read outside
    Dask, and the files it read, copied into its worker's memory for it.
    ``None`` if the event now waits: for an input, for the task that freed
    its slot, or for the write of a file it read.
    """
    sources = []
    for name in e.inputs:
        src = lookups.held(builder, name, memory, event, now)
        if src is None:
            return None
        sources.append(src)
    shuffles = builder.shuffles
    if shuffles.keys and not shuffles.keys.isdisjoint(e.inputs):
        shards = shuffles.sources(
            builder, e.inputs, e.key, e.label if e.label is not None else rules.key_label(e.key),
            memory, event, now)
        if shards is None:
            return None
        sources += shards
    freed_by = lookups.freed_by(builder, e, event, now)
    if freed_by == lookups.WAITS:
        return None
    if e.io is not None and builder.writes_waiting and builder.resolving is not event:
        awaited = operations.awaited_write(builder, builder.file_reads.get(e.key, ()))
        if awaited is not None:  # a file it read is being written: the write first
            builder.waiting.park(awaited, event, now)
            return None
    newest = builder.holdings.newest
    sources += [src for name in e.reads or () if (src := newest.get(name)) is not None]
    if e.io is not None:
        sources += [read if type(read) is int else operations.read_copy(builder, read)
                    for read in builder.file_reads.pop(e.key, ())]
    return sources, freed_by


def _causes(builder: PAGBuilder, e: Compute, memory: int, sources: list[int],
            moments: tuple[float, ...], freed_by: int | None) -> list[tuple[int, int]]:
    """The resources whose release a task computed from ``sources`` may have waited for.

    The task before it on its thread (:func:`rules.thread_caused`), and
    the task whose completion released it from the scheduler's queue.
    """
    causes = []
    store = builder.store
    if e.thread is not None:
        ready_of = store.state_ready
        inputs_ready = ready_of[sources[rules.last_arriving([ready_of[s] for s in sources])]]
        before = builder.threads.cause(memory, e.thread, store.n_states,  # the id it gets
                                       rules.runnable(moments, inputs_ready), e.start,
                                       store.state_time)
        if before is not None:
            causes.append((before, _THREAD))
    if freed_by is not None:
        causes.append((freed_by, _SLOT))
    return causes


def transfer(builder: PAGBuilder, event: Any, now: float = 0.0) -> int | None:
    """Data moved between two locations: its copy at the destination."""
    e = event if type(event) is Transfer else Transfer(*event)
    busy = e.stop - e.start
    if e.nbytes is not None:
        index(e.nbytes)
    requested = rules.moment(e.requested)
    store, places = builder.store, builder.places
    source = places.code(e.source)
    src = builder.holdings.at(e.key, source)
    if src is None:
        src = lookups.missing(builder, e.key, source, event, now, created=e.start)
        if src is None:
            return None
    destination = places.code(e.destination)
    worker = places.worker[destination]
    return builder.applied(builder.new_state(
        store.state_key[src], destination,
        places.worker[source] if worker == NO_CODE else worker, None,
        store.state_size[src] if e.nbytes is None else e.nbytes, e.start, e.stop,
        rules.copy_ready(store.state_ready[src], e.start, e.stop), (src,), _TRANSFER,
        busy, (requested, *rules.NO_MOMENTS[1:])))


def file(builder: PAGBuilder, event: Any, now: float = 0.0) -> int | None:
    """A task read or wrote a file: checked, then :func:`operations.file_access`."""
    e = event if type(event) is FileAccess else FileAccess(*event)
    if (type(e.written) is not bool or not e.location.startswith("file@")
            or type(e.inputs) is not tuple):
        raise ValueError(f"not a file's access: {event!r:.120}")
    if index(e.nbytes) < 0 or e.time - e.time != 0.0:  # refused if not numbers
        raise ValueError(f"not a file's access: {event!r:.120}")
    return operations.file_access(builder, e, now)


def delete(builder: PAGBuilder, event: Any, now: float = 0.0) -> int | None:
    """Data released at a location: its tombstone, or ``None`` if it was not held there."""
    e = event if type(event) is Delete else Delete(*event)
    time = e.time + 0.0
    store = builder.store
    location = store.locations.codes.get(e.location)
    if location is None:
        return None
    src = builder.holdings.drop(e.key, location)
    if src is None:
        lookups.unheld(builder, e.key, location, event, now)
        return None
    builder.fanout.forget(src)
    dst = builder.add_state(store.state_key[src], location, store.state_worker[src],
                            NO_THREAD, 0, time, time, time, store.n_mutations)
    builder.add_mutation(src, dst, _DELETE, 0.0)
    builder.n_applied += 1
    if e.key in builder.shuffles.barriers and e.key not in builder.holdings.newest:
        builder.shuffles.release(builder, e.key, time)
    return dst


def made_by(builder: PAGBuilder, event: Any) -> tuple[str, int] | None:
    """The ``(key, location code)`` an event makes, if any (a waiting event's slot)."""
    places = builder.places
    try:
        record = parse(event)
        if type(record) is Compute:
            return record.key, places.memory_of(record.worker)
        if type(record) is Transfer:
            return record.key, places.code(record.destination)
        if type(record) is Shard:
            return (shard_key(record.key, record.destination),
                    places.memory_of(record.worker))
        if type(record) is FileAccess and record.written:  # a read's copy is its task's
            return file_path(record.location), places.code(record.location)
    except (ValueError, TypeError, AttributeError):
        pass  # malformed: it makes nothing
    return None
