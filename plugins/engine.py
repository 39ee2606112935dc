"""The engine of the graph process: the ingest, stepped, each step journaled.

What the scheduler sends is taken, applied a slice at a time, and waiting
events are resolved; each of these steps reads the clocks only through the
engine (:class:`~crux_dask.plugins.journal.Clocks`) and is written to the
:class:`~crux_dask.plugins.journal.Journal`, so that :meth:`Engine.replay`
makes the same graph again: in a graph process that resumes, or in
:func:`recover`, from what a scheduler that is gone left on disk.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crux_dask.plugins.ingest import Ingest
from crux_dask.plugins.journal import Clocks, Journal, latest, read

#: Events the graph process applies between two looks at what the scheduler sent.
PROCESS_SLICE = 2048

if TYPE_CHECKING:
    from crux_dask.pag import PAG

__all__ = ["Engine", "read_back", "recover", "resumed"]

#: External mutations whose outcome is kept, by the number of the question that asked
#: for them: asked again of a process that resumes, each is applied once.
EXTERNALS_KEPT = 1024


class Engine:
    """The steps of the graph process, on ``ingest``.

    Parameters
    ----------
    ingest : Ingest
    journal : Journal, optional
        Where each step is written; ``None``: nowhere (steps done again).
    last_seq : int
        The number of the last entries taken (those numbered up to it again are
        skipped: the scheduler sends again what it was not told is durable).
    externals : OrderedDict, optional
        The outcome of the latest external mutations, by question number.
    """

    def __init__(self, ingest: Ingest, journal: Journal | None = None, last_seq: int = -1,
                 externals: OrderedDict[int, Any] | None = None) -> None:
        self.ingest = ingest
        self.journal = journal
        self.last_seq = last_seq
        self.externals: OrderedDict[int, Any] = externals or OrderedDict()
        self.clocks = Clocks()
        ingest.clock, ingest.wall = self.clocks.monotonic, self.clocks.wall

    @classmethod
    def from_state(cls, state: dict[str, Any], journal: Journal | None = None) -> Engine:
        """The engine a snapshot (:meth:`state`) was taken of."""
        return cls(state["ingest"], journal, state["last_seq"], state["externals"])

    def state(self) -> dict[str, Any]:
        """What a snapshot keeps; the spool's writes are waited for first."""
        self.ingest.spool.wait()
        return {"ingest": self.ingest, "last_seq": self.last_seq, "externals": self.externals}

    # -- steps ----------------------------------------------------------------------
    def take(self, message: bytes) -> bool:
        """Take ``("entries", seq, entries)``, pickled; whether it was new."""
        _, seq, entries = pickle.loads(message)
        if seq <= self.last_seq:
            return False
        self.ingest.take(entries)
        self.last_seq = seq
        self._journal("take", message)
        return True

    def slice(self) -> None:
        """Apply a slice of what was taken."""
        self.ingest.apply_slice()
        self._journal("slice")

    def resolve(self, everything: bool = False) -> None:
        """Give a stand-in to events that waited longer than the park timeout (or all)."""
        ingest = self.ingest
        ingest.resolve(None if everything else ingest.clock() - ingest.park_timeout)
        self._journal("resolve", pickle.dumps(everything))

    def external(self, number: int, kind: str, fields: dict[str, Any]) -> Any:
        """Apply the external mutation question ``number`` asked for, once: the new
        state's id, or the ``ValueError`` that it cannot be made."""
        if number in self.externals:
            return self.externals[number]
        try:
            outcome: Any = self.ingest.add_external(kind, **fields)
        except (ValueError, TypeError) as error:
            outcome = ValueError(str(error))
        self.externals[number] = outcome
        while len(self.externals) > EXTERNALS_KEPT:
            self.externals.popitem(last=False)
        self._journal("external", pickle.dumps((number, kind, fields)))
        return outcome

    def busy(self) -> bool:
        """Whether anything taken is still to be applied."""
        return bool(self.ingest.queue or self.ingest.backlog)

    def replay(self, steps: Iterable[tuple[str, bytes, list[float]]]) -> int:
        """Do ``steps`` again, with the clock readings they made; how many."""
        done = 0
        for step, payload, clocks in steps:
            self.clocks.play(clocks)
            try:
                if step == "take":
                    self.take(payload)
                elif step == "slice":
                    self.slice()
                elif step == "resolve":
                    self.resolve(pickle.loads(payload))
                elif step == "external":
                    self.external(*pickle.loads(payload))
                else:
                    raise ValueError(f"unknown step {step!r}")
            finally:
                self.clocks.play(None)
            done += 1
        return done

    def _journal(self, step: str, payload: bytes = b"") -> None:
        clocks = self.clocks.take()
        if self.journal is not None:
            self.journal.add(step, payload, clocks)


def resumed(journal: Journal, settings: dict[str, Any]) -> Engine:
    """The engine as ``journal`` left it (every step done again), or a new one made with
    ``settings`` (``max_states``, ``spool_dir``, ``run_id``, ``max_pending``,
    ``park_timeout``); it journals nothing yet."""
    loaded = journal.load()
    if loaded is not None:
        state, steps = loaded
        engine = Engine.from_state(state)
        engine.replay(steps)
        return engine
    from crux_dask.graph.builder import PAGBuilder
    from crux_dask.plugins.spool import Spool

    spool = Spool(settings["max_states"], settings["spool_dir"])
    return Engine(Ingest(PAGBuilder(run_id=settings["run_id"]), spool,
                         max_pending=settings["max_pending"],
                         park_timeout=settings["park_timeout"], slice_events=PROCESS_SLICE,
                         slice_seconds=None))


def read_back(settings: dict[str, Any], messages: Iterable[tuple]) -> Engine:
    """The engine of a graph process that is gone, from its journal, with ``messages``
    (``("entries", seq, entries)`` it was sent and did not make durable) taken, every
    entry applied, and waiting events resolved as a drain would."""
    engine = resumed(Journal(settings["spool_dir"], settings["run_id"]), settings)
    for message in messages:
        engine.take(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
    _finish(engine)
    return engine


def _finish(engine: Engine) -> None:
    while engine.busy():  # entries taken, not applied yet
        engine.slice()
    engine.resolve(everything=True)  # as a drain would, before the graph is read


def recover(path: str) -> PAG:
    """The graph a journal holds (``<spool dir>/journal/<run id>``, of a scheduler that
    is gone): its spooled segments and the one it was recording, with every entry
    journaled applied, and waiting events resolved as a drain would."""
    from crux_dask.pag import PAG  # pandas: only here, not in every graph process
    from crux_dask.provenance import read_dataset

    state, steps = read(Path(path), latest(Path(path)))
    engine = Engine.from_state(state)
    engine.replay(steps)
    _finish(engine)
    builder, spool = engine.ingest.builder, engine.ingest.spool
    spool.wait()
    spooled = [read_dataset(spool.directory, run_id) for run_id in spool.run_ids]
    return PAG([*(store for pag in spooled for store in pag.stores), builder.store],
               [*(end for pag in spooled for end in pag.ends), builder.end])
