"""Answers in pieces, and what the scheduler stages of them for a client to fetch.

A graph of a million states is a few hundred megabytes once cut
(:meth:`~crux_dask.store.PAGStore.to_pieces`).  Sent or held whole, it is one
message that the scheduler's process unpickles in one call, and memory it
holds until the client took the last byte.  So an answer travels a piece at a
time, as it is read:

- :class:`Pieces` is an answer made where it is read (a list of pieces);
- :class:`KeptPieces` is one that the graph process keeps: the scheduler asks
  for each piece as it is read, and for the next :data:`PIECES_AHEAD` ones
  meanwhile, so that it holds a few pieces at a time;
- :class:`Staging` is what a client fetches, a piece per message: pieces of
  both kinds, and objects pickled as they are fetched.

Both kinds of pieces are read the same way: ``len``, ``head``, ``await
fetch(index)`` and ``release()`` once they are no longer read.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import pickle
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from crux_dask.store import PIECE_BYTES

__all__ = ["PIECES_AHEAD", "KeptPieces", "Pieces", "Staging", "fetched"]

#: The pieces of a kept answer asked for beyond the one read.
PIECES_AHEAD = 2


class Pieces(list):
    """An answer cut into pieces (``bytes``), and a ``head`` that goes with them."""

    def __init__(self, pieces: Iterable[Any] = (), head: Any = None) -> None:
        super().__init__(pieces)
        self.head = head

    @classmethod
    def cut(cls, data: bytes) -> Pieces:
        """``data`` in pieces of :data:`~crux_dask.store.PIECE_BYTES` (one, if it is empty)."""
        return cls([data[start:start + PIECE_BYTES]
                    for start in range(0, len(data), PIECE_BYTES)] or [data])

    async def fetch(self, index: int) -> Any:
        """Piece ``index``."""
        return self[index]

    async def fetch_all(self) -> list[Any]:
        """Every piece, in order."""
        return list(self)

    def release(self) -> None:
        """Nothing to let go of: the pieces are here."""


class KeptPieces:
    """An answer in pieces that the graph process keeps, fetched a piece at a time.

    Parameters
    ----------
    ask : callable
        ``ask(index)``: a future of piece ``index``, sent by the process.
    let_go : callable
        Tells the process that the pieces are no longer read.
    count : int
        How many pieces there are.
    head : object
        What goes with the pieces.
    """

    def __init__(self, ask: Callable[[int], asyncio.Future], let_go: Callable[[], None],
                 count: int, head: Any) -> None:
        self._ask, self._let_go = ask, let_go
        self._count = count
        self.head = head
        self._asked: dict[int, asyncio.Future] = {}
        self._released = False

    def __len__(self) -> int:
        return self._count

    async def fetch(self, index: int) -> bytes:
        """Piece ``index``, the next :data:`PIECES_AHEAD` asked for meanwhile; pieces
        asked for before it and not read are dropped.

        Raises
        ------
        IndexError
            If there is no piece ``index``.
        KeyError
            If the pieces were let go (:meth:`release`, or by the process, which
            keeps a bounded number of answers).
        GraphProcessGone
            If the process is gone, or was closed, before it sent the piece.
        """
        if self._released:
            raise KeyError("the pieces were let go")
        if not 0 <= index < self._count:
            raise IndexError(f"piece {index} of {self._count}")
        asked = self._asked
        for behind in [number for number in asked if number < index]:
            asked.pop(behind).cancel()
        for number in range(index, min(index + 1 + PIECES_AHEAD, self._count)):
            if number not in asked:
                asked[number] = future = self._ask(number)
                future.add_done_callback(_seen)
        return await asked.pop(index)

    async def fetch_all(self) -> list[bytes]:
        """Every piece, in order (held here all together: for what needs them so)."""
        return [await self.fetch(index) for index in range(self._count)]

    def release(self) -> None:
        """Tell the process to let go of the pieces, and forget those asked for ahead."""
        for future in self._asked.values():
            future.cancel()
        self._asked.clear()
        if not self._released:
            self._released = True
            self._let_go()


def _seen(future: asyncio.Future) -> None:
    """Mark a piece's failure as seen: pieces asked for ahead may never be read."""
    if not future.cancelled():
        future.exception()


class Staging:
    """Parts of pieces that a client fetches as one sequence, a piece per message.

    Parameters
    ----------
    parts : list
        :class:`Pieces` or :class:`KeptPieces`, in order.  A piece that is not
        ``bytes`` is pickled when it is fetched: pickling is spread over the
        fetches, a piece per message.
    """

    def __init__(self, parts: list[Pieces | KeptPieces]) -> None:
        self.parts = parts
        self._starts = list(itertools.accumulate((len(part) for part in parts), initial=0))

    def __len__(self) -> int:
        return self._starts[-1]

    async def fetch(self, index: int) -> bytes:
        """Piece ``index`` of the whole, pickled if it is not ``bytes``."""
        if not 0 <= index < len(self):
            raise IndexError(f"piece {index} of {len(self)}")
        part = bisect.bisect_right(self._starts, index) - 1
        piece = await self.parts[part].fetch(index - self._starts[part])
        return piece if isinstance(piece, bytes) else pickle.dumps(piece, protocol=5)

    def release(self) -> None:
        """Let go of every part."""
        for part in self.parts:
            part.release()


async def fetched(pieces: Pieces | KeptPieces, take: Callable[[bytes], Awaitable[None]]
                  ) -> None:
    """``take`` each piece in order, then let the pieces go (also if ``take`` fails)."""
    try:
        for index in range(len(pieces)):
            await take(await pieces.fetch(index))
    finally:
        pieces.release()
