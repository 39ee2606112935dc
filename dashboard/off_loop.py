"""Computing what the components show off the event loop: threads, ``OffLoop``, ``kept``."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from distributed.dashboard.components import DashboardComponent
from distributed.utils import log_errors

from crux_dask.dashboard.data import GraphView, PathSelection, Source
from crux_dask.store import PAGStore

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from crux_dask.dashboard.component import Component


class OffLoop(DashboardComponent):
    """Keeps ``components`` up to date without computing in the scheduler's process.

    Each :meth:`update` (periodic, on the event loop) shows what was
    computed, then, if the view changed since and nothing is being computed,
    has every stale component's :attr:`~.component.Component.computer` compute what it
    shows where the graph is (:attr:`GraphView.analyse`: for the graph being
    recorded, in the graph's own process, or in a thread on a copy; for one that
    no longer changes, in a thread).  A thread of the scheduler's process that
    computes for a second holds the event loop too: each time the loop lets
    go of the interpreter's lock (to wait on a socket, to read a file) it
    waits up to the lock's switch interval (5 ms) to get it back, and a page
    of the dashboard does that tens of times.  The event loop only reads the
    graph's lengths and sets column data.

    Parameters
    ----------
    data : Source
        Where the components read the graph (all the same one).
    components : list of Component
    """

    def __init__(self, data: Source, components: list[Component]) -> None:
        super().__init__()
        self.data, self.components = data, components
        self._running: tuple[list[Component], Future] | None = None

    @log_errors
    def update(self) -> None:
        """Show what was computed; start computing the view as it is now if it changed."""
        if self._running is not None:
            computing, done = self._running
            if not done.done():
                return
            self._running = None
            try:
                version, results = done.result()
            except Exception:  # the graph process is gone, or what it computed is not
                logger.exception("Crux: the dashboard's components could not be computed")
                version, results = self.data().version, [_FAILED] * len(computing)
            for component, result in zip(computing, results):
                if result is not _FAILED:
                    component.show(result)
                component._version = version
        view = self.data()
        stale = [c for c in self.components if c._version != view.version]
        if not stale:
            return
        computers = [c.computer for c in stale]
        work = asyncio.ensure_future(view.analyse(_compute_here, view.version, view.selection,
                                                  computers))
        self._running = (stale, work)

    def busy(self) -> bool:
        """Whether the thread is still computing what the components will show."""
        return self._running is not None and not self._running[1].done()


_FAILED = object()


def _compute(version: tuple, seen: GraphView,
             computers: list[Callable[[GraphView], Any]]) -> tuple[tuple, list]:
    """What each computer makes of ``seen``; ``_FAILED`` (and a log) where it raised."""
    results = []
    for computer in computers:
        try:
            results.append(kept(computer)(seen))
        except Exception:
            logger.exception("Crux: %s could not compute what it shows",
                             getattr(computer, "__name__", type(computer).__name__))
            results.append(_FAILED)
    return version, results


def _compute_here(store: PAGStore, end: int, version: tuple, selection: PathSelection | None,
                  computers: list[Callable[[GraphView], Any]]) -> tuple[tuple, list]:
    """:func:`_compute` on ``store``, where it is (between two of its batches, or on a
    copy)."""
    return _compute(version, GraphView(store, end, selection), computers)


#: Computers kept where they compute, by token: the newest :data:`KEPT_AT_MOST`, about
#: one per page open (the task-group map's fold holds 8 bytes per key of the graph).
_kept: OrderedDict[str, Any] = OrderedDict()
_kept_lock = threading.Lock()
KEPT_AT_MOST = 8


def kept(computer: Any) -> Any:
    """The computer kept for ``computer``'s ``token``, or ``computer`` if it has none.

    A computer with state of its own (what it folded in so far) has a
    ``token``: it travels to the graph's process once empty and is kept
    there, each visit of a copy with the same token finding the one that
    folded.  Only the newest :data:`KEPT_AT_MOST` are kept (pages closed
    long ago): a computer dropped is folded again from the start.
    """
    token = getattr(computer, "token", None)
    if token is None:
        return computer
    with _kept_lock:
        found = _kept.setdefault(token, computer)
        _kept.move_to_end(token)
        while len(_kept) > KEPT_AT_MOST:
            _kept.popitem(last=False)
    return found
