"""The graph process: the engine, fed by the scheduler over a pipe, its steps journaled.

Started by :class:`~crux_dask.plugins.graph_process.GraphProcess` as
``python -m crux_dask.plugins.graph_child INBOX OUTBOX``.  It resumes from
the journal of its recording if there is one (a process before it died), and
takes a snapshot to start its own generation; it then applies what the
scheduler sends, tells it which entries are durable (journaled), how far the
graph got (:class:`~crux_dask.plugins.host.Progress`) and which segments it
spooled, and answers questions.
"""

from __future__ import annotations

import contextlib
import gc
import pickle
import sys
import time
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from crux_dask.plugins.engine import Engine, resumed
from crux_dask.plugins.host import Progress
from crux_dask.plugins.journal import Journal
from crux_dask.plugins.staging import Pieces

__all__ = ["main", "serve"]

#: Seconds between two reports of how far the graph got while the process applies: a
#: page asks again when it changed, at most as often as that.
PROGRESS_INTERVAL = 0.05
#: Answers in pieces the process keeps for the scheduler to fetch (:class:`KeptPieces`);
#: the oldest beyond are let go.  The scheduler lets go of what it no longer reads (and
#: keeps at most ``STAGED_MAX`` stagings, of two answers each): this bounds the rest.
KEPT_MAX = 16


def serve(inbox: Connection, outbox: Connection, settings: dict[str, Any]) -> None:
    """Apply what the scheduler sends (``inbox``), send back (``outbox``) what the graph
    grew by, until ``close`` or until the scheduler is gone (the journal stays then)."""
    _warm_up()
    journal = Journal(settings["spool_dir"], settings["run_id"])
    engine = _engine(journal, settings)
    shipper = _Shipper(outbox, engine)
    shipper.resumed()
    # What the process holds by now, its modules' objects, is never garbage: left out
    # of the collector's walks (one full collection of them took 37 ms here).
    gc.freeze()
    idle_wait = settings["apply_interval"]
    closed = False
    try:
        while True:
            busy = engine.busy()
            if inbox.poll(0 if busy else idle_wait):
                raw = inbox.recv_bytes()
                message = pickle.loads(raw)
                if message[0] == "close":
                    closed = True
                    break
                _handle(message, raw, engine, shipper)
                continue
            if busy:
                engine.slice()
                more = engine.busy()
                if not more:
                    engine.resolve()
                shipper.ship(due=more)  # the rest of a burst goes at once
            else:
                engine.resolve()
                shipper.ship()
    except (EOFError, OSError, KeyboardInterrupt):  # the scheduler is gone
        pass
    finally:
        journal.close(remove=closed)
        engine.ingest.spool.close()
    with contextlib.suppress(OSError, ValueError):
        outbox.send(("closed",))


def _warm_up() -> None:
    """Import now what the first events need: Dask's key names, and pandas, which pyarrow
    loads to check the lists of a batch.  Left to the first events, these imports took
    0.3-0.5 s of CPU during the first computation recorded, on the cores its workers
    were using."""
    import distributed.utils  # noqa: F401

    pa.array([0.0])


def _engine(journal: Journal, settings: dict[str, Any]) -> Engine:
    """The engine as the journal left it, or a new one (see
    :func:`~crux_dask.plugins.engine.resumed`); its snapshot starts a generation of the
    journal."""
    engine = resumed(journal, settings)
    engine.journal = journal
    journal.snapshot(engine.state())
    return engine


def _handle(message: tuple, raw: bytes, engine: Engine, shipper: _Shipper) -> None:
    kind = message[0]
    if kind == "entries":
        if engine.take(raw):
            shipper.durable()
    elif kind == "drain":
        while engine.busy():
            engine.slice()
            shipper.ship(due=True)
        engine.resolve(everything=True)
        shipper.ship()
        shipper.answer(message[1], None)
    elif kind == "external":
        _, number, mutation, fields = message
        outcome = engine.external(number, mutation, fields)
        shipper.ship()
        if isinstance(outcome, ValueError):
            shipper.answer(number, None, outcome)
        else:
            shipper.answer(number, outcome)
    elif kind == "piece":
        _, number, kept, index = message
        pieces = shipper.kept.get(kept)
        if pieces is None or not 0 <= index < len(pieces):
            shipper.answer(number, None, KeyError(f"no piece {index} of answer {kept} "
                                                  "(let go, or never made)"))
        else:
            shipper.answer(number, pieces[index])
    elif kind == "release":
        shipper.kept.pop(message[1], None)
    elif kind == "analyse":
        _, number, function, args = message
        builder = engine.ingest.builder
        try:
            value = function(builder.store, builder.end, *args)
        except Exception as error:
            shipper.answer(number, None, error)
        else:
            shipper.answer(number, value)


