"""What the scheduler adds to a graph besides Dask's events.

An application outside Dask reporting a mutation, a file a task read or
wrote, data Dask never reported, a worker lost with its data, and a new
segment that goes on where a spooled one stopped.  Each is built
from the builder's public steps, so the rules apply as for any event.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from crux_dask.events import FileAccess
from crux_dask.graph import rules
from crux_dask.model import (
    CLIENT,
    MutationKind,
    disk_location,
    file_label,
    file_path,
    memory_location,
)

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder
    from crux_dask.store import PAGStore

__all__ = ["RELEASES_CARRIED", "continue_from", "external", "file_access", "lose",
           "released_before", "unreported"]

_TRANSFER, _APPEND = int(MutationKind.TRANSFER), int(MutationKind.APPEND)
#: The copies released last that a new segment remembers of the one spooled before it:
#: workers report on their own schedule, so a task may be reported after its input's
#: release, with a spool between the two.
RELEASES_CARRIED = 8192


def external(builder: PAGBuilder, kind: str, sources: Sequence[int], key: str, label: str,
             origin: str, location: str, size: int, start: float, stop: float) -> int:
    """A mutation reported by an application outside Dask; returns the new state's id.

    ``sources`` are ids of existing states (none for ``APPEND``: the data
    appears from the run's root).  The new state is ``key`` at ``location`` at
    time ``stop``; ``stop - start`` is busy time.

    Raises
    ------
    ValueError
        If a source state does not exist or the kind is unknown.
    """
    edge_kind = int(MutationKind.parse(kind))
    store = builder.store
    for src in sources:
        if not 0 <= src < store.n_states:
            raise ValueError(f"no state {src}")
    sources = list(sources)
    if not sources:
        if builder.run_root < 0:
            builder.root(start)
        sources = [builder.run_root]
    ready = stop
    if edge_kind == _TRANSFER:
        ready = rules.copy_ready(store.state_ready[sources[-1]], start, stop)
    return builder.applied(builder.new_state(
        store.key_code(key, label, origin), builder.places.code(location), None, None, size,
        start, stop, ready, sources, edge_kind, stop - start))


def file_access(builder: PAGBuilder, e: FileAccess, now: float) -> int | None:
    """A task read or wrote a file; returns the new state's id.

    A read copies the file's newest version into the worker's memory, for
    the task's computation alone to take as an input (tasks that read one
    file at once each have their copy); the copy counts as made at the task's
    start, when the scheduler's sending of the task explains the wait.  A
    file with no version recorded was there before: it appears from the root
    of the graph that read it, when the graph reached the scheduler.  A write
    makes a new version of the file from the task's data, labelled by its
    dataset, from the task's prefix.  The seconds the task spent on its files
    are its computation's (``io``): the copies take none.  ``None`` if the
    write waits for the task's report, or the read for its computation.
    """
    store, places = builder.store, builder.places
    where = places.code(e.location)
    memory = places.memory_of(e.worker)
    path = file_path(e.location)
    if not e.written:
        reads = builder.file_reads.setdefault(e.key, [])
        if builder.holdings.at(path, where) is None and (
                e.location in builder.writes_waiting
                or any(builder.holdings.newest.get(name) is None for name in e.inputs)):
            # The task that writes the file may be one of the inputs this task
            # waits for, or wait itself for its inputs, and workers' clocks,
            # re-estimated at each heartbeat, can put the write a millisecond
            # after this read: the read is made with the task's computation,
            # after its inputs and the writes waiting (a file still unknown then
            # was there before).
            reads.append(e)
            return None
        reads.append(copy := read_copy(builder, e))
        return builder.applied(copy)
    task = builder.holdings.at(e.key, memory)
    if task is None:
        task = builder.holdings.released_at(e.key, memory)
    waiting = builder.writes_waiting
    if task is None:
        if builder.resolving is not e:
            builder.waiting.park((e.key, memory), e, now)
            waiting.setdefault(e.location, set()).add(id(e))
            return None
        task = builder.run_root if builder.run_root >= 0 else builder.root(e.time)
    if e.location in waiting:
        waiting[e.location].discard(id(e))
        if not waiting[e.location]:
            del waiting[e.location]
    prefix = store.labels.values[store.key_label[store.state_key[task]]]
    return builder.applied(builder.new_state(
        store.key_code(path, file_label(path), prefix), where, places.worker[memory], None,
        e.nbytes, e.time, e.time, e.time, (task,), _TRANSFER, 0.0))


def awaited_write(builder: PAGBuilder, reads: list[int | FileAccess]) -> tuple[str, int] | None:
    """The ``(path, location code)`` a write waiting for its task will make, of a file
    a task read and that has no version yet (``reads``: :attr:`PAGBuilder.file_reads`
    of the task), if any: the task waits for it."""
    for read in reads:
        if type(read) is not int and read.location in builder.writes_waiting:
            path, where = file_path(read.location), builder.places.code(read.location)
            if builder.holdings.at(path, where) is None:
                return path, where
    return None


def read_copy(builder: PAGBuilder, e: FileAccess) -> int:
    """The copy into the worker's memory of the newest version of the file ``e`` read
    (of one that was there before, if none was recorded); its id."""
    store, places = builder.store, builder.places
    where = places.code(e.location)
    src = builder.holdings.at(file_path(e.location), where)
    if src is None:
        src = unreported(builder, file_path(e.location), where, None, e.nbytes, e.root)
    return builder.new_state(
        store.state_key[src], places.memory_of(e.worker), None, None, store.state_size[src],
        e.time, e.time, rules.copy_ready(store.state_ready[src], e.time, e.time), (src,),
        _TRANSFER, 0.0,
        (rules.moment(e.requested), rules.moment(e.received), *rules.NO_MOMENTS[2:-1],
         builder.submitted(e.root)),
        held=False)


def lose(builder: PAGBuilder, worker: str, time: float) -> int:
    """``worker`` is gone with its data: release every copy it held; return how many."""
    store = builder.store
    where = store.state_location
    places = {code for name in (memory_location(worker), disk_location(worker))
              if (code := store.locations.codes.get(name)) is not None}
    lost = [(store.keys.values[store.state_key[sid]], store.locations.values[where[sid]])
            for sid in builder.live_states() if where[sid] in places]
    for key, location in lost:
        builder.delete(key, location, time)
    builder.n_lost += len(lost)
    return len(lost)


def continue_from(builder: PAGBuilder, previous: PAGBuilder, time: float) -> int:
    """Start ``builder`` where ``previous`` stops: its live data reappears, from a root.

    Used when a graph is spooled to disk and recording goes on in a new
    segment: later events about data made before still find a state.
    Waiting events and the shuffles under way move over too, and the copies
    released last are remembered (:func:`released_before`).  Returns how many states carried over.
    """
    old, store, places = previous.store, builder.store, builder.places
    root = builder.root(time, "continued")
    carried = previous.live_states()
    for sid in carried:
        code = old.state_key[sid]
        key = store.key_code(old.keys.values[code], old.labels.values[old.key_label[code]],
                             old.labels.values[old.key_origin[code]])
        moment = old.state_time[sid]
        builder.new_state(key, places.code(old.locations.values[old.state_location[sid]]),
                          None, None, old.state_size[sid], moment, moment, moment, (root,),
                          _APPEND, 0.0)
    builder.released_before = {
        (name, places.code(old.locations.values[where])): _carried(old, sid, root)
        for name, where, sid in previous.holdings.latest_released(RELEASES_CARRIED)}
    builder.waiting.adopt(previous.waiting, lambda slot: (
        slot[0], places.code(old.locations.values[slot[1]])))
    builder.writes_waiting = previous.writes_waiting
    builder.n_fallbacks += previous.n_fallbacks  # a count of the whole run
    builder.shuffles.adopt(previous.shuffles,
                           lambda location: places.code(old.locations.values[location]))
    return len(carried)


def _carried(store: PAGStore, sid: int, root: int) -> tuple[str, str, int, float, int]:
    """What :func:`released_before` needs of state ``sid`` of ``store``: its key's label
    and origin, its size and time, and the root it appears from in the next segment."""
    code = store.state_key[sid]
    return (store.labels.values[store.key_label[code]],
            store.labels.values[store.key_origin[code]], store.state_size[sid],
            store.state_time[sid], root)


def released_before(builder: PAGBuilder, key: str, location: int) -> int | None:
    """The copy of ``key`` at ``location`` that the segment before this one released
    shortly before it was spooled, made in this one (appearing from the root it
    continues from, not held), if there was one: an event reported after the
    release needs it.  Made once, it is found among this segment's releases."""
    carried = builder.released_before.pop((key, location), None)
    if carried is None:
        return None
    label, origin, size, moment, root = carried
    sid = builder.new_state(builder.store.key_code(key, label, origin), location, None, None,
                            size, moment, moment, moment, (root,), _APPEND, 0.0, held=False)
    builder.holdings.released_elsewhere(key, location, sid)
    return sid


def unreported(builder: PAGBuilder, key: str, location: int, created: float | None,
               size: int = 0, root: int = -1) -> int:
    """A state for data of ``key`` at ``location`` that Dask never reported.

    A file that already existed, data the client scattered, data older than
    the capture: it appears from ``root`` (default: the run's), at
    ``created`` (default: the root's time), ``size`` bytes long where known.
    Returns its id.
    """
    store = builder.store
    if builder.run_root < 0:
        builder.root(0.0 if created is None else created)
    if root not in builder.roots:
        root = builder.run_root
    time = store.state_time[root] if created is None else created
    where = store.locations.values[location]
    newest = builder.holdings.newest.get(key)
    code = (store.key_code(key, _label_of(key, where), _origin_of(where))
            if newest is None else store.state_key[newest])
    return builder.new_state(code, location, None, None, size, time, time, time,
                             (root,), _APPEND, 0.0)


def _label_of(key: str, location: str) -> str:
    if location.startswith("file@"):
        return file_label(file_path(location))
    return rules.key_label(key)


def _origin_of(location: str) -> str:
    if location == CLIENT:
        return CLIENT
    if location.startswith("file@"):
        return "file"
    return "unknown"
