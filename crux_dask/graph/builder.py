"""Turn data-state events into a program activity graph.

The builder holds the graph being built and what it needs to go on; each kind
of event is applied by its handler (:mod:`crux_dask.graph.handlers`, which
states the mapping rules), from the builder's steps: :meth:`PAGBuilder.new_state`
and :meth:`PAGBuilder.applied`.

Events are the records of :mod:`crux_dask.events` (or plain tuples of the same
fields), or the same events in columns (:class:`~crux_dask.columns.EventColumns`,
what the wire format carries).  Runs of routine events in columns are applied a
window at a time by :mod:`crux_dask.graph.window`, with the same result.  An
event whose input is not known yet waits (:mod:`crux_dask.graph.waiting`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from types import MethodType
from typing import TYPE_CHECKING, Any

from crux_dask.columns import EventColumns
from crux_dask.events import Compute, Delete, FileAccess, Root, Transfer, parse
from crux_dask.graph import handlers, operations, rules, shuffles
from crux_dask.graph.feed import Feed, OnError
from crux_dask.graph.holdings import Holdings
from crux_dask.graph.places import Places
from crux_dask.graph.waiting import Waiting
from crux_dask.model import ROOT
from crux_dask.store import NO_THREAD, PAGStore

if TYPE_CHECKING:
    from crux_dask.pag import PAG

__all__ = ["PAGBuilder"]

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
        The root states; ``run_root`` is the first, ``root_key`` their key's code.
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
        self.root_key = store.key_code(ROOT, ROOT, "crux")
        self.places = Places(store)
        self.resolving: Any = None  # the event resolve_parked applies with stand-ins
        # task -> copies of the files it read (a read of a file unknown then: its event)
        self.file_reads: dict[str, list[int | FileAccess]] = {}
        # file location -> the writes of it waiting for their task's report (their ids)
        self.writes_waiting: dict[str, set[int]] = {}
        self.shuffles = shuffles.Shuffles()
        self.feed = Feed(self)
        self._dispatch = self._bound_handlers()

    def _bound_handlers(self) -> dict[str, Callable[[Any, float], int | None]]:
        """The handler of each event's name, bound as a method is: as cheap to call."""
        return {name: MethodType(handler, self) for name, handler in (
            ("compute", handlers.compute), ("transfer", handlers.transfer),
            ("delete", handlers.delete), ("root", handlers.root),
            ("file", handlers.file), ("shard", shuffles.shard))}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        del state["_dispatch"]  # bound to functions of other modules: bound again
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._dispatch = self._bound_handlers()

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
        return handlers.root(self, Root("root", time, label))

    def compute(self, key: str, worker: str, thread: int | None, start: float, stop: float,
                nbytes: int, inputs: Sequence[str] = (), root: int = -1,
                label: str | None = None, group: str | None = None,
                kind: str | None = None, location: str | None = None,
                origin: str | None = None, reads: Sequence[str] | None = None, *,
                sent: float | None = None, received: float | None = None,
                runnable: float | None = None, released_by: str | None = None,
                released_on: str | None = None, priority: float | None = None,
                io: float | None = None, first_requested: float | None = None,
                announced: float | None = None, cpu: float | None = None,
                cpu_wait: float | None = None, now: float = 0.0) -> int | None:
        """A task computed; the fields are those of :class:`~crux_dask.events.Compute`.

        ``kind`` is the event's ``mutation`` field.
        """
        return handlers.compute(self, Compute(
            "compute", key, worker, thread, start, stop, nbytes, tuple(inputs), root, label,
            group, kind, location, origin, tuple(reads) if reads else None, sent, received,
            runnable, released_by, released_on, priority, io, first_requested, announced, cpu,
            cpu_wait), now)

    def transfer(self, key: str, source: str, destination: str, start: float, stop: float,
                 nbytes: int | None = None, *, now: float = 0.0) -> int | None:
        """Data of ``key`` moved from location ``source`` to ``destination``.

        A source Dask does not report (a file written outside the workflow,
        data the client scattered) is created on the fly, appended from the
        run's root.
        """
        return handlers.transfer(self, Transfer("transfer", key, source, destination, start,
                                                stop, nbytes), now)

    def delete(self, key: str, location: str, time: float, now: float = 0.0) -> int | None:
        """Data of ``key`` released at ``location``; returns the tombstone's id."""
        return handlers.delete(self, Delete("delete", key, location, time), now)

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
                             partial(handlers.made_by, self))
        return self.n_applied - applied

    def submitted(self, root: int) -> float:
        """When the graph of root state ``root`` reached the scheduler (NaN: not a root)."""
        return self.store.state_time[root] if root in self.roots else _NAN

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

    # -- the steps events are applied with -------------------------------------------
    def add_state(self, key: int, location: int, worker: int, thread: int, size: int,
                  start: float, time: float, ready: float, pred: int,
                  moments: tuple[float, ...] = rules.NO_MOMENTS) -> int:
        """Append a state's row, every field given (codes, ``pred`` a mutation); its id."""
        store = self.store
        sid = store.n_states
        store.state_requested.append(moments[0])
        store.state_received.append(moments[1])
        store.state_runnable.append(moments[2])
        store.state_priority.append(moments[3])
        store.state_io.append(moments[4])
        store.state_first_requested.append(moments[5])
        store.state_announced.append(moments[6])
        store.state_cpu.append(moments[7])
        store.state_cpu_wait.append(moments[8])
        store.state_submitted.append(moments[9])
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

    def add_mutation(self, src: int, dst: int, kind: int, busy: float) -> None:
        """Append the mutation of ``src`` into ``dst`` by ``kind``, busy for ``busy``."""
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
        sid = self.add_state(key, location, self.places.worker[location] if worker is None
                             else worker, NO_THREAD if thread is None else thread, size,
                             start, time, ready, pred, moments)
        for src in sources:
            self.add_mutation(src, sid, kind, busy)
        if causes:
            time_of = store.state_time
            store.state_cause[sid] = store.n_causes + rules.last_arriving(
                [time_of[src] for src, _ in causes])
            for src, cause in causes:
                store.cause_src.append(src)
                store.cause_dst.append(sid)
                store.cause_kind.append(cause)
        if held and location != self.places.root:
            self.hold(store.keys.values[key], location, sid)
            self.ends.add(sid, time, sources)
        return sid

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

    def hold(self, key: str, location: int, sid: int) -> None:
        """``sid``, a copy of ``key``, is held at ``location``: the events waiting for it go on."""
        self.holdings.add(key, location, sid)
        self.waiting.appeared((key, location))
