"""The scheduler's copy of the graph a graph process builds, and the messages it reads.

The process sends back the rows it added to the graph's columns and string
tables.  :class:`GraphMirror` keeps them, and appends them to a store of its
own when something on the scheduler reads it (the JSON API, the dashboard, or
anything once the process is gone for good) as it would read the builder's
store: the event loop spends on the graph only those appends, and none while
nobody reads.  :class:`Frames` takes the process's messages out of the bytes
read from its pipe, a budget of bytes at a time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import pickle
import struct
import time
from collections import deque
from typing import Any

from crux_dask.growable import ChunkedColumn, StringTable
from crux_dask.store import PAGStore

logger = logging.getLogger(__name__)

__all__ = ["Frames", "GraphMirror"]

#: The longest the scheduler's event loop appends what the process sent at a stretch,
#: in seconds, for a reader that waits (:meth:`GraphMirror.caught_up`).
APPEND_TURN = 0.005
#: The most bytes of rows a reader that cannot wait appends at once (a few
#: milliseconds' worth): past it, it reads the graph as it was (:meth:`GraphMirror.behind`).
APPEND_AT_ONCE = 1 << 20


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


def _extend_table(table: StringTable, values: list[str], coded: bool) -> None:
    """Append strings to a table; look them up by value too if the builder does."""
    start = len(table.values)
    table.values += values
    if coded:
        table.codes.update(zip(values, range(start, start + len(values))))