class _Shipper:
    """Tells the scheduler how far the graph got, which segments were spooled and what is
    durable, answers questions, and keeps the answers in pieces until the scheduler lets
    them go."""

    def __init__(self, connection: Connection, engine: Engine) -> None:
        self.connection = connection
        self.engine = engine
        self.ingest = engine.ingest
        self.store = engine.ingest.builder.store
        self.last = 0.0
        self.summary: tuple = ()
        #: Answers in pieces, by number, until the scheduler lets them go.
        self.kept: OrderedDict[int, Pieces] = OrderedDict()

    def resumed(self) -> None:
        """Tell the scheduler of every segment spooled and every entry durable so far."""
        spool = self.ingest.spool
        for run_id in spool.run_ids:
            self.connection.send(("spooled", run_id, spool.directory, spool.n_states,
                                  spool.n_lost))
        self.durable()

    def durable(self) -> None:
        """Write the journal, and tell the scheduler the entries taken are durable."""
        self.engine.journal.flush()
        self.connection.send(("durable", self.engine.last_seq))

    def ship(self, due: bool = False) -> None:
        """Say what changed: now, or if ``due``, once :data:`PROGRESS_INTERVAL` passed
        since the last time."""
        now = time.monotonic()
        if due and now - self.last < PROGRESS_INTERVAL:
            return
        self.last = now
        ingest = self.ingest
        self.engine.journal.flush()
        if ingest.builder.store is not self.store:  # spooled: the journal starts again
            self.store = ingest.builder.store
            self.engine.journal.snapshot(self.engine.state())
            self.connection.send(("spooled", *ingest.spool.wait_last()))
        progress = Progress.of(ingest.builder)
        summary = (progress, dict(ingest.counts), ingest.pending, ingest.last_error)
        if summary != self.summary:  # nothing new: nothing sent
            self.summary = summary
            self.connection.send(("progress", progress, {
                "counts": summary[1], "pending": ingest.pending,
                "last_error": ingest.last_error, "apply_seconds": ingest.seconds["apply"],
                "cpu_seconds": time.process_time()}))

    def answer(self, number: int, value: Any, error: Exception | None = None) -> None:
        """Send the answer to question ``number``; one in :class:`Pieces` is kept, and
        only its length and head are sent (the pieces are asked for one by one)."""
        try:
            if isinstance(value, Pieces):
                self.connection.send(("kept", number, len(value), value.head))
                self.kept[number] = value
                while len(self.kept) > KEPT_MAX:
                    self.kept.popitem(last=False)
            else:
                self.connection.send(("answer", number, value, error))
        except (pickle.PicklingError, TypeError, AttributeError) as failure:
            self.connection.send(("answer", number, None, RuntimeError(
                f"the graph process could not send its answer: {failure!r}")))


def main(inbox: int, outbox: int) -> None:
    """The graph process: :func:`serve` on the pipes ``inbox`` and ``outbox`` (file
    descriptors), with the settings the scheduler sends first."""
    receiving, sending = Connection(inbox, writable=False), Connection(outbox, readable=False)
    settings = receiving.recv()
    sys.path[:] = settings.pop("sys_path")  # where the functions it is asked to run live
    serve(receiving, sending, settings)


if __name__ == "__main__":  # python -m crux_dask.plugins.graph_child INBOX OUTBOX
    from crux_dask.plugins.graph_child import main as _main  # by its name, as it pickles

    _main(*map(int, sys.argv[1:3]))
