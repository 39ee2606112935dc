"""What the dashboard components read: the graph, its critical path, and what changed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from crux_dask.pag import PAG
from crux_dask.store import PAGStore
from crux_dask.wcp import CriticalPath, critical_path


@dataclass
class GraphView:
    """A store with its end state, and a version that changes when the graph does.

    The default critical path is computed once per view and shared by the
    components that read it.
    """

    store: PAGStore
    end: int
    _path: CriticalPath | None = None

    @property
    def version(self) -> tuple[str, int, int, int]:
        return (self.store.run_id, self.store.n_states, self.store.n_mutations, self.end)

    def wcp(self, start: int | None = None, end: int | None = None,
            method: str = "observed") -> CriticalPath:
        if start is None and end is None and method == "observed":
            if self._path is None:
                self._path = critical_path(self.store, None, None, method,
                                           default_end=self.end)
            return self._path
        return critical_path(self.store, start, end, method, default_end=self.end)


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


def static_source(pag: PAG, run_id: str | None = None) -> Source:
    """A recorded graph that no longer changes."""
    index = pag.run_ids.index(run_id) if run_id else len(pag.run_ids) - 1
    view = GraphView(pag.stores[index], pag.ends[index])
    return lambda: view
