"""The graph built in a process of its own, fed by the scheduler.

Turning events into states costs the scheduler's process 5-10 microseconds an
event, several per cent of its CPU on graphs of small tasks.  Here the hooks
and the workers' RPC handler record as they would for an ingest in the
scheduler (the same queue entries, see :mod:`crux_dask.plugins.ingest`), and
every ``crux-dask.apply-interval`` a thread of the plugin sends what was
recorded, pickled, to a process that applies it with an ingest of its own.
The scheduler reads only the head of a worker's batch (so that a worker learns
at once that one was refused) and forwards the batch as it came.

The process sends back the rows it added to the graph's columns and string
tables.  :class:`GraphMirror` keeps them, and appends them to a store of its
own when something on the scheduler reads it (the JSON API, or anything once
the process is gone) as it would read the builder's store: the event loop
spends on the graph only those appends, and none while nobody reads.  A
spooled segment is announced once it is written.  Paths and the table of
computations are computed in the process, on its graph
(:meth:`GraphProcess.analyse`).

If the process dies, what it sent stays readable; events recorded afterwards
are counted as dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import logging
import math
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
import uuid
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None

from crux_dask.codec import read_head
from crux_dask.growable import ChunkedColumn, StringTable
from crux_dask.plugins.host import (
    ask_in_thread,
    graph_pieces,
    pieces_in_thread,
    spooled_graph_pieces,
    spooled_in_thread,
)
from crux_dask.plugins.ingest import GRAPH, REPORTS, Recorder
from crux_dask.plugins.staging import KeptPieces, Pieces
from crux_dask.store import PAGStore

if TYPE_CHECKING:
    from crux_dask.plugins.spool import Spool

logger = logging.getLogger(__name__)

__all__ = ["Frames", "GraphMirror", "GraphProcess", "GraphProcessGone", "serve"]

#: Seconds between two sends of the rows the process added while it applies, and
#: the most states per send: the scheduler's event loop reads a send at once, and
#: appends it in one piece when something reads the graph (2.5 ms for 2,048 states
#: and their mutations in a busy scheduler here, the page faults of its columns'
#: fresh chunks included).
SHIP_INTERVAL = 0.05
SHIP_STATES = 2048
#: The most queue entries, and bytes of the workers' batches, per message to the
#: process: pickling one holds the scheduler's interpreter for about a microsecond
#: an entry, and copies the batches.
MESSAGE_ENTRIES = 2048
MESSAGE_BYTES = 2**22
#: What an entry other than a batch counts for against ``MESSAGE_BYTES``.
_ENTRY_BYTES = 1_000
#: The longest the scheduler's event loop appends what the process sent at a stretch,
#: in seconds, for a reader that waits (:meth:`GraphMirror.caught_up`).
APPEND_TURN = 0.005
#: The most bytes of rows a reader that cannot wait appends at once (a few
#: milliseconds' worth): past it, it reads the graph as it was (:meth:`GraphMirror.behind`).
APPEND_AT_ONCE = 1 << 20
#: The most bytes of what the process sends that the event loop reads, and takes
#: messages of, in one turn (a message takes the turn alone if it is larger).
READ_BYTES = 1 << 19
#: Events the process applies between two looks at what the scheduler sent.
PROCESS_SLICE = 2048
#: What the process does not know and the scheduler does count.
_SCHEDULER_COUNTS = ("batches_received", "batches_in_columns", "batches_rejected",
                     "events_from_workers", "hook_errors", "events_dropped",
                     "file_lists_received", "file_lists_rejected", "tasks_reported")
#: The messages that ask the process something: ``(kind, number, ...)``, answered by number.
_QUESTIONS = frozenset({"drain", "external", "analyse", "piece"})
#: Answers in pieces the process keeps for the scheduler to fetch (:class:`KeptPieces`);
#: the oldest beyond are let go.  The scheduler lets go of what it no longer reads (and
#: keeps at most ``STAGED_MAX`` stagings, of two answers each): this bounds the rest.
KEPT_MAX = 16
#: The counts the process keeps, reported with what it sends.
_PROCESS_COUNTS = ("events_applied", "events_failed", "batches_failed", "file_lists_missing",
                   "file_lists_unmatched", "tasks_unreported")


class GraphProcessGone(RuntimeError):
    """The graph process is gone, or closed: it answers nothing any more."""


class GraphMirror:
    """The graph as the process last sent it: what readers of the builder read.

    The rows the process sends are kept as they came, pickled, and appended
    to :attr:`store` only when something reads it: appending costs the
    scheduler's event loop a few microseconds a state (unpickling each string
    and looking it up), and on a cluster nobody questions through the
    scheduler nothing does.  A reader on the event loop awaits
    :meth:`caught_up`, which appends :data:`APPEND_TURN` seconds at a time;
    reading :attr:`store` appends whatever is left at once.  Rows of a
    segment spooled since are never appended: it is read back from the spool.

    Parameters
    ----------
    run_id : str
        The segment being recorded.
    seconds : dict
        Where appending is timed: CPU seconds added to ``read``, and the longest
        stretch of the event loop it took in ``longest_slice``.

    Attributes
    ----------
    end : int
        The graph's end state (``-1`` while there is none).
    n_states, n_mutations : int
        The graph's states and mutations, with the rows not appended yet.
    n_applied, n_parked, n_parked_total, n_fallbacks, n_lost : int
        The builder's counts, as last sent.
    """

    def __init__(self, run_id: str, seconds: dict[str, float]) -> None:
        self._store = PAGStore.chunked(run_id)
        self._unread: deque[bytes] = deque()  # rows of the store's segment, pickled
        self._unread_bytes = 0
        # Rows messages kept, and appended or dropped with their segment, since the start.
        self._received = self._appended = 0
        self._catching_up: asyncio.Future | None = None
        self.seconds = seconds
        self.end = -1
        self.n_states = self.n_mutations = 0
        self.n_applied = self.n_parked = self.n_parked_total = self.n_fallbacks = 0
        self.n_lost = 0

    @property
    def run_id(self) -> str:
        return self._store.run_id

    @property
    def store(self) -> PAGStore:
        """The columns received so far, of the segment being recorded, every row
        appended (at once: on the event loop, await :meth:`caught_up` first)."""
        if self._unread:
            self._append_until(self._received, math.inf)
        return self._store

    def extend(self, run_id: str, rows: bytes, summary: dict[str, Any]) -> None:
        """Keep ``rows`` (pickled, column or table name: bytes or strings) of segment
        ``run_id``, and the builder's counts in ``summary``.

        A new segment (the one before was spooled) starts a new store; rows of
        the one before not appended yet are dropped.
        """
        if run_id != self._store.run_id:
            self._store = PAGStore.chunked(run_id)
            self._appended += len(self._unread)
            self._unread.clear()
            self._unread_bytes = 0
        if rows:
            self._unread.append(rows)
            self._unread_bytes += len(rows)
            self._received += 1
        self.end = summary["end"]
        for name in ("n_states", "n_mutations", "n_applied", "n_parked", "n_parked_total",
                     "n_fallbacks", "n_lost"):
            setattr(self, name, summary[name])

    async def caught_up(self) -> None:
        """Append every row received before the call to :attr:`store`, letting the
        event loop run between turns of :data:`APPEND_TURN` seconds.

        Readers waiting together share one series of turns.
        """
        target = self._received
        while self._appended < target and self._unread:
            self.catch_up_soon()
            await asyncio.shield(self._catching_up)

    def behind(self) -> bool:
        """Whether more rows than :data:`APPEND_AT_ONCE` bytes are not appended yet;
        if so, appending them starts (:meth:`catch_up_soon`)."""
        if self._unread_bytes > APPEND_AT_ONCE:
            self.catch_up_soon()
            return True
        return False

    def catch_up_soon(self) -> None:
        """Start appending every row received so far, a turn at a time."""
        if self._catching_up is None or self._catching_up.done():
            self._catching_up = asyncio.ensure_future(self._catch_up(self._received))

    def stop(self) -> None:
        """Stop appending (the scheduler closes): what is left stays unappended."""
        if self._catching_up is not None:
            self._catching_up.cancel()

    def nbytes(self) -> int:
        """Memory held by the graph: its store's and the rows not appended yet (as
        pickled, which is less than once appended)."""
        return self._store.nbytes() + self._unread_bytes

    async def _catch_up(self, target: int) -> None:
        while self._appended < target and self._unread:
            self._append_until(target, APPEND_TURN)
            await asyncio.sleep(0)

    def _append_until(self, target: int, turn: float) -> None:
        """Append rows until ``target`` messages are, or for ``turn`` seconds."""
        started, cpu = time.perf_counter(), time.thread_time()
        until = started + turn
        while self._appended < target and self._unread and time.perf_counter() < until:
            rows = self._unread.popleft()
            self._unread_bytes -= len(rows)
            self._appended += 1
            try:
                self._append(rows)
            except Exception:  # the rows after it are still appended
                logger.exception("Crux could not append rows its graph process sent")
        seconds = self.seconds
        seconds["read"] += time.thread_time() - cpu
        seconds["longest_slice"] = max(seconds["longest_slice"],
                                       time.perf_counter() - started)

    def _append(self, rows: bytes) -> None:
        store = self._store
        for name, part in pickle.loads(rows).items():
            column = getattr(store, name)
            if isinstance(column, ChunkedColumn):
                column.frombytes(part)
            else:
                _extend_table(column, *part)


class Frames:
    """The messages of a :class:`multiprocessing.connection.Connection`, out of the bytes
    read from its pipe as they come.

    Each message is its pickle's length (4 bytes, big-endian; ``-1`` and 8 bytes
    for more than 2 GiB) and the pickle, as ``Connection.send`` writes them.  A
    message that cannot be unpickled is skipped and counted in :attr:`undecodable`.

    The bytes are read into a buffer (:meth:`read`, or copied, :meth:`feed`);
    those of messages not taken yet move to a second buffer when the
    messages before them are taken; both grow to the
    largest message seen and never shrink: memory given back and asked for
    again costs a page fault a page (128 for half a megabyte, several
    microseconds each here), on the event loop.  ``room``: the bytes each
    buffer holds from the start.

    :meth:`read` takes messages up to a budget of bytes: what a message holds
    is fresh memory, which costs the unpickling call its page faults (4 ms for
    a megabyte in a busy scheduler here, 16 µs a page), so a read that
    completes several pieces leaves all but the first :attr:`waiting`, for the
    next calls.
    """

    def __init__(self, room: int = 0) -> None:
        self._buffer, self._spare = bytearray(room), bytearray(room)  # touched now, once
        self._end = 0  # the bytes waiting are buffer[:end]
        self.undecodable = 0
        #: Whether a complete message waits in the buffer, left by a take's budget.
        self.waiting = False

    def feed(self, data: bytes | memoryview) -> list[Any]:
        """Take ``data``; the messages it completed, in order."""
        end = self._end + len(data)
        self._room(end)
        self._buffer[self._end:end] = data
        self._end = end
        return self._take()

    def read(self, descriptor: int, most: int) -> tuple[int | None, list[Any]]:
        """Read at most ``most`` bytes from ``descriptor`` straight into the buffer, and
        take the messages complete in it, no more once ``most`` bytes of them are
        taken (at least one).  How many bytes were read (``None`` if none were,
        for messages were :attr:`waiting`; ``0`` at the pipe's end), and the
        messages (``BlockingIOError`` if no bytes are ready)."""
        if self.waiting:
            return None, self._take(most)
        self._room(self._end + most)
        with memoryview(self._buffer) as view, view[self._end:self._end + most] as free:
            read = os.readv(descriptor, [free])
        self._end += read
        return read, self._take(most)

    def _room(self, size: int) -> None:
        if size > len(self._buffer):
            self._buffer.extend(bytes(size - len(self._buffer)))

    def _take(self, most: float = math.inf) -> list[Any]:
        """The messages complete in the buffer, up to ``most`` bytes of them (at least
        one); what is left waits at its front."""
        buffer = self._buffer
        messages, start = [], 0
        while (message := self._message_at(start)) is not None and start < most:
            head, size = message
            with memoryview(buffer) as view, view[start + head:start + head + size] as body:
                try:
                    messages.append(pickle.loads(body))
                except Exception as error:
                    self.undecodable += 1
                    logger.error("Crux could not read a message of its graph process: %r",
                                 error)
            start += head + size
        self.waiting = message is not None
        end = self._end
        left = end - start
        if start and left:  # what is left moves to the spare buffer, which takes over
            spare = self._spare
            if left > len(spare):
                spare.extend(bytes(left - len(spare)))
            with memoryview(buffer) as view:
                spare[:left] = view[start:end]
            self._buffer, self._spare = spare, buffer
        self._end = left
        return messages

    def _message_at(self, start: int) -> tuple[int, int] | None:
        """The length of the head and of the body of the message at ``start``, if the
        whole message is in the buffer."""
        buffer, end = self._buffer, self._end
        if end - start < 4:
            return None
        (size,), head = struct.unpack_from("!i", buffer, start), 4
        if size == -1:
            if end - start < 12:
                return None
            (size,), head = struct.unpack_from("!Q", buffer, start + 4), 12
        return (head, size) if end - start - head >= size else None


def _extend_table(table: StringTable, values: list[str], coded: bool) -> None:
    """Append strings to a table; look them up by value too if the builder does."""
    start = len(table.values)
    table.values += values
    if coded:
        table.codes.update(zip(values, range(start, start + len(values))))


class GraphProcess(Recorder):
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
    builder : GraphMirror
        The graph the process sent back.
    counts, seconds : dict
        As :class:`~crux_dask.plugins.ingest.Ingest`'s, the scheduler's and the
        process's together; ``seconds["longest_slice"]`` is the longest stretch
        the scheduler's event loop spent appending what the process sent (see
        :class:`GraphMirror`).  The scheduler's CPU seconds in the writer
        thread, pickling what is sent (``send``), and on the event loop reading
        what the process sends back and appending it (``read``) are counted too.
    """

    def __init__(self, spool: Spool, settings: dict[str, Any]) -> None:
        self.spool = spool
        self.settings = {**settings, "run_id": uuid.uuid4().hex}
        super().__init__(settings["max_pending"],
                         (*_SCHEDULER_COUNTS, *_PROCESS_COUNTS))
        self.sent = 0
        self.seconds.update(send=0.0, read=0.0)
        self.builder = GraphMirror(self.settings["run_id"], self.seconds)
        self.remote: dict[str, Any] = {"pending": 0, "cpu_seconds": 0.0, "pid": None}
        self.alive = True
        self._requests = itertools.count()
        self._answers: dict[int, asyncio.Future] = {}
        self._outgoing: deque = deque()
        self._wake = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process: Any = None
        self._writer = threading.Thread(target=self._write, name="crux-graph-writer",
                                        daemon=True)
        self._inbox: Connection | None = None  # what the process sends, read on the loop
        # What the loop reads the pipe into: a read, and a message of the process not
        # complete yet (at most a piece, or SHIP_STATES states' rows).
        self._frames = Frames(2 * READ_BYTES)
        self._paused = False  # not reading the pipe: messages read already wait
        self._started = False  # the writer, which starts the process
        self._heard = False  # whether the process sent anything: it is up
        self._queued_bytes = 0  # of the workers' batches in the queue

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        """Be ready to start the process, which starts with the first thing to send
        beyond roots (from the writer thread: starting the process takes
        a while)."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()

    async def close(self, timeout: float = 5.0) -> None:
        """Stop the process and the threads, waiting at most ``timeout`` seconds for
        the process to finish what it was doing (it is killed after that); one still
        starting is told to stop, and not waited for."""
        self.builder.stop()
        if not self._started:
            self.alive = False  # never to start
            return
        self._post(("close",))
        process = self._process
        if process is not None and not self._heard:
            # Still starting (importing this package): it reads "close" once started, with
            # nothing applied to finish, and is reaped in the background.
            threading.Thread(target=_ended, args=(process, timeout), name="crux-graph-reaper",
                             daemon=True).start()
        elif process is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), timeout)
            # It said it closed, or it is stuck: a second at most.
            await self._loop.run_in_executor(None, _ended, process, 1.0)
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
        number = next(self._graphs)
        self.record((GRAPH, number, time, label))
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
                              and all(entry[0] == GRAPH for entry in self.queue)):
            return  # nothing, or only roots: no process for them yet
        entries, self.queue = list(self.queue), deque()
        batch_bytes, self._queued_bytes = self._queued_bytes, 0
        self.sent += self.pending
        if self.alive and batch_bytes + _ENTRY_BYTES * MESSAGE_ENTRIES < MESSAGE_BYTES:
            for start in range(0, len(entries), MESSAGE_ENTRIES):  # no piece reaches the bytes
                self._post(("entries", entries[start:start + MESSAGE_ENTRIES]))
        elif self.alive:  # in pieces: the writer holds the interpreter while it pickles one
            piece: list = []
            size = 0
            for entry in entries:
                piece.append(entry)
                size += (len(entry) if isinstance(entry, bytes) else len(entry[2])
                         if entry[0] == REPORTS else _ENTRY_BYTES)
                if len(piece) == MESSAGE_ENTRIES or size >= MESSAGE_BYTES:
                    self._post(("entries", piece))
                    piece, size = [], 0
            if piece:
                self._post(("entries", piece))
        else:
            self.counts["events_dropped"] += self.pending
        self.pending = 0

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
        the state is in :attr:`builder`.

        Raises
        ------
        ValueError
            If a source state does not exist or the kind is unknown.
        """
        self.tick()  # the roots recorded go first
        return await self._ask("external", kind, fields)

    async def ask(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(store, end, *args)`` on the graph applied so far, in the process
        (in a thread, on what it sent, once it is gone).

        ``function`` and ``args`` travel pickled (a function by name); what it
        returns comes back, and what it raises is raised here.  An answer in
        :class:`~crux_dask.plugins.staging.Pieces` stays in the process and comes
        back as :class:`~crux_dask.plugins.staging.KeptPieces`, fetched a piece at
        a time.  The process applies no event meanwhile.
        """
        if self.alive:
            with contextlib.suppress(GraphProcessGone):
                return await self._ask("analyse", function, args)
        await self.builder.caught_up()
        return await ask_in_thread(self.builder, function, args)

    async def pieces(self) -> Pieces | KeptPieces:
        """The graph cut into pieces, in the process (kept there, see
        :class:`~crux_dask.plugins.staging.KeptPieces`) while it lives."""
        if self.alive:
            with contextlib.suppress(GraphProcessGone):
                return await self._ask("analyse", graph_pieces, ())
        await self.builder.caught_up()
        return await pieces_in_thread(self.builder)

    async def spooled_pieces(self) -> Pieces | KeptPieces:
        """The spooled segments cut into pieces, read back in the process while it lives."""
        run_ids = self.spool.run_ids
        if self.alive and run_ids:
            with contextlib.suppress(GraphProcessGone):
                return await self._ask("analyse", spooled_graph_pieces,
                                       (self.spool.directory, run_ids))
        return await spooled_in_thread(self.spool)

    async def caught_up(self) -> None:
        """Append every row the process sent to :attr:`builder` (see :class:`GraphMirror`)."""
        await self.builder.caught_up()

    def behind(self) -> bool:
        """Whether rows the process sent are being appended a turn at a time."""
        return self.builder.behind()

    @property
    def apart(self) -> bool:
        """Whether the process lives: answers are computed there."""
        return self.alive

    def sizes(self) -> dict[str, Any]:
        """The graph's size as the process last sent it (reading the store would append to
        it), what is pending here and there, and the process's own figures."""
        builder = self.builder
        return {"states": builder.n_states, "mutations": builder.n_mutations,
                "memory_bytes": builder.nbytes(),
                "events_pending": self.pending + self.remote["pending"],
                "graph_process": {"pid": self.remote["pid"], "alive": self.alive,
                                  "cpu_seconds": self.remote["cpu_seconds"],
                                  "seconds_sending": self.seconds["send"],
                                  "seconds_reading": self.seconds["read"],
                                  "messages_unreadable": self.messages_unreadable}}

    def _ask(self, *question: Any) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if not self.alive:
            future.set_exception(GraphProcessGone("Crux's graph process is gone"))
            return future
        number = next(self._requests)
        self._answers[number] = future
        self._post((question[0], number, *question[1:]))
        return future

    def _let_go(self, number: int) -> None:
        """Tell the process that the pieces of answer ``number`` are no longer read."""
        if self.alive:
            self._post(("release", number))

    def _fail_answers(self, reason: str) -> None:
        answers, self._answers = self._answers, {}
        for future in answers.values():
            if not future.done():
                future.set_exception(GraphProcessGone(reason))

    # -- threads ---------------------------------------------------------------------
    def _post(self, message: tuple) -> None:
        with self._wake:
            self._outgoing.append(message)
            self._wake.notify()
        if not self._started:
            self._started = True
            self._writer.start()

    def _write(self) -> None:
        """Start the process, then send what is posted until ``close``."""
        try:
            self._spawn()
        except Exception as error:
            logger.error("Crux could not start its graph process: %r", error)
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._lost, f"could not start: {error!r}")
            self._stopping()
            return
        connection = self._outbox
        while True:
            with self._wake:
                while not self._outgoing:
                    self._wake.wait()
                message = self._outgoing.popleft()
            started = time.thread_time()
            try:
                data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as error:  # a question that cannot travel: its asker is told
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._unsendable, message, error)
                continue
            try:
                connection.send_bytes(data)
            except (OSError, ValueError):  # the process is gone: reading its pipe says so
                return
            self.seconds["send"] += time.thread_time() - started
            if message[0] == "close":
                return

    def _unsendable(self, message: tuple, error: Exception) -> None:
        """A message that could not be pickled: the question's future fails with why."""
        self.last_error = f"could not send {message[0]!r} to the graph process: {error!r}"
        future = self._answers.pop(message[1], None) if message[0] in _QUESTIONS else None
        if future is not None and not future.done():
            future.set_exception(error)

    def _spawn(self) -> None:
        """Start the process: this module run by the interpreter running the scheduler,
        which imports this package and not the scheduler's main module, over two pipes."""
        process_inbox, outbox = os.pipe()
        inbox, process_outbox = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(process_inbox), str(process_outbox)],
                pass_fds=(process_inbox, process_outbox), stdin=subprocess.DEVNULL)
        finally:
            os.close(process_inbox)
            os.close(process_outbox)
        self._process = process
        self._outbox = Connection(outbox, readable=False)
        inbox = Connection(inbox, writable=False)
        self._outbox.send({**self.settings, "sys_path": sys.path})
        self.remote["pid"] = process.pid
        try:
            self._loop.call_soon_threadsafe(self._listen, inbox)
        except RuntimeError:  # the loop is closed: nobody reads it; "close" is still sent
            inbox.close()

    def _stopping(self) -> None:
        """From the writer, if the process could not start: wake :meth:`close`."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._stopped.set)

    # -- on the event loop ---------------------------------------------------------
    def _listen(self, inbox: Connection) -> None:
        """Read what the process sends on the event loop, as it comes.

        A thread that reads it would take the interpreter's lock from the
        loop for every message, and the loop waits up to the lock's switch
        interval (5 ms) to take it back: a graph sent a piece per message held
        the loop 20-60 ms that way.  Read here, in turns of at most
        :data:`READ_BYTES`, a message costs the loop only its unpickling.
        """
        self._inbox = inbox
        descriptor = inbox.fileno()
        os.set_blocking(descriptor, False)
        with contextlib.suppress(AttributeError, OSError):  # Linux: fewer, larger reads
            fcntl.fcntl(descriptor, fcntl.F_SETPIPE_SZ, READ_BYTES)
        self._loop.add_reader(descriptor, self._readable)

    def _readable(self) -> None:
        inbox = self._inbox
        if inbox is None:  # closed since this call was planned
            return
        started = time.thread_time()
        try:  # into buffers kept for it: fresh memory costs a page fault a page
            read, messages = self._frames.read(inbox.fileno(), READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            read, messages = 0, []
        self._heard = self._heard or bool(messages)
        for message in messages:
            try:
                self._on_message(message)
            except Exception:  # the next messages are still read
                logger.exception("Crux could not take a message of its graph process")
        self.seconds["read"] += time.thread_time() - started
        if self._inbox is None:  # it said it closed
            return
        if read == 0:  # gone without saying it closed
            self._stop_listening()
            self._lost("it exited")
        elif self._frames.waiting:  # the rest in the next turns, the pipe unread meanwhile
            if not self._paused:
                self._loop.remove_reader(inbox.fileno())
                self._paused = True
            self._loop.call_soon(self._readable)
        elif self._paused:
            self._loop.add_reader(inbox.fileno(), self._readable)
            self._paused = False

    def _stop_listening(self) -> None:
        """Stop reading what the process sends, and wake :meth:`close`."""
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            self._loop.remove_reader(inbox.fileno())
            inbox.close()
        self._stopped.set()

    def _on_message(self, message: tuple) -> None:
        kind = message[0]
        if kind == "rows":
            _, run_id, rows, summary = message
            self.builder.extend(run_id, rows, summary)
            for name in _PROCESS_COUNTS:
                self.counts[name] = summary["counts"][name]
            self.seconds["apply"] = summary["apply_seconds"]
            self.remote.update(pending=summary["pending"], cpu_seconds=summary["cpu_seconds"])
            if summary["last_error"] is not None:
                self.last_error = summary["last_error"]
        elif kind == "spooled":
            self.spool.written(*message[1:])
        elif kind == "closed":
            self._stop_listening()
        elif kind == "kept":  # an answer in pieces, which the process keeps
            _, number, count, head = message
            future = self._answers.pop(number, None)
            if future is None or future.done():  # the asker went away
                self._let_go(number)
            else:
                future.set_result(KeptPieces(functools.partial(self._ask, "piece", number),
                                             functools.partial(self._let_go, number),
                                             count, head))
        elif kind == "answer":
            _, number, value, error = message
            future = self._answers.pop(number, None)
            if future is not None and not future.done():
                if error is None:
                    future.set_result(value)
                else:
                    future.set_exception(error)

    def _lost(self, why: str) -> None:
        if self.alive:
            self.alive = False
            self.last_error = f"graph process lost: {why}"
            logger.error("Crux's graph process is gone (%s): the graph recorded so far "
                         "stays readable, and later events are counted as dropped", why)
            # What it sent is read from now on: appended a few milliseconds at a time.
            self.builder.catch_up_soon()
        self._fail_answers(f"Crux's graph process is gone ({why})")


def _ended(process: subprocess.Popen, timeout: float) -> None:
    """Wait ``timeout`` seconds for ``process`` to end, then kill it."""
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -- the process ---------------------------------------------------------------------
def serve(inbox: Connection, outbox: Connection, settings: dict[str, Any]) -> None:
    """Apply what the scheduler sends (``inbox``), send back (``outbox``) what the graph
    grew by, until ``close`` or until the scheduler is gone."""
    from crux_dask.graph.builder import PAGBuilder
    from crux_dask.plugins.ingest import Ingest
    from crux_dask.plugins.spool import Spool

    spool = Spool(settings["max_states"], settings["spool_dir"])
    ingest = Ingest(PAGBuilder(run_id=settings["run_id"]), spool,
                    max_pending=settings["max_pending"],
                    park_timeout=settings["park_timeout"], slice_events=PROCESS_SLICE,
                    slice_seconds=None)
    shipper = _Shipper(outbox, ingest)
    # What the process holds by now, its modules' objects, is never garbage: left out
    # of the collector's walks (one full collection of them took 37 ms here).
    gc.freeze()
    idle_wait = settings["apply_interval"]
    try:
        while True:
            busy = bool(ingest.queue or ingest.backlog)
            if inbox.poll(0 if busy else idle_wait):
                message = inbox.recv()
                if message[0] == "close":
                    break
                _handle(message, ingest, shipper)
                continue
            if busy:
                ingest.apply_slice()
                more = bool(ingest.queue or ingest.backlog)
                if not more:
                    ingest.resolve(time.monotonic() - ingest.park_timeout)
                shipper.ship(due=more)  # the rest of a burst goes at once
            else:
                ingest.resolve(time.monotonic() - ingest.park_timeout)
                shipper.ship()
    except (EOFError, OSError, KeyboardInterrupt):  # the scheduler is gone
        pass
    finally:
        spool.close()
    with contextlib.suppress(OSError, ValueError):
        outbox.send(("closed",))


def _handle(message: tuple, ingest: Any, shipper: _Shipper) -> None:
    kind = message[0]
    if kind == "entries":
        ingest.take(message[1])
    elif kind == "drain":
        while ingest.queue or ingest.backlog:
            ingest.apply_slice()
            shipper.ship(due=True)
        ingest.resolve(None)
        shipper.ship()
        shipper.answer(message[1], None)
    elif kind == "external":
        _, number, mutation, fields = message
        try:
            state = ingest.add_external(mutation, **fields)
        except (ValueError, TypeError) as error:
            shipper.answer(number, None, ValueError(str(error)))
        else:
            shipper.ship()
            shipper.answer(number, state)
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
        builder = ingest.builder
        try:
            value = function(builder.store, builder.end, *args)
        except Exception as error:
            shipper.answer(number, None, error)
        else:
            shipper.answer(number, value)


class _Shipper:
    """Sends the rows the process's store grew by, announces spooled segments, answers
    questions, and keeps the answers in pieces until the scheduler lets them go."""

    def __init__(self, connection: Connection, ingest: Any) -> None:
        self.connection = connection
        self.ingest = ingest
        self.store = ingest.builder.store
        self.shipped = dict.fromkeys(self.store.lengths(), 0)
        self.last = 0.0
        self.summary: dict[str, Any] = {}
        #: Answers in pieces, by number, until the scheduler lets them go.
        self.kept: OrderedDict[int, Pieces] = OrderedDict()

    def ship(self, due: bool = False) -> None:
        """Send what is new: now, or if ``due``, once :data:`SHIP_INTERVAL` passed or
        :data:`SHIP_STATES` states were made since the last send."""
        now = time.monotonic()
        if due and now - self.last < SHIP_INTERVAL and (
                self.ingest.builder.store.n_states - self.shipped["state_time"] < SHIP_STATES):
            return
        self.last = now
        ingest = self.ingest
        if ingest.builder.store is not self.store:  # spooled: the rest, then the next
            self._send_rows(ingest.spool)
            self.store = ingest.builder.store
            self.shipped = dict.fromkeys(self.store.lengths(), 0)
        self._send_rows(None)

    def _send_rows(self, spooled: Spool | None) -> None:
        store, shipped = self.store, self.shipped
        lengths = store.lengths()
        rows: dict[str, Any] = {}
        for name, length in lengths.items():
            start = shipped[name]
            if length > start:
                value = getattr(store, name)
                if isinstance(value, array):
                    rows[name] = value[start:length].tobytes()
                else:
                    rows[name] = (value.values[start:length],
                                  len(value.codes) == len(value.values))
        self.shipped = lengths
        ingest, builder = self.ingest, self.ingest.builder
        summary = {
            "end": builder.end if spooled is None else spooled.last_end,
            "n_applied": builder.n_applied, "n_parked": builder.n_parked,
            "n_parked_total": builder.n_parked_total, "n_fallbacks": builder.n_fallbacks,
            "n_lost": builder.n_lost, "n_states": store.n_states,
            "n_mutations": store.n_mutations, "counts": dict(ingest.counts),
            "pending": ingest.pending, "last_error": ingest.last_error,
        }
        if rows or summary != self.summary:  # nothing new: nothing sent
            self.summary = summary
            rows = pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL) if rows else b""
            self.connection.send(("rows", store.run_id, rows, {
                **summary, "apply_seconds": ingest.seconds["apply"],
                "cpu_seconds": time.process_time()}))
        if spooled is not None:
            self.connection.send(("spooled", *spooled.wait_last()))

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


if __name__ == "__main__":  # python -m crux_dask.plugins.graph_process INBOX OUTBOX
    from crux_dask.plugins.graph_process import main as _main  # by its name, as it pickles

    _main(*map(int, sys.argv[1:3]))
