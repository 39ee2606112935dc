"""Turn data-state events into a program activity graph.

The builder applies the mapping rules of the data model:

* a graph reaching the scheduler creates a ``root`` state;
* a task computed on worker ``W`` from inputs ``D1..Dn`` (each a state in
  ``W``'s memory) creates ``key@memory@W`` with one mutation per input:
  ``APPEND`` from the graph's root for ``n = 0``, ``CONVERT`` for ``n = 1``,
  ``MERGE`` for ``n >= 2``, and ``SPLIT`` where one input feeds ``k > 1``
  single-input siblings of the same task group;
* moving data between locations (worker to worker, spill, file I/O, client)
  is a ``TRANSFER``; releasing data is a ``DELETE`` to a zero-size tombstone.

Events come from several sources with different latencies (the scheduler sees
a task finish before the worker that ran it has reported the transfer of its
inputs).  An event whose input is not yet known is *parked* until the state it
needs appears, and applied with the best available input by
:meth:`PAGBuilder.resolve_parked` (on a flush, or after a timeout).

Events are plain tuples ``(kind, *fields)`` with the fields of
:data:`EVENT_KINDS`, or the same events in columns
(:class:`~crux_dask.columns.EventColumns`, what the wire format carries).  This
module applies them one by one; :meth:`PAGBuilder.apply_columns` hands runs of
routine events to :mod:`crux_dask.build.window`, which applies a window of them at once
with the same result.
"""

from __future__ import annotations

import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from operator import index
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.build.window import apply_window
from crux_dask.codec import decode_batch
from crux_dask.columns import EventColumns
from crux_dask.model import CLIENT, EVENT_KINDS, ROOT, MutationKind, memory_location
from crux_dask.store import NO_CODE, NO_THREAD, PAGStore

if TYPE_CHECKING:
    from crux_dask.pag import PAG

__all__ = ["EVENT_KINDS", "PAGBuilder"]

_TRANSFER = int(MutationKind.TRANSFER)
_CONVERT = int(MutationKind.CONVERT)
_APPEND = int(MutationKind.APPEND)
_SPLIT = int(MutationKind.SPLIT)
_MERGE = int(MutationKind.MERGE)
_DELETE = int(MutationKind.DELETE)

