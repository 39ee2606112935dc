"""What the dashboard components read: the graph, its critical path, and what changed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.functions import FunctionLog
from crux_dask.groups import KeyGroups, group_name
from crux_dask.model import file_group
from crux_dask.scopes import Scope, scope_path
from crux_dask.store import PAGStore
from crux_dask.wcp import CriticalPath, critical_path

if TYPE_CHECKING:
    from crux_dask.pag import PAG
    from crux_dask.plugins.host import Progress
    from crux_dask.plugins.scheduler import CruxSchedulerPlugin

#: What a view asks of its graph: ``await analyse(function, *args)`` is
#: ``function(store, end, *args)``, computed where the graph is.
Analyse = Callable[..., Awaitable[Any]]


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
    return file_group(key) if key.startswith("/") else group_name(key)


#: The task group of each key of the graphs shown, found once per key.
cached_key_groups = KeyGroups(_shown_group)


@dataclass
class GraphView:
    """A graph with its end state and the path selected, and a version that changes
    when either does.

    A page reads a view on the scheduler's event loop: its :attr:`version`,
    and :attr:`analyse`, which computes what the page shows where the graph is
    (see :class:`~.off_loop.OffLoop`): for the graph being recorded, the
    scheduler plugin's :meth:`~crux_dask.plugins.CruxSchedulerPlugin.analyse`,
    whose view has no ``store`` (only its ``progress``); for a graph that no
    longer changes, a thread.  What is computed there reads a view with the
    ``store``; its critical path is computed once per view and shared by the
    components that read it.  ``load`` gives the run's load table, or its columns
    (:func:`crux_dask.load.load_frame`), where known; ``functions`` its function table
    (:class:`~crux_dask.functions.FunctionLog`), read on the event loop.
    """

    store: PAGStore | None
    end: int
    selection: PathSelection | None = None
    analyse: Analyse | None = None
    progress: Progress | None = None
    load: Callable[[], Any] | None = None
    functions: Callable[[], FunctionLog] | None = None
    _path: CriticalPath | None = None

    @classmethod
    def fixed(cls, store: PAGStore, end: int) -> GraphView:
        """A view of a graph that no longer changes: asked in a thread."""
        return cls(store, end, analyse=_in_thread_on(store, end))

    @property
    def version(self) -> tuple:
        chosen = self.selection or PathSelection()
        graph = self.progress or self.store
        return (graph.run_id, graph.n_states, graph.n_mutations, self.end,
                chosen.start, chosen.end, chosen.method,
                None if chosen.scope is None else chosen.scope.id)

    def with_selection(self, selection: PathSelection) -> GraphView:
        """The same graph, with another path selected."""
        return GraphView(self.store, self.end, selection, self.analyse, self.progress,
                         self.load, self.functions)

    def key_groups(self) -> np.ndarray:
        """The task group of every key of the store, by key code (found once per key,
        see :class:`~crux_dask.groups.KeyGroups`)."""
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
    """The graph a scheduler plugin is building, as applied so far (its
    :meth:`~crux_dask.plugins.CruxSchedulerPlugin.progress`): reading it asks nothing,
    and applies nothing: events still queued appear at a later update."""

    latest: list[GraphView] = []

    def view() -> GraphView:
        progress = plugin.progress()
        current = GraphView(None, progress.end, analyse=plugin.analyse, progress=progress,
                            load=plugin.load.log.columns,
                            functions=lambda: plugin.functions.log)
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
        current = base.with_selection(PathSelection(**vars(selection)))
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
        current = [("", f"recording: {self.plugin.progress().run_id[:12]}")]
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
        view = self._views[run_id] = GraphView.fixed(pag.stores[0], pag.ends[0])
        view.functions = lambda: self.plugin.functions.log  # the scheduler's, of every run
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


def static_source(pag: PAG, run_id: str | None = None, load: Any = None,
                  functions: Any = None) -> Source:
    """A recorded graph that no longer changes, with its ``load`` and ``functions``
    tables if given (:func:`crux_dask.read_load`, :func:`crux_dask.read_functions`)."""
    index = pag.run_ids.index(run_id) if run_id else len(pag.run_ids) - 1
    view = GraphView.fixed(pag.stores[index], pag.ends[index])
    if load is not None:
        view.load = lambda: load
    if functions is not None:
        log = FunctionLog.of(functions)
        view.functions = lambda: log
    return lambda: view


def _in_thread_on(store: PAGStore, end: int) -> Analyse:
    """What a view of a graph that no longer changes asks it: in a thread."""
    async def analyse(function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.wrap_future(in_thread(function, store, end, *args))

    return analyse


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
