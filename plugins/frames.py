"""The messages of the graph process, out of the bytes read from its pipe as they come."""

from __future__ import annotations

import logging
import math
import os
import pickle
import struct
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["Frames"]


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
