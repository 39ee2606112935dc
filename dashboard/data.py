"""What the dashboard components read: the graph, its critical path, and what changed."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from bokeh.models import ColumnDataSource
from distributed.dashboard.components import DashboardComponent
from distributed.utils import log_errors

from crux_dask.dashboard.pieces import set_in_pieces
from crux_dask.model import file_group
from crux_dask.plugins.scopes import group_of
from crux_dask.scopes import KeyGroups, Scope, scope_path
from crux_dask.store import PAGStore
from crux_dask.wcp import CriticalPath, critical_path

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from crux_dask.pag import PAG
    from crux_dask.plugins.scheduler import CruxSchedulerPlugin


@dataclass
class PathSelection:
    """Which critical path a page shows: between two states, by a method, or of one scope.

    With ``scope`` (a computation or span), ``start`` and ``end`` do not apply.
    """

    start: int | None = None
    end: int | None = None
    method: str = "observed"
    scope: Scope | None = None


def _shown_group(key: str) -> str:
    """A key's task group; a file's (its path) is its dataset or directory."""
    return file_group(key) if key.startswith("/") else group_of(key)


#: The task group of each key of the graphs shown, found once per key.
cached_key_groups = KeyGroups(_shown_group)


@dataclass
class GraphView:
    """A store with its end state and the path selected, and a version that
    changes when either does.

    The selected critical path is computed once per view and shared by the
    components that read it.  ``analyse``: for the graph being recorded, the
    scheduler plugin's :meth:`~crux_dask.plugins.CruxSchedulerPlugin.analyse`,
    which computes what a page shows where the graph is built (see
    :class:`OffLoop`); ``None`` for a graph that no longer changes, read in a
    thread as it is.
    """

    store: PAGStore
    end: int
    selection: PathSelection | None = None
    analyse: Callable[..., Awaitable[Any]] | None = None
    _path: CriticalPath | None = None

    @property
    def version(self) -> tuple:
        chosen = self.selection or PathSelection()
        return (self.store.run_id, self.store.n_states, self.store.n_mutations, self.end,
                chosen.start, chosen.end, chosen.method,
                None if chosen.scope is None else chosen.scope.id)

    def with_selection(self, selection: PathSelection) -> GraphView:
        """The same graph, with another path selected."""
        return GraphView(self.store, self.end, selection, self.analyse)

    def key_groups(self) -> np.ndarray:
        """The task group of every key of the store, by key code (found once per key,
        see :class:`~crux_dask.scopes.KeyGroups`)."""
        return cached_key_groups(self.store)

    def wcp(self) -> CriticalPath:
        """The selected critical path (the observed one to the end state by default).

        Raises
        ------
        ValueError
            If the scope selected has no state in this graph.
        """
        if self._path is None:
            chosen = self.selection or PathSelection()
            if chosen.scope is not None:
                self._path = scope_path(self.store, chosen.scope, self.key_groups(),
                                        chosen.method)
            else:
                self._path = critical_path(self.store, chosen.start, chosen.end,
                                           chosen.method, default_end=self.end)
        return self._path


#: How components get the current graph: a function returning a GraphView.
Source = Callable[[], GraphView]


def live_source(plugin: CruxSchedulerPlugin) -> Source:
    """The graph a scheduler plugin is building, as applied so far.

    Reading it applies nothing: events still queued appear at a later update,
    once the plugin's periodic callback has applied them.  States received from
    a graph process and not appended yet (see
    :class:`~crux_dask.plugins.graph_process.GraphMirror`) are appended as the
    view is read; more than a few milliseconds' worth appear once they are
    appended, a turn at a time: until then the view stays as it was (but for
    the first).
    """

    latest: list[GraphView] = []

    def view() -> GraphView:
        if latest and plugin.behind():  # appended a turn at a time meanwhile: as it was
            return latest[0]
        builder = plugin.builder
        current = GraphView(builder.store, builder.end, analyse=plugin.analyse)
        if latest and latest[0].version == current.version:
            return latest[0]  # unchanged: keep the path already computed
        latest[:] = [current]
        return current

    return view


def selected_source(data: Source, selection: PathSelection) -> Source:
    """``data`` seen through a page's own path selection."""
    latest: list[GraphView] = []

    def view() -> GraphView:
        base = data()
        current = GraphView(base.store, base.end, PathSelection(**vars(selection)),
                            base.analyse)
        if latest and latest[0].version == current.version:
            return latest[0]
        latest[:] = [current]
        return current

    return view


@dataclass
class RunChoice:
    """Which run a page shows: empty for the one being recorded, else a spooled run's id."""

    run_id: str = ""