#: Locations whose data Dask reports itself, so a missing state is worth waiting for.
_AWAITED = ("memory@", "disk@")
_HEX = re.compile(r"[a-f0-9]+")
#: Sizes of the windows of events :meth:`PAGBuilder.apply_many` applies at once.  A
#: window costs about a millisecond whatever its size, which fewer events than the
#: minimum would not repay.
_WINDOW_MIN = 512
_WINDOW_MAX = 16_384

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
    end : int
        The latest state that is not a root or a tombstone (``-1`` while none).
    n_applied : int
        Events turned into states.
    n_parked_total : int
        Events that had to wait for an input.
    n_fallbacks : int
        Inputs that never arrived and were replaced by the best state known.
    n_lost : int
        Copies released because the worker holding them was lost.
    """

    def __init__(self, run_id: str | None = None, max_released: int = 50_000) -> None:
        self.store = store = PAGStore(run_id or uuid.uuid4().hex)
        self.end = -1
        self._end_time = float("-inf")
        self.n_applied = 0
        self.n_parked_total = 0
        self.n_fallbacks = 0
        self.n_lost = 0
        # Where data lives now: key -> its newest live state, and for data held
        # in several places, key -> {location: state} of the other copies.
        self._live: dict[str, int] = {}
        self._copies: dict[str, dict[int, int]] = {}
        # (key, location) -> the state released there last: workers report on
        # their own schedule, so a fetch from a copy may arrive after its release.
        # Indexed from the DELETE mutations only when a lookup needs it.
        self._released: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._released_upto = 0
        self.max_released = max_released
        # source state -> (task group code, its first single-input mutation, -1 once split)
        self._fanout: dict[int, tuple[int, int]] = {}
        # (key, location) -> events waiting for that state; when they started waiting
        self._parked: dict[tuple[str, int], list[tuple]] = {}
        self._parked_at: dict[tuple[str, int], float] = {}
        self._ready: list[tuple[str, int]] = []
        self._resolving: tuple | None = None  # the event resolve_parked applies now
        self._window = _WINDOW_MIN  # events apply_many plans at once; adapts to the stream
        self._roots: set[int] = set()
        self._run_root = -1
        self._memory_codes: dict[str, int] = {}
        self._location_workers: dict[int, int] = {}
        self._root_key = store.key_code(ROOT, ROOT, "crux")
        self._root_location = self._location(ROOT)
        self._dispatch = {
            "compute": self._compute,
            "transfer": self._transfer,
            "delete": self._delete,
            "root": self._root,
        }
        self._add_state = (
            store.state_time.append, store.state_start.append, store.state_ready.append,
            store.state_size.append,
            store.state_key.append, store.state_location.append,
            store.state_worker.append, store.state_thread.append, store.state_pred.append,
        )
        self._add_mutation = (
            store.mutation_src.append, store.mutation_dst.append,
            store.mutation_kind.append, store.mutation_busy.append,
        )

    @property
    def run_id(self) -> str:
        return self.store.run_id

    @property
    def n_parked(self) -> int:
        """Events currently waiting for an input."""
        return sum(len(v) for v in self._parked.values())

    # -- public entry points ------------------------------------------------
    def apply(self, event: Sequence[Any], now: float = 0.0) -> int | None:
        """Apply one event ``(kind, *fields)``; see :data:`EVENT_KINDS`.

        Parameters
        ----------
        event : tuple
        now : float
            The caller's clock, to time out events that wait for an input.

        Returns
        -------
        int or None
            The id of the state created, or ``None`` if nothing was created
            (the event waits for an input, or releases data never recorded).
        """
        try:
            handler = self._dispatch[event[0]]
        except KeyError:
            raise ValueError(f"unknown event kind {event[0]!r}") from None
        return handler(event, now)

    def apply_many(self, events: Iterable[Sequence[Any]], now: float = 0.0,
                   on_error: Callable[[Sequence[Any], Exception], None] | None = None) -> None:
        """Apply events in order, as :meth:`apply` one by one would.

        Enough events are put in columns (:class:`~crux_dask.columns.EventColumns`)
        and applied as :meth:`apply_columns` does.

        Parameters
        ----------
        events : iterable of tuple
        now : float
            As for :meth:`apply`.
        on_error : callable, optional
            Called with ``(event, exception)`` for an event that cannot be
            applied, and the others go on; without it the exception is raised
            (the events before it stay applied).
        """
        events = events if isinstance(events, list) else list(events)
        if len(events) < _WINDOW_MIN:
            self._one_by_one(events, now, on_error)
            return
        # Encoded a window's worth at a time: smaller tables stay in cache.
        for start in range(0, len(events), _WINDOW_MAX):
            piece = events[start:start + _WINDOW_MAX]
            self._apply_columns(EventColumns.from_events(piece), piece.__getitem__, now,
                                on_error)

    def apply_columns(self, columns: EventColumns, now: float = 0.0,
                      on_error: Callable[[Sequence[Any], Exception], None] | None = None
                      ) -> None:
        """Apply events given in columns, in order, as :meth:`apply` one by one would.

        Runs of routine events (see :mod:`crux_dask.build.window`) are applied a
        window at a time with array operations; the others one by one.
        ``now`` and ``on_error`` are as for :meth:`apply_many`.
        """
        if len(columns) < _WINDOW_MIN:
            self._one_by_one(columns.events(), now, on_error)
        else:
            self._apply_columns(columns, columns.event, now, on_error)

    def _apply_columns(self, columns: EventColumns, event_at: Callable[[int], Sequence[Any]],
                       now: float, on_error: Callable | None) -> None:
        position, n = 0, len(columns)
        while position < n:
            stop = n  # too few left for a window: one by one
            if n - position >= _WINDOW_MIN:
                size = min(self._window, n - position)
                try:
                    done = apply_window(self, columns, position, position + size)
                except Exception:  # malformed somewhere: one by one, which names it
                    self._window = _WINDOW_MIN
                    stop = position + size
                else:
                    position += done
                    if done == size:
                        self._window = min(2 * self._window, _WINDOW_MAX)
                        continue
                    # Planning costs the whole window: size the next one by what it took.
                    self._window = max(_WINDOW_MIN, min(2 * done, _WINDOW_MAX))
                    stop = position + 1  # the event that ended the window
            self._one_by_one(map(event_at, range(position, stop)), now, on_error)
            position = stop

    def _one_by_one(self, events: Iterable[Sequence[Any]], now: float,
                    on_error: Callable | None) -> None:
        dispatch = self._dispatch
        for event in events:
            try:
                handler = dispatch[event[0]]
            except (KeyError, TypeError, IndexError):
                handler = self.apply
            if on_error is None:
                handler(event, now)
                continue
            try:
                handler(event, now)
            except Exception as error:
                on_error(event, error)

    def apply_batch(self, data: bytes, now: float = 0.0) -> int:
        """Decode an encoded batch and apply its events; return how many.

        Raises
        ------
        crux_dask.codec.BatchError
            If the batch is malformed; then nothing of it is applied.
        """
        batch = decode_batch(data)
        if batch.columns is not None:
            self.apply_columns(batch.columns, now)
        else:
            self.apply_many(batch.rows, now)
        return len(batch)

    def root(self, time: float, label: str = "graph") -> int:
        """A graph reached the scheduler at ``time``: create its root state."""
        return self._root(("root", time, label))

    def compute(self, key: str, worker: str, thread: int | None, start: float, stop: float,
                nbytes: int, inputs: Sequence[str] = (), root: int = -1,
                label: str | None = None, group: str | None = None, kind: str | None = None,
                location: str | None = None, origin: str | None = None,
                reads: Sequence[str] | None = None, *, now: float = 0.0) -> int | None:
        """A task computed on ``worker`` from ``inputs`` (keys) between ``start`` and ``stop``.

        ``root`` is the root state of the task's graph (used when there are no
        inputs).  ``label`` defaults to the task prefix and ``group`` (the task
        group, to recognise ``SPLIT``) to the label; ``kind`` and ``location``
        override the mutation kind and the state's location (from
        ``dask.annotate(crux=...)``); ``origin`` (default: the label) says what
        produced the data, ``"erred"`` for a task that failed.  ``reads`` are
        keys of data the task reads outside Dask (a file, an external
        application's output): their newest copies are inputs too.  ``now`` is
        as for :meth:`apply`.
        """
        return self._compute(("compute", key, worker, thread, start, stop, nbytes,
                              tuple(inputs), root, label, group, kind, location, origin,
                              tuple(reads) if reads else None), now)

    def transfer(self, key: str, source: str, destination: str, start: float, stop: float,
                 nbytes: int | None = None, *, now: float = 0.0) -> int | None:
        """Data of ``key`` moved from location ``source`` to ``destination``.

        Locations are strings such as ``memory@tcp://...``, ``disk@...``,
        ``file@host:/path`` or ``client``.  A source Dask does not report (a
        file written outside the workflow, data the client scattered) is
        created on the fly, appended from the run's root.
        """
        return self._transfer(("transfer", key, source, destination, start, stop, nbytes), now)

    def delete(self, key: str, location: str, time: float) -> int | None:
        """Data of ``key`` released at ``location``; returns the tombstone's id."""
        return self._delete(("delete", key, location, time))

    def external(self, kind: str, sources: Sequence[int], key: str, label: str, origin: str,
                 location: str, size: int, start: float, stop: float) -> int:
        """A mutation reported by an application outside Dask; returns the new state's id.

        ``sources`` are ids of existing states (none for ``APPEND``: the data
        appears from the run's root).  The new state is ``key`` at ``location``
        at time ``stop``; ``stop - start`` is busy time.

        Raises
        ------
        ValueError
            If a source state does not exist or the kind is unknown.
        """
        edge_kind = int(MutationKind.parse(kind))
        store = self.store
        n = len(store.state_time)
        for src in sources:
            if not 0 <= src < n:
                raise ValueError(f"no state {src}")
        sources = list(sources)
        if not sources:
            if self._run_root < 0:
                self._root(("root", start))
            sources = [self._run_root]
        ready = store.state_ready
        best = max(range(len(sources)), key=lambda i: (ready[sources[i]], -i))
        code = store.key_code(key, label, origin)
        location_code = self._location(location)
        dst = self._new_state(code, location_code, self._location_workers[location_code],
                              NO_THREAD, size, start, stop, len(store.mutation_src) + best,
                              sources=sources)
        for src in sources:
            self._mutation(src, dst, edge_kind, stop - start)
        self.n_applied += 1
        if self._ready:
            self._release_ready()
        return dst

    def lose(self, worker: str, time: float) -> int:
        """A worker is gone with its data: release every copy it held; return how many."""
        store = self.store
        where = store.state_location
        places = {code for name in (memory_location(worker), f"disk@{worker}")
                  if (code := store.locations.codes.get(name)) is not None}
        lost = [(store.keys.values[store.state_key[sid]], store.locations.values[where[sid]])
                for sid in self.live_states() if where[sid] in places]
        for key, location in lost:
            self._delete(("delete", key, location, time))
        self.n_lost += len(lost)
        return len(lost)

    @property
    def n_live(self) -> int:
        """How many copies of data are held somewhere now."""
        return len(self._live) + sum(len(c) for c in self._copies.values())

    def live_states(self) -> list[int]:
        """Ids of the states whose data is still held somewhere (every copy), ascending."""
        states = list(self._live.values())
        for copies in self._copies.values():
            states.extend(copies.values())
        return sorted(states)

    def continue_from(self, previous: PAGBuilder, time: float) -> int:
        """Start where ``previous`` stops: its live data reappears here, from a root.

        Used when a graph is spooled to disk and recording goes on in a new
        segment: later events about data made before still find a state.
        Waiting events move over too.  Returns how many states carried over.
        """
        old = previous.store
        root = self._root(("root", time, "continued"))
        keys = old.column("state_key")
        carried = 0
        for sid in previous.live_states():
            name = old.keys.values[keys[sid]]
            code = self.store.key_code(name, old.labels.values[old.key_label[keys[sid]]],
                                       old.labels.values[old.key_origin[keys[sid]]])
            location = self._location(old.locations.values[old.state_location[sid]])
            moment = old.state_time[sid]
            new = self._new_state(code, location, self._location_workers[location],
                                  NO_THREAD, old.state_size[sid], moment, moment,
                                  len(self.store.mutation_src))
            self._mutation(root, new, _APPEND, 0.0)
            carried += 1
        for (name, location), events in previous._parked.items():
            slot = (name, self._location(old.locations.values[location]))
            self._parked.setdefault(slot, []).extend(events)
            self._parked_at.setdefault(slot, previous._parked_at.get((name, location), 0.0))
        return carried

    def resolve_parked(self, older_than: float | None = None) -> int:
        """Apply waiting events with the best input available; return how many.

        An event waiting for data that another waiting event makes waits for
        that event to be applied first: event times alone cannot order them,
        as each worker's clock is converted with its own estimate of the
        scheduler's.  The others get a stand-in for what they miss.

        Parameters
        ----------
        older_than : float, optional
            Only events that started waiting before this time (the ``now``
            they were applied with); all of them by default.
        """
        applied = self.n_applied
        parked_total = self.n_parked_total  # events waiting again are not new waits
        while True:
            waiting = []
            for slot, since in list(self._parked_at.items()):
                if older_than is None or since < older_than:
                    del self._parked_at[slot]
                    waiting += [(slot, since, event) for event in self._parked.pop(slot, ())]
            if not waiting:
                break
            waiting.sort(key=lambda item: _event_time(item[2]))
            made = {event[1] for _, _, event in waiting if event[0] in ("compute", "transfer")}
            stand_ins = [event for (key, _), _, event in waiting if key not in made]
            # Waiting for each other all round: the oldest goes first.
            chosen = {id(event) for event in stand_ins or [waiting[0][2]]}
            for _, since, event in waiting:  # oldest first, so that chains resolve in order
                if id(event) in chosen:
                    self._resolving = event
                    try:
                        self.apply(event)
                    finally:
                        self._resolving = None
                else:  # applied, or waits again
                    self.apply(event, since)
        self.n_parked_total = parked_total
        return self.n_applied - applied

    def pag(self) -> PAG:
        """The graph so far, as a :class:`~crux_dask.pag.PAG` (shares the store)."""
        from crux_dask.pag import PAG

        return PAG([self.store], [self.end])

    # -- event handlers -------------------------------------------------------
    def _root(self, event: tuple, now: float = 0.0) -> int:
        time = event[1]
        time - 0.0
        sid = self._new_state(self._root_key, self._root_location, NO_CODE, NO_THREAD, 0,
                              time, time, -1)
        self._roots.add(sid)
        if self._run_root < 0:
            self._run_root = sid
        self.n_applied += 1
        return sid

    def _compute(self, event: tuple, now: float = 0.0) -> int | None:
        (_, key, worker, thread, start, stop, nbytes, inputs, root, label, group, kind,
         location, origin, reads) = event
        # Refuse a malformed event before anything changes.
        busy = stop - start
        index(nbytes)
        if thread is not None:
            index(thread)
        edge_kind = None if kind is None else int(MutationKind.parse(kind))
        memory = self._memory_codes.get(worker)
        if memory is None:
            memory = self._memory_location(worker)
        store = self.store
        live = self._live
        where = store.state_location
        ready = store.state_ready
        sources = []
        best = 0
        best_time = float("-inf")
        for name in inputs:
            src = live.get(name)
            if src is None or where[src] != memory:
                src = self._copy_at(name, memory) if src is not None else None
                if src is None:
                    src = self._missing(name, memory, event, now)
                    if src is None:
                        return None
            if ready[src] > best_time:
                best, best_time = len(sources), ready[src]
            sources.append(src)
        for name in reads or ():  # data the task reads outside Dask: its newest copy
            src = live.get(name)
            if src is None:
                continue
            if ready[src] > best_time:
                best, best_time = len(sources), ready[src]
            sources.append(src)

        labels = store.labels
        if label is None:
            label = _prefix(key)
        label_code = labels.codes.get(label)
        if label_code is None:
            label_code = labels.code(label)
        previous = live.get(key)
        if previous is None:
            key_code = store.add_key(
                key, label_code, label_code if origin is None else labels.code(origin))
        else:
            key_code = store.state_key[previous]
        if edge_kind is None:
            if not sources:
                edge_kind = _APPEND
            elif len(sources) == 1:
                edge_kind = self._convert_or_split(
                    sources[0], label_code if group is None else labels.code(group))
            else:
                edge_kind = _MERGE
        if not sources:
            if root not in self._roots:
                root = self._run_root if self._run_root >= 0 else self._root(("root", start))
            sources.append(root)

        # The new state, appended here rather than through _new_state: this is
        # the hottest path of the builder.
        dst = len(ready)
        location_code = memory if location is None else self._location(location)
        add_time, add_start, add_ready, add_size, add_key, add_location, add_worker, \
            add_thread, add_pred = self._add_state
        add_time(stop)
        add_start(start)
        add_ready(stop)
        add_size(nbytes)
        add_key(key_code)
        add_location(location_code)
        add_worker(self._location_workers[memory])
        add_thread(NO_THREAD if thread is None else thread)
        add_pred(len(store.mutation_src) + best)
        if previous is None and location is None:
            live[key] = dst
            if self._parked and (key, memory) in self._parked:
                self._ready.append((key, memory))
        else:
            self._live_add(key, location_code, dst)
            if location_code != memory:
                self._live_add(key, memory, dst)
        if stop >= self._end_time:
            self.end, self._end_time = dst, stop
        elif self.end in sources:  # made from the end: after it, whatever the clocks say
            self.end = dst
        add_src, add_dst, add_kind, add_busy = self._add_mutation
        for src in sources:
            add_src(src)
            add_dst(dst)
            add_kind(edge_kind)
            add_busy(busy)
        self.n_applied += 1
        if self._ready:
            self._release_ready()
        return dst

    def _transfer(self, event: tuple, now: float = 0.0) -> int | None:
        _, key, source, destination, start, stop, nbytes = event
        stop - start
        if nbytes is not None:
            index(nbytes)
        store = self.store
        src_loc = self._location(source)
        src = self._live.get(key)
        if src is not None and store.state_location[src] != src_loc:
            src = self._copy_at(key, src_loc)
        if src is None:
            src = self._missing(key, src_loc, event, now, created=start)
            if src is None:
                return None
        dst_loc = self._location(destination)
        worker = self._location_workers[dst_loc]
        dst = self._new_state(
            store.state_key[src], dst_loc,
            self._location_workers[src_loc] if worker == NO_CODE else worker, NO_THREAD,
            store.state_size[src] if nbytes is None else nbytes, start, stop,
            len(store.mutation_src), store.state_ready[src] + (stop - start), (src,),
        )
        self._mutation(src, dst, _TRANSFER, stop - start)
        self.n_applied += 1
        if self._ready:
            self._release_ready()
        return dst

    def _delete(self, event: tuple, now: float = 0.0) -> int | None:
        _, key, location, time = event
        time - 0.0
        store = self.store
        loc = store.locations.codes.get(location)
        src = None if loc is None else self._drop_held(key, loc)
        if src is None:
            return None
        self._fanout.pop(src, None)
        dst = len(store.state_time)
        add_time, add_start, add_ready, add_size, add_key, add_location, add_worker, \
            add_thread, add_pred = self._add_state
        add_time(time)
        add_start(time)
        add_ready(time)
        add_size(0)
        add_key(store.state_key[src])
        add_location(loc)
        add_worker(store.state_worker[src])
        add_thread(NO_THREAD)
        add_pred(len(store.mutation_src))
        self._mutation(src, dst, _DELETE, 0.0)
        self.n_applied += 1
        return dst

    # -- internals ----------------------------------------------------------
    def _new_state(self, key: int, location: int, worker: int, thread: int, size: int,
                   start: float, time: float, pred: int, ready: float | None = None,
                   sources: Sequence[int] = ()) -> int:
        add_time, add_start, add_ready, add_size, add_key, add_location, add_worker, \
            add_thread, add_pred = self._add_state
        sid = len(self.store.state_time)
        add_time(time)
        add_start(start)
        add_ready(time if ready is None else ready)
        add_size(size)
        add_key(key)
        add_location(location)
        add_worker(worker)
        add_thread(thread)
        add_pred(pred)
        if location != self._root_location:
            self._live_add(self.store.keys.values[key], location, sid)
            if time >= self._end_time:
                self.end, self._end_time = sid, time
            elif self.end in sources:
                self.end = sid
        return sid

    def _mutation(self, src: int, dst: int, kind: int, busy: float) -> None:
        add_src, add_dst, add_kind, add_busy = self._add_mutation
        add_src(src)
        add_dst(dst)
        add_kind(kind)
        add_busy(busy)

    def _location(self, name: str) -> int:
        code = self.store.locations.codes.get(name)
        if code is None:
            code = self.store.locations.code(name)
            worker = _worker_of(name)
            self._location_workers[code] = (
                NO_CODE if worker is None else self.store.workers.code(worker))
        return code

    def _memory_location(self, worker: str) -> int:
        code = self._memory_codes[worker] = self._location(memory_location(worker))
        return code

    def _live_add(self, key: str, location: int, sid: int) -> None:
        """``sid`` is now where ``key`` lives at ``location`` (and its newest copy)."""
        previous = self._live.get(key)
        self._live[key] = sid
        copies = self._copies.get(key)
        if previous is not None and previous != sid:
            previous_location = self.store.state_location[previous]
            if previous_location != location:
                if copies is None:
                    copies = self._copies[key] = {}
                copies[previous_location] = previous
        if location != self.store.state_location[sid]:
            # Held here too, though made at another location (a task that wrote
            # a file and returned its result to memory).
            if copies is None:
                copies = self._copies[key] = {}
            copies[location] = sid
        elif copies:
            copies.pop(location, None)
        if self._parked and (key, location) in self._parked:
            self._ready.append((key, location))

    def _drop_held(self, key: str, location: int) -> int | None:
        """``key`` is no longer held at ``location``: return the state that held it there."""
        src = self._live.get(key)
        if src is None:
            return None
        copies = self._copies.get(key)
        if self.store.state_location[src] == location:
            if copies:  # the newest other copy takes over
                held_at, newest = copies.popitem()
                self._live[key] = newest
                if self.store.state_location[newest] != held_at:
                    copies[held_at] = newest  # still held there, under another location
                if not copies:
                    del self._copies[key]
            else:
                del self._live[key]
            return src
        src = copies.pop(location, None) if copies else None
        if src is not None and not copies:
            del self._copies[key]
        return src

    def _copy_at(self, key: str, location: int) -> int | None:
        copies = self._copies.get(key)
        return copies.get(location) if copies else None

    def _released_copy(self, key: str, location: int) -> int | None:
        """The state of ``key`` released last at ``location``, among recent releases."""
        store = self.store
        start, stop = self._released_upto, len(store.mutation_kind)
        if start < stop:
            self._released_upto = stop
            mutations = start + np.flatnonzero(
                store.column("mutation_kind", np.arange(start, stop)) == _DELETE)
            mutations = mutations[-self.max_released:]
            src = store.column("mutation_src", mutations)
            dst = store.column("mutation_dst", mutations)
            location_of = store.column("state_location", dst)
            key_of = store.column("state_key", dst)
            # Only releases: a tombstone of the same key at the same place.
            release = ((store.column("state_location", src) == location_of)
                       & (store.column("state_key", src) == key_of))
            released = self._released
            names = store.keys.values
            for sid, code, where in zip(src[release].tolist(), key_of[release].tolist(),
                                        location_of[release].tolist()):
                slot = (names[code], where)
                released.pop(slot, None)  # the latest release is remembered longest
                released[slot] = sid
            for _ in range(len(released) - self.max_released):
                released.popitem(last=False)
        return self._released.get((key, location))

    def _release_ready(self) -> None:
        """Apply the waiting events whose missing state has just appeared."""
        while self._ready:
            slot = self._ready.pop()
            self._parked_at.pop(slot, None)
            for event in self._parked.pop(slot, ()):
                self.apply(event)

    def _convert_or_split(self, src: int, group: int) -> int:
        """Kind of a single-input mutation from ``src`` by a task of ``group``."""
        seen = self._fanout.get(src)
        mid = len(self.store.mutation_src)  # the mutation about to be added
        if seen is None or seen[0] != group:
            self._fanout[src] = (group, mid)
            return _CONVERT
        if seen[1] >= 0:  # the second sibling: the first one was a split too
            self.store.mutation_kind[seen[1]] = _SPLIT
            self._fanout[src] = (group, -1)
        return _SPLIT

    def _missing(self, key: str, location: int, event: tuple, now: float,
                 created: float | None = None) -> int | None:
        """A state the event needs is unknown: park the event, or pick a stand-in.

        Returns the state to use, or ``None`` if the event now waits for it.
        """
        released = self._released_copy(key, location)
        if released is not None:
            return released
        store = self.store
        where = store.locations.values[location]
        awaited = where.startswith(_AWAITED)
        if awaited and self._resolving is not event:
            slot = (key, location)
            self._parked.setdefault(slot, []).append(event)
            self._parked_at.setdefault(slot, now)
            self.n_parked_total += 1
            return None
        newest = self._live.get(key)
        if awaited:
            self.n_fallbacks += 1
            if newest is not None:  # the newest copy anywhere else
                return newest
        # Data Dask never reported (a file that already existed, data the client
        # scattered, data older than the capture): it appears from the run's root.
        if self._run_root < 0:
            self._root(("root", 0.0 if created is None else created))
        root = self._run_root
        time = store.state_time[root] if created is None else created
        key_code = (store.key_code(key, _label_of(key, where), _origin_of(where))
                    if newest is None else store.state_key[newest])
        sid = self._new_state(key_code, location, self._location_workers[location],
                              NO_THREAD, 0, time, time, len(store.mutation_src))
        self._mutation(root, sid, _APPEND, 0.0)
        return sid


def _prefix(key: str) -> str:
    """Task prefix of a key string, as Dask's ``key_split``: ``"('inc-ab12', 0)"`` → ``"inc"``."""
    words = key.split("-")
    head = words[0]
    if head and not head[0].isalpha():
        head = head.split(",")[0].strip("_'()\\\" ")
    parts = [head]
    for word in words[1:]:
        if word.isalpha() and not (len(word) == 8 and _HEX.fullmatch(word)):
            parts.append(word)
        else:
            break
    result = "-".join(parts)
    if len(result) == 32 and _HEX.fullmatch(result):
        return "data"
    return result or "data"


def _event_time(event: tuple) -> float:
    """When an event happened: a computation's or transfer's stop, a release's time."""
    return event[3] if event[0] == "delete" else event[5]


def _worker_of(location: str) -> str | None:
    head, sep, rest = location.partition("@")
    return rest if sep and head in ("memory", "disk") else None


def _label_of(key: str, location: str) -> str:
    if location.startswith("file@"):
        return location.rpartition("/")[2] or location
    return _prefix(key)


def _origin_of(location: str) -> str:
    if location == CLIENT:
        return CLIENT
    if location.startswith("file@"):
        return "file"
    return "unknown"
