"""Spooling: the graph so far goes to Parquet when it grows past ``crux-dask.max-states``.

Writing and reading back run in the spool's own thread, one job at a time and
in order, so a segment is never read before it is written and the scheduler's
event loop never waits for the disk.
"""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
import tempfile
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from crux_dask.graph.builder import PAGBuilder

if TYPE_CHECKING:
    from crux_dask.pag import PAG
    from crux_dask.store import PAGStore

logger = logging.getLogger(__name__)

__all__ = ["Spool"]


class Spool:
    """Segments of the graph written to a spool directory.

    Parameters
    ----------
    max_states : int or None
        States past which the graph is spooled; ``None``: never.
    directory : str or None
        Where segments go; if ``None``, a new temporary directory, made at
        the first spool and removed by :meth:`close` with ``remove_temporary``.

    Attributes
    ----------
    directory : str or None
        The spool directory, once known.
    temporary : bool
        Whether the directory is a temporary one, made by the spool.
    n_states : int
        States written to the spool so far.
    n_lost : int
        Copies the spooled segments released because their worker was lost.
    last_end : int
        The end state of the last segment spooled (``-1`` before any).
    """

    def __init__(self, max_states: int | None, directory: str | None) -> None:
        self.max_states = max_states
        self.directory = directory
        self.temporary = directory is None
        self.n_states = 0
        self.n_lost = 0
        self.last_end = -1
        self._segments: list[tuple[str, concurrent.futures.Future]] = []
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def run_ids(self) -> list[str]:
        """Run ids of the spooled segments, oldest first."""
        return [run_id for run_id, _ in self._segments]

    def due(self, builder: PAGBuilder) -> bool:
        """Whether spooling ``builder``'s graph now would free room.

        Data that workers still hold stays in the next segment, so spooling
        pays only when most states are no longer held.
        """
        n_states = builder.store.n_states
        return (self.max_states is not None and n_states > self.max_states
                and n_states - builder.n_live > self.max_states // 2)

    def spool(self, builder: PAGBuilder, now: float) -> PAGBuilder:
        """Write ``builder``'s graph in the spool thread; return the builder that goes on.

        The new builder starts where ``builder`` stops, at wall time ``now``: the
        data still held by workers carries over, so later events find it.  Its run
        id follows from ``builder``'s, so that spooling the same graph again (a
        graph process that resumes, see :mod:`crux_dask.plugins.journal`) writes
        the same segment over itself.
        """
        from crux_dask.pag import PAG
        from crux_dask.provenance import write_dataset

        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="crux-spool-")
        pag = PAG([builder.store], [builder.end])
        self._segments.append((builder.run_id, self._submit(write_dataset, self.directory,
                                                            pag)))
        self.n_states += builder.store.n_states
        self.n_lost += builder.n_lost
        self.last_end = builder.end
        following = PAGBuilder(uuid.uuid5(uuid.NAMESPACE_OID, builder.run_id).hex)
        following.continue_from(builder, now)
        logger.info("Crux spooled %d states to %s; the live graph now holds only what "
                    "came after", builder.store.n_states, self.directory)
        return following

    def wait_last(self) -> tuple[str, str, int, int]:
        """Wait until the last segment is written; what :meth:`written` takes of it.

        Raises what writing it raised.
        """
        run_id, write = self._segments[-1]
        write.result()
        return run_id, self.directory, self.n_states, self.n_lost

    def written(self, run_id: str, directory: str, n_states: int, n_lost: int) -> None:
        """Take note of a segment another process wrote (:meth:`wait_last`), to read it
        back here, once however often it is told; ``n_states`` and ``n_lost`` are that
        spool's totals."""
        if run_id not in self.run_ids:
            self._segments.append((run_id, _done()))
        self.directory, self.n_states, self.n_lost = directory, n_states, n_lost

    def wait(self) -> None:
        """Wait until every segment is written (raises what writing one raised)."""
        for _, write in self._segments:
            write.result()

    def __getstate__(self) -> dict[str, Any]:
        """What a copy keeps: the segments written (wait for them first), no thread."""
        return {**vars(self), "_thread": None, "_segments": self.run_ids}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state, _segments=[(run_id, _done()) for run_id in state["_segments"]])

    def read(self, run_id: str) -> concurrent.futures.Future[PAG]:
        """Read the spooled segment ``run_id`` back, in the spool thread.

        Returns
        -------
        concurrent.futures.Future
            Of the segment's :class:`~crux_dask.pag.PAG`; it fails with what
            reading raised (the spool is gone, a file is corrupt).

        Raises
        ------
        KeyError
            If no segment ``run_id`` was spooled.
        """
        if run_id not in self.run_ids:
            raise KeyError(f"no spooled run {run_id!r}")
        from crux_dask.provenance import read_dataset

        return self._submit(read_dataset, self.directory, run_id)

    def stores(self) -> list[PAGStore]:
        """Every spooled segment, read back, oldest first.

        Blocks until pending writes are done: call it off the event loop.
        """
        from crux_dask.provenance import read_dataset

        stores = []
        for run_id, write in self._segments:
            write.result()
            stores += read_dataset(self.directory, run_id).stores
        return stores

    def close(self, remove_temporary: bool = False) -> None:
        """Finish the writes under way and stop the spool thread.

        With ``remove_temporary``, also remove the spool directory if it is
        a temporary one (no directory was configured): nothing can read it
        once the scheduler is gone.  A configured directory is kept.
        """
        if self._thread is not None:
            self._thread.shutdown(wait=True)
        if remove_temporary and self.temporary and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            logger.info("Crux removed its temporary spool directory %s", self.directory)

    def _submit(self, function: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(1, "crux-spool")
        return self._thread.submit(function, *args)


def _done() -> concurrent.futures.Future:
    """A future that is done: of a segment written."""
    done: concurrent.futures.Future = concurrent.futures.Future()
    done.set_result(None)
    return done