class Runs:
    """The runs of a scheduler plugin: the one being recorded and the segments spooled before.

    A spooled segment is read back when first chosen, by the plugin's
    :meth:`~crux_dask.plugins.CruxSchedulerPlugin.read_spooled`, off the
    scheduler's event loop.
    """

    def __init__(self, plugin: CruxSchedulerPlugin) -> None:
        self.plugin = plugin
        self._reads: dict[str, Future[PAG]] = {}
        self._views: dict[str, GraphView] = {}

    def options(self) -> list[tuple[str, str]]:
        """``(value, label)`` pairs for a selector, the run being recorded first."""
        current = [("", f"recording: {self.plugin.builder.run_id[:12]}")]
        spooled = [(run_id, f"spooled: {run_id[:12]}")
                   for run_id in reversed(self.plugin.spooled_runs())]
        return current + spooled

    def view(self, run_id: str) -> GraphView | None:
        """The spooled run ``run_id``, or ``None`` while it is being read.

        Raises
        ------
        KeyError
            If no such run was spooled.
        Exception
            Whatever reading it back raised (the spool is gone, a file is corrupt).
        """
        view = self._views.get(run_id)
        if view is not None:
            return view
        read = self._reads.get(run_id)
        if read is None:
            read = self._reads[run_id] = self.plugin.read_spooled(run_id)
        if not read.done():
            return None
        pag = read.result()
        view = self._views[run_id] = GraphView(pag.stores[0], pag.ends[0])
        return view


def chosen_source(live: Source, runs: Runs, choice: RunChoice) -> Source:
    """``live``, or the spooled run ``choice`` names once it has been read back."""

    def view() -> GraphView:
        if choice.run_id:
            try:
                spooled = runs.view(choice.run_id)
            except Exception:  # shown by the page; the live run stays on screen
                spooled = None
            if spooled is not None:
                return spooled
        return live()

    return view


def static_source(pag: PAG, run_id: str | None = None) -> Source:
    """A recorded graph that no longer changes."""
    index = pag.run_ids.index(run_id) if run_id else len(pag.run_ids) - 1
    view = GraphView(pag.stores[index], pag.ends[index])
    return lambda: view


class Component(DashboardComponent):
    """Base of the Crux dashboard components: distributed's component contract.

    A component owns a ``root`` (its Bokeh model) and a ``source`` (its main
    :class:`~bokeh.models.ColumnDataSource`).  What it shows is made in two
    steps: :attr:`computer` reads a view and returns the new column data (in
    any thread or process: it touches no Bokeh model), :meth:`show` sets it
    (on the event loop).  :meth:`update` does both at once; :class:`OffLoop` computes
    elsewhere.  Either re-renders only when the graph or the path selected
    changed since the last time, so an idle page costs nothing, and logs what
    a render raises.

    Parameters
    ----------
    data : Source
        Where the component reads the graph.
    """

    def __init__(self, data: Source) -> None:
        super().__init__()
        self.data = data
        self._version: Any = None

    @log_errors
    def update(self) -> None:
        """Render the current view, here and now, if it changed since the last update."""
        view = self.data()
        if view.version == self._version:
            return
        self.render(view)
        self._version = view.version

    def render(self, view: GraphView) -> None:
        """Build the complete new column data from ``view`` and set it at once."""
        self.show(self.compute(view))

    #: What :meth:`show` sets, read from a view: ``computer(view)``.  It travels
    #: pickled to where the graph is built (a function, by name; an object with a
    #: ``token`` is kept there, see :func:`kept`).
    computer: Callable[[GraphView], Any]

    def compute(self, view: GraphView) -> Any:
        """What :meth:`show` sets, read from ``view``; touches no Bokeh model."""
        return kept(self.computer)(view)

    def show(self, computed: Any) -> None:
        """Set what :meth:`compute` returned on the component's models: by default, the
        column data of its ``source``, in pieces if it is long (:func:`set_in_pieces`)."""
        set_in_pieces(self.source, computed)

    @property
    def sources(self) -> list[ColumnDataSource]:
        """The sources that may grow as long as the graph's critical path (held back
        while a page adds the component, see :func:`~.pieces.hold_back`)."""
        return [self.source]


def in_thread(function: Callable[..., Any], *args: Any, name: str = "crux-dashboard"
              ) -> Future:
    """``function(*args)`` in a thread of its own, which ends with it.

    Not a pool: a thread left waiting for work would outlive the scheduler's
    dashboard (and be reported as leaked by distributed's tests).  Once it runs
    the future cannot be cancelled (as an executor's): one awaited by a task
    cancelled with its event loop still gets its result.
    """
    result: Future = Future()

    def run() -> None:
        if not result.set_running_or_notify_cancel():
            return
        try:
            result.set_result(function(*args))
        except BaseException as error:  # handed to whoever reads the result
            result.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return result


class OffLoop(DashboardComponent):
    """Keeps ``components`` up to date without computing in the scheduler's process.

    Each :meth:`update` (periodic, on the event loop) shows what was
    computed, then, if the view changed since and nothing is being computed,
    has every stale component's :attr:`~Component.computer` compute what it
    shows: where the graph is built, for the graph being recorded
    (:attr:`GraphView.analyse`: in the graph's own process, or in a thread on a
    copy); else, for a graph that no longer changes, in a thread.  A thread of
    the scheduler's process that
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
        if view.analyse is not None:
            work = asyncio.ensure_future(view.analyse(
                _compute_here, view.version, view.selection, computers))
        else:
            work = in_thread(_compute, view.version, view, computers)
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
    """:func:`_compute` on ``store``, where it is built (between two of its batches, or
    on a copy)."""
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
