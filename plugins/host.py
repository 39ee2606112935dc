"""The graph host: what the scheduler plugin asks of the graph, wherever it is built.

Two hosts implement :class:`GraphHost`: :class:`LocalHost`, the ingest in the
scheduler's process, stepped in bounded slices by a periodic callback, and
:class:`~crux_dask.plugins.graph_process.GraphProcess`, the ingest in a
process of its own.  Both take what the scheduler's hooks and the workers'
handler record (:class:`~crux_dask.plugins.recorder.Recorder`), and answer the
same questions, so that no reader needs to know which one it asks.  What a
host answers in a thread of the scheduler's process is answered here, on a
copy of the columns taken up to the lengths read on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from crux_dask.plugins.ingest import Ingest
from crux_dask.plugins.staging import KeptPieces, Pieces

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder
    from crux_dask.plugins.spool import Spool
    from crux_dask.store import PAGStore

__all__ = ["GraphHost", "LocalHost", "Progress", "graph_pieces", "split_pieces",
           "spooled_graph_pieces"]


@dataclass(frozen=True)
class Progress:
    """How far the graph being recorded got: its size and the builder's counts.

    What a reader on the scheduler knows of the graph without asking: a page
    asks again only when it changed.
    """

    run_id: str
    n_states: int = 0
    n_mutations: int = 0
    end: int = -1
    n_applied: int = 0
    n_parked: int = 0
    n_parked_total: int = 0
    n_fallbacks: int = 0
    n_lost: int = 0
    nbytes: int = 0

    @classmethod
    def of(cls, builder: PAGBuilder) -> Progress:
        """The progress of ``builder``'s graph."""
        store = builder.store
        return cls(store.run_id, store.n_states, store.n_mutations, builder.end,
                   builder.n_applied, builder.n_parked, builder.n_parked_total,
                   builder.n_fallbacks, builder.n_lost, store.nbytes())


class GraphHost(Protocol):
    """What the scheduler plugin asks of the graph (besides what
    :class:`~crux_dask.plugins.recorder.Recorder` records).

    Attributes
    ----------
    apart : bool
        Whether answers are computed in a process of the graph's own.
    """

    apart: bool

    def progress(self) -> Progress:
        """How far the graph got, as last known here (nothing is asked)."""

    async def ask(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(store, end, *args)`` on the graph applied so far, off the event loop.

        ``function`` must be importable by name and ``args`` picklable."""

    async def pieces(self) -> Pieces | KeptPieces:
        """The graph applied so far, cut into pieces; their head: its end state."""

    async def spooled_pieces(self) -> Pieces | KeptPieces:
        """The spooled segments, read back and cut into pieces, oldest first; their head:
        how many pieces each segment's store has."""

    async def external(self, kind: str, **fields: Any) -> int:
        """Apply one mutation reported from outside Dask; the new state's id."""

    async def drain(self) -> None:
        """Wait until every entry recorded before the call is applied."""

    def sizes(self) -> dict[str, Any]:
        """The graph's size and what is pending, for the plugin's stats."""

    async def close(self) -> None:
        """Stop."""


class LocalHost(Ingest):
    """The ingest in the scheduler's process: events applied by the scheduler's periodic
    callback, a slice at a time, and questions answered in a thread on a copy."""

    apart = False

    async def ask(self, function: Callable[..., Any], *args: Any) -> Any:
        return await ask_in_thread(self.builder, function, args)

    async def pieces(self) -> Pieces:
        return await pieces_in_thread(self.builder)

    async def spooled_pieces(self) -> Pieces:
        return await spooled_in_thread(self.spool)

    async def external(self, kind: str, **fields: Any) -> int:
        return self.add_external(kind, **fields)

    def progress(self) -> Progress:
        return Progress.of(self.builder)

    def sizes(self) -> dict[str, Any]:
        return {"events_pending": self.pending, "graph_process": None}

    async def close(self) -> None:
        return None


async def snapshot(builder: PAGBuilder) -> tuple[PAGStore, int]:
    """A copy of ``builder``'s graph and its end state: the lengths it copies up to are
    read now, the copy is made in a thread, a column at a time."""
    store = builder.store
    upto, end = store.lengths(), builder.end
    copy = await asyncio.get_running_loop().run_in_executor(None, store.copy, upto)
    return copy, end


async def ask_in_thread(builder: PAGBuilder, function: Callable[..., Any],
                        args: tuple) -> Any:
    """``function(store, end, *args)`` in a thread, on a :func:`snapshot` of ``builder``."""
    store, end = await snapshot(builder)
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: function(store, end, *args))


async def pieces_in_thread(builder: PAGBuilder) -> Pieces:
    """``builder``'s graph cut into pieces in a thread, while events go on being applied.

    A thread of the scheduler's process that cuts a million states holds its
    interpreter for a second, and the event loop waits for it each time it
    lets go: distributed's system monitor, which reads a dozen files, then held
    the loop 70-110 ms.  A graph process cuts its own.
    """
    store, end = builder.store, builder.end
    upto = store.lengths()
    return Pieces(await asyncio.get_running_loop().run_in_executor(None, store.to_pieces,
                                                                  upto), end)


async def spooled_in_thread(spool: Spool) -> Pieces:
    """Every segment of ``spool``, read back and cut into pieces in a thread.

    Four segments of 200,000 states held the event loop 120-150 ms so: the loop
    waited for the interpreter each time it let go of it.  A graph process reads
    them itself.
    """
    if not spool.run_ids:
        return Pieces([], [])
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: stores_in_pieces(spool.stores()))


def graph_pieces(store: PAGStore, end: int) -> Pieces:
    """``store`` cut into pieces, ``end`` their head: a question for :meth:`GraphHost.ask`."""
    return Pieces(store.to_pieces(), end)


def spooled_graph_pieces(store: PAGStore, end: int, directory: str, run_ids: list[str]
                         ) -> Pieces:
    """The segments ``run_ids`` spooled to ``directory``, read back and cut into pieces;
    their head: how many pieces each store has.  A question for :meth:`GraphHost.ask`
    (the live graph, ``store`` and ``end``, is not read)."""
    from crux_dask.provenance import read_dataset

    return stores_in_pieces([segment for run_id in run_ids
                             for segment in read_dataset(directory, run_id).stores])


def stores_in_pieces(stores: list[PAGStore]) -> Pieces:
    """Each of ``stores`` cut into pieces, one after the other; their head: how many
    pieces each store has."""
    parts = [store.to_pieces() for store in stores]
    return Pieces([piece for part in parts for piece in part], [len(part) for part in parts])


def split_pieces(pieces: list[bytes], counts: list[int]) -> list[list[bytes]]:
    """``pieces`` split into consecutive lists of ``counts`` pieces."""
    parts, start = [], 0
    for count in counts:
        parts.append(pieces[start:start + count])
        start += count
    return parts
