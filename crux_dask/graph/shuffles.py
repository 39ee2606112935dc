"""P2P shuffles: shards split by transfer tasks, sent, and merged after the barrier.

A P2P shuffle has three kinds of tasks.  Each *transfer* task splits its input
partition into one shard per destination worker (a ``shard`` event: a
``SPLIT`` from the task's inputs), and the shuffle sends the shards in the
background (``transfer`` events of the shard keys).  The *barrier* takes the
transfer tasks as inputs (directly, or through tasks Dask put between them)
and finishes once every shard has reached its destination: it is a ``MERGE``
of every shard where it arrived, as well as of its inputs.  Each *output*
task takes the barrier as input and reads the shards its worker received:
those are merged once per worker, when its first output runs, into a state
of their own (what the worker received, :func:`~crux_dask.model.received_key`),
which every output on that worker merges, so that a shuffle of ``n`` partitions
makes a number of mutations that grows as ``n``, not ``n`` squared.  The shards
and what each worker received are released with the barrier's last copy.

A transfer task is one that made shards, an output one whose input is a
barrier; the barrier is known by its label, the prefix distributed gives
every shuffle's barrier.  Computations of these are applied one by one (the
builder's windows leave them out, see :attr:`Shuffles.keys`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from crux_dask.events import Shard
from crux_dask.graph import lookups
from crux_dask.model import (
    BARRIER_LABEL,
    RECEIVED_LABEL,
    SHARDS_LABEL,
    MutationKind,
    received_key,
    shard_key,
)

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder

__all__ = ["Shuffles", "shard"]

_SPLIT = int(MutationKind.SPLIT)
_MERGE = int(MutationKind.MERGE)


class Shuffles:
    """What the builder knows of the P2P shuffles applied so far.

    Attributes
    ----------
    shards : dict
        Transfer task key -> ``{shard key: destination location code}``.
    carriers : dict
        Key of a task that took transfer tasks as inputs without being the
        barrier (an alias Dask put between them) -> those transfer task keys.
    barriers : dict
        Barrier task key -> the transfer task keys it took.
    received : dict
        Barrier task key -> the memory location codes where what a worker
        received of its shuffle was merged.
    keys : set of str
        The keys of all three: a computation with one of them as input is part
        of a shuffle.
    """

    def __init__(self) -> None:
        self.shards: dict[str, dict[str, int]] = {}
        self.carriers: dict[str, list[str]] = {}
        self.barriers: dict[str, list[str]] = {}
        self.received: dict[str, set[int]] = {}
        self.keys: set[str] = set()

    def adopt(self, other: Shuffles, location_of: Callable[[int], int]) -> None:
        """Take over ``other``'s shuffles, its location codes mapped by ``location_of``.

        A graph spooled to disk goes on in a new segment: a shuffle whose
        shards were split before is merged after.
        """
        self.shards.update((task, {name: location_of(where) for name, where in made.items()})
                           for task, made in other.shards.items())
        self.carriers.update((key, list(tasks)) for key, tasks in other.carriers.items())
        self.barriers.update((key, list(tasks)) for key, tasks in other.barriers.items())
        self.received.update((key, {location_of(where) for where in places})
                             for key, places in other.received.items())
        self.keys |= other.keys

    def sources(self, builder: PAGBuilder, inputs: tuple[str, ...], key: str, label: str,
                memory: int, event: Any, now: float) -> list[int] | None:
        """The shard states a computation on ``memory`` with ``inputs`` merges.

        The barrier (labelled :data:`~crux_dask.model.BARRIER_LABEL`) merges
        every shard of its transfer tasks where it arrived; an output task what
        its worker received (:meth:`_received`); any other task taking transfer
        tasks carries them to the barrier.  ``None`` if the computation now
        waits for a shard to arrive.
        """
        transfers = [name for name in inputs if name in self.shards]
        for name in inputs:
            transfers += self.carriers.get(name, ())
        if transfers and label != BARRIER_LABEL:
            self.carriers[key] = transfers
            self.keys.add(key)
            return []
        if transfers:
            found = self._arrived(builder, [(name, dest) for transfer in transfers
                                            for name, dest in self.shards[transfer].items()],
                                  event, now)
            if found is not None:
                self.barriers[key] = transfers
                self.keys.add(key)
            return found
        found = []
        for name in inputs:
            if name in self.barriers:
                received = self._received(builder, name, memory, event, now)
                if received is None:
                    return None
                found += received
        return found

    def _received(self, builder: PAGBuilder, barrier: str, memory: int, event: Any,
                  now: float) -> list[int] | None:
        """What the worker of ``memory`` received of ``barrier``'s shuffle, as a list of
        one state (none if no shard came there): the ``MERGE`` of the shards that
        arrived there (memory or disk), made when its last one arrived (and ready
        when the last of them was), the first time an output asks.  ``None`` if a
        shard has not arrived yet."""
        locations = builder.store.locations.values
        name = received_key(barrier, locations[memory])
        held = builder.holdings.at(name, memory)
        if held is not None:
            return [held]
        worker = builder.places.worker
        shards = self._arrived(builder, [
            (shard, dest) for transfer in self.barriers[barrier]
            for shard, dest in self.shards[transfer].items() if worker[dest] == worker[memory]],
            event, now)
        if not shards:  # one is on its way (None), or none came here
            return shards
        store = builder.store
        time = max(store.state_time[s] for s in shards)
        ready = max(store.state_ready[s] for s in shards)  # ranked as its shards were
        size = sum(store.state_size[s] for s in shards)
        code = store.key_code(name, RECEIVED_LABEL, BARRIER_LABEL)
        sid = builder.new_state(code, memory, None, None, size, time, time, ready, shards,
                                _MERGE, 0.0)
        self.received.setdefault(barrier, set()).add(memory)
        return [sid]  # not an event: nothing is counted as applied

    @staticmethod
    def _arrived(builder: PAGBuilder, wanted: list[tuple[str, int]], event: Any,
                 now: float) -> list[int] | None:
        """The states of the shards ``wanted`` (name, location); ``None`` if the event
        now waits for one of them to arrive."""
        found = []
        for name, dest in wanted:
            src = lookups.held(builder, name, dest, event, now)
            if src is None:
                return None
            found.append(src)
        return found

    def release(self, builder: PAGBuilder, barrier: str, time: float) -> None:
        """The barrier's last copy is released: so are its shuffle's shards, at ``time``.

        distributed cleans a shuffle's buffers up once its outputs no longer
        need the barrier; what the builder knew of the shuffle is forgotten.
        """
        transfers = self.barriers.pop(barrier)
        self.keys.discard(barrier)
        locations = builder.store.locations.values
        for memory in self.received.pop(barrier, ()):
            name = received_key(barrier, locations[memory])
            if builder.holdings.at(name, memory) is not None:
                builder.delete(name, locations[memory], time)
        for transfer in transfers:
            for name, dest in self.shards.pop(transfer, {}).items():
                if builder.holdings.at(name, dest) is not None:
                    builder.delete(name, locations[dest], time)
            self.keys.discard(transfer)
        gone = set(transfers)
        for carrier in [k for k, taken in self.carriers.items() if gone.issuperset(taken)]:
            del self.carriers[carrier]
            self.keys.discard(carrier)


def shard(builder: PAGBuilder, event: Any, now: float) -> int | None:
    """A transfer task split its data for one destination: the shard's state, or ``None``.

    The shard is a ``SPLIT`` of the task's inputs in its worker's memory,
    labelled ``p2p-shards`` and made by the task's prefix, with the task's
    moments (the split is the task's run).  It waits for the task's own
    computation to be applied.
    """
    e = event if type(event) is Shard else Shard(*event)
    busy = e.stop - e.start
    if e.nbytes < 0 or not (isinstance(e.destination, str)
                            and e.destination.startswith(lookups.AWAITED)):
        raise ValueError(f"not a shard: {event!r:.120}")
    store, holdings, places = builder.store, builder.holdings, builder.places
    memory = places.memory_of(e.worker)
    task = lookups.held(builder, e.key, memory, event, now)
    if task is None:
        return None
    sources = []
    for name in e.inputs:
        src = holdings.at(name, memory)
        if src is None:
            src = holdings.released_at(name, memory)
        if src is not None:
            sources.append(src)
    name = shard_key(e.key, e.destination)
    prefix = store.labels.values[store.key_label[store.state_key[task]]]
    code = store.key_code(name, SHARDS_LABEL, prefix)
    moments = tuple(column[task] for column in (
        store.state_requested, store.state_received, store.state_runnable,
        store.state_priority, store.state_io, store.state_first_requested,
        store.state_announced, store.state_cpu, store.state_cpu_wait, store.state_submitted))
    sid = builder.new_state(code, memory, places.worker[memory], None, e.nbytes, e.start,
                            e.stop, e.stop, sources or [task], _SPLIT, busy, moments)
    shuffles = builder.shuffles
    shuffles.shards.setdefault(e.key, {})[name] = places.code(e.destination)
    shuffles.keys.add(e.key)
    return builder.applied(sid)
