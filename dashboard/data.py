"""What the dashboard components read: the graph, its critical path, and what changed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from crux_dask.pag import PAG
from crux_dask.store import PAGStore
from crux_dask.wcp import CriticalPath, critical_path


@dataclass
class PathSelection:
    """Which critical path a page shows: between two states, by a method."""

    start: int | None = None
    end: int | None = None
    method: str = "observed"


@dataclass
class GraphView:
    """A store with its end state and the path selected, and a version that
    changes when either does.

    The selected critical path is computed once per view and shared by the
    components that read it.
    """

    store: PAGStore
    end: int
    selection: PathSelection | None = None
    _path: CriticalPath | None = None

    @property
    def version(self) -> tuple:
        chosen = self.selection or PathSelection()
        return (self.store.run_id, self.store.n_states, self.store.n_mutations, self.end,
                chosen.start, chosen.end, chosen.method)

    def wcp(self) -> CriticalPath:
        """The selected critical path (the observed one to the end state by default)."""
        if self._path is None:
            chosen = self.selection or PathSelection()
            self._path = critical_path(self.store, chosen.start, chosen.end, chosen.method,
                                       default_end=self.end)
        return self._path


#: How components get the current graph: a function returning a GraphView.
Source = Callable[[], GraphView]


def live_source(plugin) -> Source:
    """The graph a scheduler plugin is building (events received so far applied first)."""

    latest: list[GraphView] = []

    def view() -> GraphView:
        plugin.apply_pending()
        current = GraphView(plugin.builder.store, plugin.builder.end)
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
        current = GraphView(base.store, base.end, PathSelection(**vars(selection)))
        if latest and latest[0].version == current.version:
            return latest[0]
        latest[:] = [current]
        return current

    return view


def static_source(pag: PAG, run_id: str | None = None) -> Source:
    """A recorded graph that no longer changes."""
    index = pag.run_ids.index(run_id) if run_id else len(pag.run_ids) - 1
    view = GraphView(pag.stores[index], pag.ends[index])
    return lambda: view


class Component:
    """Base of the dashboard components (distributed's component contract).

    A component owns a ``source`` and a ``root``; :meth:`update` re-renders
    only when the graph changed since the last one, so an idle page costs
    nothing.
    """

    def __init__(self, data: Source) -> None:
        self.data = data
        self._version: Any = None

    def update(self) -> None:
        view = self.data()
        if view.version == self._version:
            return
        self._version = view.version
        self.render(view)

    def render(self, view: GraphView) -> None:
        """Build the complete new column data from ``view``."""
        raise NotImplementedError
