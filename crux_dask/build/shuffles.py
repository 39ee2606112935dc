"""P2P shuffles: shards split by transfer tasks, sent, and merged after the barrier.

A P2P shuffle has three kinds of tasks.  Each *transfer* task splits its input
partition into one shard per destination worker (a ``shard`` event: a
``SPLIT`` from the task's inputs), and the shuffle sends the shards in the
background (``transfer`` events of the shard keys).  The *barrier* takes the
transfer tasks as inputs (directly, or through tasks Dask put between them)
and finishes once every shard has reached its destination: it is a ``MERGE``
of every shard where it arrived, as well as of its inputs.  Each *output*
task takes the barrier as input and reads the shards its worker received: a
``MERGE`` of those.  The shards are released with the barrier's last copy.

A transfer task is one that made shards, an output one whose input is a
barrier; the barrier is known by its label, the prefix distributed gives
every shuffle's barrier.  Computations of these are applied one by one (the
builder's windows leave them out, see :attr:`Shuffles.keys`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from crux_dask.build import lookups
from crux_dask.events import Shard
from crux_dask.model import BARRIER_LABEL, SHARDS_LABEL, MutationKind, shard_key

if TYPE_CHECKING:
    from crux_dask.build.builder import PAGBuilder

__all__ = ["Shuffles", "shard"]

_SPLIT = int(MutationKind.SPLIT)


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
    keys : set of str
        The keys of all three: a computation with one of them as input is part
        of a shuffle.
    """

    def __init__(self) -> None:
        self.shards: dict[str, dict[str, int]] = {}
        self.carriers: dict[str, list[str]] = {}
        self.barriers: dict[str, list[str]] = {}
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
        self.keys |= other.keys

    def sources(self, builder: PAGBuilder, inputs: tuple[str, ...], key: str, label: str,
                memory: int, event: Any, now: float) -> list[int] | None:
        """The shard states a computation on ``memory`` with ``inputs`` merges.

        The barrier (labelled :data:`~crux_dask.model.BARRIER_LABEL`) merges
        every shard of its transfer tasks where it arrived; an output task the
        shards that arrived at its worker (memory or disk); any other task taking
        transfer tasks carries them to the barrier.  ``None`` if the
        computation now waits for a shard to arrive.
        """
        transfers = [name for name in inputs if name in self.shards]
        for name in inputs:
            transfers += self.carriers.get(name, ())
        if transfers and label != BARRIER_LABEL:
            self.carriers[key] = transfers
            self.keys.add(key)
            return []
        wanted: list[tuple[str, int]] = []
        for name in transfers:
            wanted += self.shards[name].items()
        worker = builder.places.worker
        for name in inputs:
            for transfer in self.barriers.get(name, ()):
                wanted += [(s, dest) for s, dest in self.shards[transfer].items()
                           if worker[dest] == worker[memory]]
        found = []
        for name, dest in wanted:
            src = lookups.held(builder, name, dest, event, now)
            if src is None:
                return None
            found.append(src)
        if transfers:
            self.barriers[key] = transfers
            self.keys.add(key)
        return found

    def release(self, builder: PAGBuilder, barrier: str, time: float) -> None:
        """The barrier's last copy is released: so are its shuffle's shards, at ``time``.

        distributed cleans a shuffle's buffers up once its outputs no longer
        need the barrier; what the builder knew of the shuffle is forgotten.
        """
        transfers = self.barriers.pop(barrier)
        self.keys.discard(barrier)
        locations = builder.store.locations.values
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
        store.state_submitted))
    sid = builder.new_state(code, memory, places.worker[memory], None, e.nbytes, e.start,
                            e.stop, e.stop, sources or [task], _SPLIT, busy, moments)
    shuffles = builder.shuffles
    shuffles.shards.setdefault(e.key, {})[name] = places.code(e.destination)
    shuffles.keys.add(e.key)
    return builder.applied(sid)
