"""The graph built in a process of its own, fed by the scheduler.

Turning events into states costs the scheduler's process 5-10 microseconds an
event, several per cent of its CPU on graphs of small tasks.  Here the hooks
and the workers' RPC handler record as they would for an ingest in the
scheduler (the same queue entries, see :mod:`crux_dask.plugins.ingest`), and
every ``crux-dask.apply-interval`` a thread of the plugin sends what was
recorded, pickled and numbered, to the graph process
(:mod:`crux_dask.plugins.graph_child`).  The scheduler reads only the head of
a worker's batch (so that a worker learns at once that one was refused) and
forwards the batch as it came.

The scheduler keeps what it sent until the process says it is durable (in
its journal, :mod:`crux_dask.plugins.journal`).  If the process dies, a new
one resumes from the journal, the scheduler sends again what was not durable
and asks again what was not answered: nothing recorded is lost.  A process
that died :data:`RESTARTS` times is not started again: the scheduler reads its
journal back, and answers on that graph (in a thread); events recorded
afterwards are counted as dropped.

The scheduler keeps no copy of the graph: the process tells it how far the
graph got (:class:`~crux_dask.plugins.host.Progress`), and everything else is
asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from crux_dask.codec import read_head
from crux_dask.plugins.entries import Graph, Reported
from crux_dask.plugins.frames import Frames
from crux_dask.plugins.graph_pipe import READ_BYTES, GraphProcessGone, Pipes, ended
from crux_dask.plugins.host import (
    Progress,
    ask_in_thread,
    graph_pieces,
    pieces_in_thread,
    spooled_graph_pieces,
    spooled_in_thread,
)
from crux_dask.plugins.recorder import Recorder
from crux_dask.plugins.staging import KeptPieces, Pieces

if TYPE_CHECKING:
    from crux_dask.plugins.spool import Spool

logger = logging.getLogger(__name__)

__all__ = ["GraphProcess", "GraphProcessGone"]

#: The most queue entries, and bytes of the workers' batches, per message to the
#: process: pickling one holds the scheduler's interpreter for about a microsecond
#: an entry, and copies the batches.
MESSAGE_ENTRIES = 2048
MESSAGE_BYTES = 2**22
#: What an entry other than a batch counts for against ``MESSAGE_BYTES``.
_ENTRY_BYTES = 1_000
#: What the process does not know and the scheduler does count.
_SCHEDULER_COUNTS = ("batches_received", "batches_in_columns", "batches_rejected",
                     "batches_repeated", "events_from_workers", "hook_errors", "events_dropped",
                     "file_lists_received", "file_lists_rejected", "tasks_reported")
#: The counts the process keeps, reported with what it sends.
_PROCESS_COUNTS = ("events_applied", "events_failed", "batches_failed", "file_lists_missing",
                   "file_lists_unmatched", "tasks_unreported")


class GraphProcess(Pipes, Recorder):
    """The scheduler's side: records like an ingest, applies in another process.

    Parameters
    ----------
    spool : Spool
        Where the scheduler reads spooled segments from (the process writes them).
    settings : dict
        What the process's ingest and spool are made with: ``max_pending``,
        ``park_timeout``, ``max_states``, ``spool_dir``, ``apply_interval``.

    Attributes
    ----------
    queue : collections.deque
        What the hooks recorded and batches received since the last send.
    pending : int
        Events in :attr:`queue`.
    counts, seconds : dict
        As :class:`~crux_dask.plugins.ingest.Ingest`'s, the scheduler's and the
        process's together.  The scheduler's CPU seconds in the writer thread,
        pickling what is sent (``send``), and on the event loop reading what the
        process sends back (``read``) are counted too.
    restarts : int
        How often the process died and a new one resumed its journal.
    """

    def __init__(self, spool: Spool, settings: dict[str, Any]) -> None:
        self.spool = spool
        self.settings = {**settings, "run_id": uuid.uuid4().hex}
        super().__init__(settings["max_pending"],
                         (*_SCHEDULER_COUNTS, *_PROCESS_COUNTS))
        self.sent = 0
        self.seconds.update(send=0.0, read=0.0)
        self._progress = Progress(self.settings["run_id"])
        self._recovered: asyncio.Future | None = None  # the journal read back, once gone
        self.remote: dict[str, Any] = {"pending": 0, "cpu_seconds": 0.0, "pid": None}
        self.alive = True
        self._requests = itertools.count()
        self._answers: dict[int, asyncio.Future] = {}
        self._outgoing: deque = deque()
        self._wake = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process: Any = None
        self.restarts = 0
        self._closing = False
        # Entries sent and not durable yet, by number; the questions not answered yet.
        self._seq = itertools.count()
        self._unacked: deque[tuple[int, tuple]] = deque()
        self._asked: dict[int, tuple] = {}
        self._generation = 0  # of the process, and of the writer thread that feeds it
        self._inbox: Connection | None = None  # what the process sends, read on the loop
        # What the loop reads the pipe into: a read, and a message of the process not
        # complete yet (at most a piece).
        self._frames = Frames(2 * READ_BYTES)
        self._paused = False  # not reading the pipe: messages read already wait
        self._started = False  # the writer, which starts the process
        self._heard = False  # whether the process sent anything: it is up
        self._queued_bytes = 0  # of the workers' batches in the queue

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        """Be ready to start the process, which starts with the first thing to send
        beyond roots, or with the first question (from the writer thread: starting the
        process takes a while)."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()

    async def close(self, timeout: float = 5.0) -> None:
        """Stop the process and the threads, waiting at most ``timeout`` seconds for
        the process to finish what it was doing (it is killed after that); one still
        starting is told to stop, and not waited for."""
        self._closing = True
        if not self._started:
            self.alive = False  # never to start
            return
        self._post(("close",))
        process = self._process
        if process is not None and not self._heard:
            # Still starting (importing this package): it reads "close" once started, with
            # nothing applied to finish, and is reaped in the background.
            threading.Thread(target=ended, args=(process, timeout), name="crux-graph-reaper",
                             daemon=True).start()
        elif process is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), timeout)
            # It said it closed, or it is stuck: a second at most.
            await self._loop.run_in_executor(None, ended, process, 1.0)
        self._stop_listening()
        self.alive = False  # asks nothing more of it
        self._fail_answers("Crux's graph process is closed")

    # -- recording: the scheduler's hooks and handler --------------------------
    @property
    def received(self) -> int:
        """Entries recorded since the start (sent or in :attr:`queue`)."""
        return self.sent + self.pending

    def root(self, time: float, label: str) -> int:
        """Queue a graph that reached the scheduler; the number its tasks name it by."""
        number = self.next_graph()
        self.record(Graph(number, time, label))
        return number

    def queue_batch(self, batch: bytes) -> tuple[int, bool]:
        """Queue a worker's batch as received, of which only the head is read here
        (:func:`~crux_dask.codec.read_head`): the process decodes it."""
        head = read_head(batch)
        self.queue.append(bytes(batch))
        self._queued_bytes += len(batch)
        return head.events, head.version != 1

    def queue_reports(self, source: Any, tasks: bytes, count: int) -> None:
        """Queue the tasks a worker reported, as received: the process reads them."""
        super().queue_reports(source, tasks, count)
        self._queued_bytes += len(tasks)

    def apply_soon(self) -> None:
        """Send what was recorded now."""
        self.tick()

    def tick(self) -> None:
        """The periodic callback: send what was recorded since the last call."""
        if not self.queue or (not self._started
                              and all(type(entry) is Graph for entry in self.queue)):
            return  # nothing, or only roots: no process for them yet
        entries, self.queue = list(self.queue), deque()
        batch_bytes, self._queued_bytes = self._queued_bytes, 0
        self.sent += self.pending
        if self.alive and batch_bytes + _ENTRY_BYTES * MESSAGE_ENTRIES < MESSAGE_BYTES:
            for start in range(0, len(entries), MESSAGE_ENTRIES):  # no piece reaches the bytes
                self._send(entries[start:start + MESSAGE_ENTRIES])
        elif self.alive:  # in pieces: the writer holds the interpreter while it pickles one
            piece: list = []
            size = 0
            for entry in entries:
                piece.append(entry)
                size += (len(entry) if isinstance(entry, bytes) else len(entry.reports)
                         if type(entry) is Reported else _ENTRY_BYTES)
                if len(piece) == MESSAGE_ENTRIES or size >= MESSAGE_BYTES:
                    self._send(piece)
                    piece, size = [], 0
            if piece:
                self._send(piece)
        else:
            self.counts["events_dropped"] += self.pending
        self.pending = 0

    def _send(self, entries: list) -> None:
        """Send ``entries``, numbered, and keep them until the process says they are durable."""
        message = ("entries", next(self._seq), entries)
        self._unacked.append((message[1], message))
        self._post(message)

    @property
    def messages_unreadable(self) -> int:
        """Messages of the process that could not be unpickled (skipped, see :class:`Frames`)."""
        return self._frames.undecodable

    # -- asking the process ---------------------------------------------------------
    async def drain(self) -> None:
        """Wait until every entry recorded before the call is applied and sent back,
        and every waiting event is resolved (at once if the process is gone)."""
        self.tick()
        if self.alive:
            with contextlib.suppress(RuntimeError):  # gone since: what it sent is all there is
                await self._ask("drain")

    async def external(self, kind: str, **fields: Any) -> int:
        """Apply one mutation reported from outside Dask; the new state's id, once
        it is applied.

        Raises
        ------
        ValueError
            If a source state does not exist or the kind is unknown.
        """
        self.tick()  # the roots recorded go first
        return await self._ask("external", kind, fields)

    async def ask(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(store, end, *args)`` on the graph applied so far, in the process
        (in a thread, on its journal read back, once it is gone for good).

        ``function`` and ``args`` travel pickled (a function by name); what it
        returns comes back, and what it raises is raised here.  An answer in
        :class:`~crux_dask.plugins.staging.Pieces` stays in the process and comes
        back as :class:`~crux_dask.plugins.staging.KeptPieces`, fetched a piece at
        a time.  The process applies no event meanwhile.
        """
        if self.alive:
            with contextlib.suppress(GraphProcessGone):
                return await self._ask("analyse", function, args)
        return await ask_in_thread(await self._read_back(), function, args)

    async def pieces(self) -> Pieces | KeptPieces:
        """The graph cut into pieces, in the process (kept there, see
        :class:`~crux_dask.plugins.staging.KeptPieces`) while it lives."""
        if self.alive:
            with contextlib.suppress(GraphProcessGone):
                return await self._ask("analyse", graph_pieces, ())
        return await pieces_in_thread(await self._read_back())

    async def spooled_pieces(self) -> Pieces | KeptPieces:
        """The spooled segments cut into pieces, read back in the process while it lives."""
        run_ids = self.spool.run_ids
        if self.alive and run_ids:
            with contextlib.suppress(GraphProcessGone):
                return await self._ask("analyse", spooled_graph_pieces,
                                       (self.spool.directory, run_ids))
        return await spooled_in_thread(self.spool)

    def _read_back(self) -> asyncio.Future:
        """The builder of the process that is gone for good, read back from its journal
        in a thread, once (:func:`~crux_dask.plugins.engine.read_back`), with what it
        was sent and did not make durable."""
        if self._recovered is None:
            from crux_dask.plugins.engine import read_back

            messages = [message for _, message in self._unacked]
            self._recovered = asyncio.ensure_future(asyncio.get_running_loop().run_in_executor(
                None, lambda: read_back(self.settings, messages).ingest.builder))
        return self._recovered

    def progress(self) -> Progress:
        """How far the graph got, as the process last said, or as read back once it is
        gone for good."""
        if self._recovered is not None and self._recovered.done() and (
                not self._recovered.exception()):
            return Progress.of(self._recovered.result())
        return self._progress

    @property
    def apart(self) -> bool:
        """Whether the process lives: answers are computed there."""
        return self.alive

    def sizes(self) -> dict[str, Any]:
        """What is pending here and there, and the process's own figures."""
        return {"events_pending": self.pending + self.remote["pending"],
                "graph_process": {"pid": self.remote["pid"], "alive": self.alive,
                                  "restarts": self.restarts,
                                  "cpu_seconds": self.remote["cpu_seconds"],
                                  "seconds_sending": self.seconds["send"],
                                  "seconds_reading": self.seconds["read"],
                                  "messages_unreadable": self.messages_unreadable}}

    def _on_message(self, message: tuple) -> None:
        kind = message[0]
        if kind == "progress":
            _, progress, summary = message
            self._progress = progress
            for name in _PROCESS_COUNTS:
                self.counts[name] = summary["counts"][name]
            self.seconds["apply"] = summary["apply_seconds"]
            self.remote.update(pending=summary["pending"], cpu_seconds=summary["cpu_seconds"])
            if summary["last_error"] is not None:
                self.last_error = summary["last_error"]
        elif kind == "durable":
            unacked = self._unacked
            while unacked and unacked[0][0] <= message[1]:
                unacked.popleft()
        elif kind == "spooled":
            self.spool.written(*message[1:])
        elif kind == "closed":
            self._stop_listening()
        elif kind == "kept":  # an answer in pieces, which the process keeps
            _, number, count, head = message
            future = self._answers.pop(number, None)
            self._asked.pop(number, None)
            if future is None or future.done():  # the asker went away
                self._let_go(number)
            else:
                future.set_result(KeptPieces(functools.partial(self._piece, self._generation,
                                                               number),
                                             functools.partial(self._let_go, number),
                                             count, head))
        elif kind == "answer":
            _, number, value, error = message
            future = self._answers.pop(number, None)
            self._asked.pop(number, None)
            if future is not None and not future.done():
                if error is None:
                    future.set_result(value)
                else:
                    future.set_exception(error)
