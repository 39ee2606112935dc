"""Turn data-state events into a program activity graph.

The builder applies the mapping rules of the data model
(:mod:`crux_dask.graph.rules`):

* a graph reaching the scheduler creates a ``root`` state;
* a task computed on worker ``W`` from inputs ``D1..Dn`` (each a state in
  ``W``'s memory) creates ``key@memory@W`` with one mutation per input:
  ``APPEND`` from the graph's root for ``n = 0``, ``CONVERT`` for ``n = 1``,
  ``MERGE`` for ``n >= 2``, and ``SPLIT`` where one input feeds ``k > 1``
  single-input siblings of the same task group;
* moving data between locations (worker to worker, spill, file I/O, client)
  is a ``TRANSFER``; releasing data is a ``DELETE`` to a zero-size tombstone.

Events are the records of :mod:`crux_dask.events` (or plain tuples of the same
fields), or the same events in columns (:class:`~crux_dask.columns.EventColumns`,
what the wire format carries).  Runs of routine events in columns are applied a
window at a time by :mod:`crux_dask.graph.window`, with the same result.  An
event whose input is not known yet waits (:mod:`crux_dask.graph.waiting`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from operator import index
from typing import TYPE_CHECKING, Any

from crux_dask.columns import EventColumns
from crux_dask.events import Compute, Delete, FileAccess, Root, Shard, Transfer, parse
from crux_dask.graph import lookups, operations, rules, shuffles
from crux_dask.graph.feed import Feed, OnError
from crux_dask.graph.holdings import Holdings
from crux_dask.graph.places import Places
from crux_dask.graph.waiting import Waiting
from crux_dask.growable import NO_CODE
from crux_dask.model import ROOT, CauseKind, MutationKind, file_path, shard_key
from crux_dask.store import NO_THREAD, PAGStore

if TYPE_CHECKING:
    from crux_dask.pag import PAG

__all__ = ["PAGBuilder"]

_TRANSFER, _APPEND, _DELETE = (int(MutationKind.TRANSFER), int(MutationKind.APPEND),
                               int(MutationKind.DELETE))
_THREAD, _SLOT = int(CauseKind.THREAD), int(CauseKind.SLOT)
_NAN = float("nan")
_DONE = object()  # the end of an iterator of waiting events


class PAGBuilder:
    """Build a :class:`~crux_dask.store.PAGStore` from events.

    Parameters
    ----------
    run_id : str, optional
        Identifier of the run; a new uuid4 hex by default.
    max_released : int
        How many released copies to remember as sources of events reported
        late (a fetch reported after the source worker released its copy).

    Attributes
    ----------
    store : PAGStore
        The graph being built.
    holdings, waiting, places : Holdings, Waiting, Places
        What is held where, the events waiting for an input, location codes.
    fanout, ends : rules.FanOut, rules.EndTracker
        The state of the ``SPLIT`` and end-of-graph rules.
    shuffles : shuffles.Shuffles
        The P2P shuffles' transfer tasks and barriers seen so far.
    resolving : event or None
        The event :meth:`resolve_parked` applies now: it takes stand-ins for
        what it misses instead of waiting again.
    roots : set of int
        The root states; ``run_root`` is the first.
    threads : rules.ThreadLanes
        The last task computed on each executor thread.
    n_applied, n_fallbacks, n_lost : int
        Events turned into states; inputs that never arrived and were replaced
        by the best state known (in the segments before too); copies released
        because their worker was lost.
    released_before : dict
        The copies the segment before this one released last, by ``(key,
        location code)``: see :func:`~crux_dask.graph.operations.released_before`.
    """

    def __init__(self, run_id: str | None = None, max_released: int = 50_000) -> None:
        self.store = store = PAGStore(run_id or uuid.uuid4().hex)
        self.holdings = Holdings(store, max_released)
        self.waiting = Waiting()
        self._releasing = False  # applied() is applying what waited
        self.released_before: dict[tuple[str, int], tuple] = {}
        self.fanout = rules.FanOut()
        self.ends = rules.EndTracker()
        self.roots: set[int] = set()
        self.threads = rules.ThreadLanes()
        self.run_root = -1
        self.n_applied = self.n_fallbacks = self.n_lost = 0
        self._root_key = store.key_code(ROOT, ROOT, "crux")
        self.places = Places(store)
        self.resolving: Any = None  # the event resolve_parked applies with stand-ins
        # task -> copies of the files it read (a read of a file unknown then: its event)
        self.file_reads: dict[str, list[int | FileAccess]] = {}
        # file location -> the writes of it waiting for their task's report (their ids)
        self.writes_waiting: dict[str, set[int]] = {}
        self.shuffles = shuffles.Shuffles()
        self.feed = Feed(self)
        self._dispatch: dict[str, Callable[[Any, float], int | None]] = {
            "compute": self._compute, "transfer": self._transfer, "delete": self._delete,
            "root": self._root, "file": self._file, "shard": self._shard}

    @property
    def run_id(self) -> str:
        return self.store.run_id

    @property
    def end(self) -> int:
        """The graph's end state (``-1`` while there is none); see :class:`rules.EndTracker`."""
        return self.ends.end

    @property
    def n_parked(self) -> int:
        """Events waiting for an input now."""
        return len(self.waiting)

    @property
    def n_parked_total(self) -> int:
        """Events that had to wait for an input."""
        return self.waiting.total

    @property
    def n_live(self) -> int:
        """How many copies of data are held somewhere now."""
        return len(self.holdings)

    def live_states(self) -> list[int]:
        """Ids of the states whose data is still held somewhere (every copy), ascending."""
        return self.holdings.states()

    # -- applying events ------------------------------------------------------
    def apply(self, event: Sequence[Any], now: float = 0.0) -> int | None:
        """Apply one event; ``now`` (the caller's clock) times out waiting events.

        Returns the id of the state created, or ``None`` if nothing was
        created (the event waits for an input, or releases data never
        recorded).

        Raises
        ------
        ValueError, TypeError
            If the event is malformed; nothing changes then.
        """
        try:
            handler = self._dispatch[event[0]]
        except (KeyError, TypeError, IndexError):
            parse(event)  # raises with the reason
            raise
        return handler(event, now)

    def apply_many(self, events: Iterable[Sequence[Any]], now: float = 0.0,
                   on_error: OnError | None = None) -> None:
        """Apply events in order, as :meth:`apply` one by one would.

        ``on_error`` is called with ``(event, exception)`` for an event that
        cannot be applied, and the others go on; without it the exception is
        raised (the events before it stay applied).  Routine events go a
        window at a time (:mod:`crux_dask.graph.feed`).
        """
        self.feed.apply_many(events, now, on_error)

    def apply_columns(self, columns: EventColumns, now: float = 0.0,
                      on_error: OnError | None = None) -> None:
        """Apply events given in columns, in order, as :meth:`apply_many` does."""
        self.feed.apply_columns(columns, now, on_error)

    def apply_batch(self, data: bytes, now: float = 0.0) -> int:
        """Decode an encoded batch and apply its events; return how many.

        Raises
        ------
        crux_dask.validation.BatchError
            If the batch is malformed; then nothing of it is applied.
        """
        return self.feed.apply_batch(data, now)

    # -- the events, by name ----------------------------------------------------
    def root(self, time: float, label: str = "graph") -> int:
        """A graph reached the scheduler at ``time``: create its root state."""
        return self._root(Root("root", time, label))

    def compute(self, key: str, worker: str, thread: int | None, start: float, stop: float,
                nbytes: int, inputs: Sequence[str] = (), root: int = -1,
                label: str | None = None, group: str | None = None,
                kind: str | None = None, location: str | None = None,
                origin: str | None = None, reads: Sequence[str] | None = None, *,
                sent: float | None = None, received: float | None = None,
                runnable: float | None = None, released_by: str | None = None,
                released_on: str | None = None, priority: float | None = None,
                io: float | None = None, first_requested: float | None = None,
                now: float = 0.0) -> int | None:
        """A task computed; the fields are those of :class:`~crux_dask.events.Compute`.

        ``kind`` is the event's ``mutation`` field.
        """
        return self._compute(Compute(
            "compute", key, worker, thread, start, stop, nbytes, tuple(inputs), root, label,
            group, kind, location, origin, tuple(reads) if reads else None, sent, received,
            runnable, released_by, released_on, priority, io, first_requested), now)

    def transfer(self, key: str, source: str, destination: str, start: float, stop: float,
                 nbytes: int | None = None, *, now: float = 0.0) -> int | None:
        """Data of ``key`` moved from location ``source`` to ``destination``.

        A source Dask does not report (a file written outside the workflow,
        data the client scattered) is created on the fly, appended from the
        run's root.
        """
        return self._transfer(Transfer("transfer", key, source, destination, start, stop,
                                       nbytes), now)

    def delete(self, key: str, location: str, time: float, now: float = 0.0) -> int | None:
        """Data of ``key`` released at ``location``; returns the tombstone's id."""
        return self._delete(Delete("delete", key, location, time), now)

    # -- handlers ---------------------------------------------------------------
    def _root(self, event: Any, now: float = 0.0) -> int:
        event = event if type(event) is Root else Root(*event)
        time = event.time + 0.0  # a number, or refused
        sid = self._add_state(self._root_key, self.places.root, NO_CODE, NO_THREAD, 0,
                              time, time, time, -1)
        self.roots.add(sid)
        if self.run_root < 0:
            self.run_root = sid
        self.n_applied += 1
        return sid

    def _compute(self, event: Any, now: float = 0.0) -> int | None:
        e = event if type(event) is Compute else Compute(*event)
        busy = e.stop - e.start  # refuse a malformed event before anything changes
        index(e.nbytes)
        if e.thread is not None:
            index(e.thread)
        moments = (rules.moment(e.sent), rules.moment(e.received), rules.moment(e.runnable),
                   rules.moment(e.priority), rules.moment(e.io),
                   rules.moment(e.first_requested), self.submitted(e.root))
        kind = None if e.mutation is None else int(MutationKind.parse(e.mutation))
        store, holdings = self.store, self.holdings
        memory = self.places.memory_of(e.worker)
        sources = []
        for name in e.inputs:
            src = lookups.held(self, name, memory, event, now)
            if src is None:
                return None
            sources.append(src)
        if self.shuffles.keys and not self.shuffles.keys.isdisjoint(e.inputs):
            shards = self.shuffles.sources(
                self, e.inputs, e.key, e.label if e.label is not None else rules.key_label(e.key),
                memory, event, now)
            if shards is None:
                return None
            sources += shards
        freed_by = lookups.freed_by(self, e, event, now)
        if freed_by == lookups.WAITS:
            return None
        if e.io is not None and self.writes_waiting and self.resolving is not event:
            awaited = operations.awaited_write(self, self.file_reads.get(e.key, ()))
            if awaited is not None:  # a file it read is being written: the write first
                self.waiting.park(awaited, event, now)
                return None
        # Data the task read outside Dask: its newest copy, wherever it is; the
        # files it read, copied into its worker's memory for it.
        sources += [src for name in e.reads or () if (src := holdings.newest.get(name))
                    is not None]
        if e.io is not None:
            sources += [read if type(read) is int else operations.read_copy(self, read)
                        for read in self.file_reads.pop(e.key, ())]
        labels = store.labels
        label = labels.code(e.label if e.label is not None else rules.key_label(e.key))
        previous = holdings.newest.get(e.key)
        if previous is None:
            key = store.add_key(e.key, label, label if e.origin is None
                                else labels.code(e.origin))
        else:
            key = store.state_key[previous]
        if kind is None:
            kind = rules.task_kind(len(sources))
            if kind == rules.CONVERT:
                kind = self.fanout.kind(sources[0], label if e.group is None
                                        else labels.code(e.group), store.n_mutations,
                                        store.mutation_kind)
        if not sources:
            root = e.root
            if root not in self.roots:
                root = self.run_root if self.run_root >= 0 else self._root(
                    Root("root", e.start))
            sources.append(root)
        location = memory if e.location is None else self.places.code(e.location)
        causes = self._causes(e, memory, sources, moments, freed_by)
        dst = self.new_state(key, location, self.places.worker[memory], e.thread, e.nbytes,
                             e.start, e.stop, e.stop, sources, kind, busy, moments, causes)
        if location != memory:
            self._hold(e.key, memory, dst)
        return self.applied(dst)

    def _transfer(self, event: Any, now: float = 0.0) -> int | None:
        e = event if type(event) is Transfer else Transfer(*event)
        busy = e.stop - e.start
        if e.nbytes is not None:
            index(e.nbytes)
        requested = rules.moment(e.requested)
        store, places = self.store, self.places
        source = places.code(e.source)
        src = self.holdings.at(e.key, source)
        if src is None:
            src = lookups.missing(self, e.key, source, event, now, created=e.start)
            if src is None:
                return None
        destination = places.code(e.destination)
        worker = places.worker[destination]
        return self.applied(self.new_state(
            store.state_key[src], destination,
            places.worker[source] if worker == NO_CODE else worker, None,
            store.state_size[src] if e.nbytes is None else e.nbytes, e.start, e.stop,
            rules.copy_ready(store.state_ready[src], e.start, e.stop), (src,), _TRANSFER,
            busy, (requested, *rules.NO_MOMENTS[1:])))

    def _file(self, event: Any, now: float = 0.0) -> int | None:
        e = event if type(event) is FileAccess else FileAccess(*event)
        if (type(e.written) is not bool or not e.location.startswith("file@")
                or type(e.inputs) is not tuple):
            raise ValueError(f"not a file's access: {event!r:.120}")
        if index(e.nbytes) < 0 or e.time - e.time != 0.0:  # refused if not numbers
            raise ValueError(f"not a file's access: {event!r:.120}")
        return operations.file_access(self, e, now)

    def _shard(self, event: Any, now: float = 0.0) -> int | None:
        return shuffles.shard(self, event, now)

    def _delete(self, event: Any, now: float = 0.0) -> int | None:
        e = event if type(event) is Delete else Delete(*event)
        time = e.time + 0.0
        store = self.store
        location = store.locations.codes.get(e.location)
        if location is None:
            return None
        src = self.holdings.drop(e.key, location)
        if src is None:
            lookups.unheld(self, e.key, location, event, now)
            return None
        self.fanout.forget(src)
        dst = self._add_state(store.state_key[src], location, store.state_worker[src],
                              NO_THREAD, 0, time, time, time, store.n_mutations)
        self._add_mutation(src, dst, _DELETE, 0.0)
        self.n_applied += 1
        if e.key in self.shuffles.barriers and e.key not in self.holdings.newest:
            self.shuffles.release(self, e.key, time)
        return dst

    # -- what the scheduler adds --------------------------------------------------
    def external(self, kind: str, sources: Sequence[int], key: str, label: str, origin: str,
                 location: str, size: int, start: float, stop: float) -> int:
        """A mutation reported by an application outside Dask: :func:`operations.external`."""
        return operations.external(self, kind, sources, key, label, origin, location, size,
                                   start, stop)

    def lose(self, worker: str, time: float) -> int:
        """A worker is gone with its data: :func:`operations.lose`."""
        return operations.lose(self, worker, time)

    def continue_from(self, previous: PAGBuilder, time: float) -> int:
        """Go on where ``previous`` stopped: :func:`operations.continue_from`."""
        return operations.continue_from(self, previous, time)

    def resolve_parked(self, older_than: float | None = None) -> int:
        """Apply waiting events with the best input available; return how many.

        See :meth:`~crux_dask.graph.waiting.Waiting.resolve`.

        Parameters
        ----------
        older_than : float, optional
            Only events that started waiting before this time (the ``now``
            they were applied with); all of them by default.
        """
        applied = self.n_applied
        self.waiting.resolve(self.apply, self._apply_with_stand_ins, older_than,
                             self._made_by)
        return self.n_applied - applied

    def submitted(self, root: int) -> float:
        """When the graph of root state ``root`` reached the scheduler (NaN: not a root)."""
        return self.store.state_time[root] if root in self.roots else _NAN

    def _made_by(self, event: Any) -> tuple[str, int] | None:
        """The ``(key, location code)`` an event makes, if any (a waiting event's slot)."""
        try:
            record = parse(event)
            if type(record) is Compute:
                return record.key, self.places.memory_of(record.worker)
            if type(record) is Transfer:
                return record.key, self.places.code(record.destination)
            if type(record) is Shard:
                return (shard_key(record.key, record.destination),
                        self.places.memory_of(record.worker))
            if type(record) is FileAccess and record.written:  # a read's copy is its task's
                return file_path(record.location), self.places.code(record.location)
        except (ValueError, TypeError, AttributeError):
            pass  # malformed: it makes nothing
        return None

    def _apply_with_stand_ins(self, event: Any) -> None:
        self.resolving = event
        try:
            self.apply(event)
        finally:
            self.resolving = None

    def pag(self) -> PAG:
        """The graph so far, as a :class:`~crux_dask.pag.PAG` (shares the store)."""
        from crux_dask.pag import PAG

        return PAG([self.store], [self.end])

    # -- internals --------------------------------------------------------------
    def _add_state(self, key: int, location: int, worker: int, thread: int, size: int,
                   start: float, time: float, ready: float, pred: int,
                   moments: tuple[float, ...] = rules.NO_MOMENTS) -> int:
        store = self.store
        sid = store.n_states
        store.state_requested.append(moments[0])
        store.state_received.append(moments[1])
        store.state_runnable.append(moments[2])
        store.state_priority.append(moments[3])
        store.state_io.append(moments[4])
        store.state_first_requested.append(moments[5])
        store.state_submitted.append(moments[6])
        store.state_cause.append(-1)
        store.state_time.append(time)
        store.state_start.append(start)
        store.state_ready.append(ready)
        store.state_size.append(size)
        store.state_key.append(key)
        store.state_location.append(location)
        store.state_worker.append(worker)
        store.state_thread.append(thread)
        store.state_pred.append(pred)
        return sid

    def _add_mutation(self, src: int, dst: int, kind: int, busy: float) -> None:
        store = self.store
        store.mutation_src.append(src)
        store.mutation_dst.append(dst)
        store.mutation_kind.append(kind)
        store.mutation_busy.append(busy)

    def new_state(self, key: int, location: int, worker: int | None, thread: int | None,
                  size: int, start: float, time: float, ready: float, sources: Sequence[int],
                  kind: int, busy: float,
                  moments: tuple[float, ...] = rules.NO_MOMENTS,
                  causes: Sequence[tuple[int, int]] = (), held: bool = True) -> int:
        """Add a state made by ``kind`` from ``sources``, held at ``location``; its id.

        ``key``, ``location`` and ``worker`` are codes (``worker`` ``None``:
        the location's).  ``moments`` are the operation's ``requested``,
        ``received`` and ``runnable`` times, ``causes`` ``(state, CauseKind)``
        pairs.  The state's last-arriving input and cause, what is held where
        and the graph's end follow the rules; waiting events are released by
        :meth:`applied`.  A state not ``held`` (a copy made for one task
        only) is not among what is held, nor a candidate for the graph's end.
        """
        store = self.store
        ready_of = store.state_ready
        pred = store.n_mutations + rules.last_arriving([ready_of[s] for s in sources])
        sid = self._add_state(key, location, self.places.worker[location] if worker is None
                              else worker, NO_THREAD if thread is None else thread, size,
                              start, time, ready, pred, moments)
        for src in sources:
            self._add_mutation(src, sid, kind, busy)
        if causes:
            time_of = store.state_time
            store.state_cause[sid] = store.n_causes + rules.last_arriving(
                [time_of[src] for src, _ in causes])
            for src, cause in causes:
                store.cause_src.append(src)
                store.cause_dst.append(sid)
                store.cause_kind.append(cause)
        if held and location != self.places.root:
            self._hold(store.keys.values[key], location, sid)
            self.ends.add(sid, time, sources)
        return sid

    def _causes(self, e: Compute, memory: int, sources: list[int],
                moments: tuple[float, ...], freed_by: int | None
                ) -> list[tuple[int, int]]:
        """The resources whose release a task computed from ``sources`` may have waited for.

        The task before it on its thread (:func:`rules.thread_caused`), and
        the task whose completion released it from the scheduler's queue.
        """
        causes = []
        store = self.store
        if e.thread is not None:
            ready_of = store.state_ready
            inputs_ready = ready_of[sources[rules.last_arriving([ready_of[s] for s in sources])]]
            before = self.threads.cause(memory, e.thread, store.n_states,  # the id it gets
                                        rules.runnable(moments, inputs_ready), e.start,
                                        store.state_time)
            if before is not None:
                causes.append((before, _THREAD))
        if freed_by is not None:
            causes.append((freed_by, _SLOT))
        return causes

    def applied(self, sid: int) -> int:
        """An event made ``sid``: count it, apply the events that waited for it; ``sid``.

        The events that waited for what a waiting event made go right after
        it, before the next one that waited with it, as if each applied its
        own: the outermost call does it all with a stack of its own, so that a
        chain of events each waiting for the one before takes no stack frame
        per link (3,000 of them exceeded Python's recursion limit).
        """
        self.n_applied += 1
        if self._releasing:
            return sid
        self._releasing = True
        waiting, stack = self.waiting, []
        try:
            while True:
                if waiting.arrived:
                    since, events = waiting.pop_arrived()
                    stack.append((since, iter(events)))
                elif not stack:
                    return sid
                since, events = stack[-1]
                event = next(events, _DONE)
                if event is _DONE:
                    stack.pop()
                else:
                    self.apply(event, since)
        finally:
            self._releasing = False

    def _hold(self, key: str, location: int, sid: int) -> None:
        self.holdings.add(key, location, sid)
        self.waiting.appeared((key, location))
