"""The whole graph, aggregated: task groups × location classes, critical path highlighted.

Each update folds in only the states and mutations added since the last one,
and the figure shows at most ``max_groups`` nodes and ``max_edges`` edges, so
neither the server's work nor the browser's depends on the size of the graph.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, DataTable, HoverTool, TableColumn
from bokeh.plotting import figure
from distributed.utils import log_errors

from crux_dask.dashboard.data import Component, GraphView, Source
from crux_dask.model import location_class
from crux_dask.store import PAGStore

CLASSES = ["root", "client", "file", "disk", "memory"]
_CLASS_CODE = {name: i for i, name in enumerate(CLASSES)}
DETAIL_COLUMNS = ("state_id", "key", "location", "time", "size")


class PAGOverview(Component):
    """Nodes are (task prefix, location class) groups; edges count the mutations between them."""

    def __init__(self, data: Source, max_groups: int = 150, max_edges: int = 300,
                 max_details: int = 500, **kwargs: Any) -> None:
        super().__init__(data)
        self.max_groups = max_groups
        self.max_edges = max_edges
        self.max_details = max_details
        self._run_id: str | None = None
        self._reset()
        self.source = ColumnDataSource({c: [] for c in (
            "x", "y", "group", "label", "klass", "count", "bytes", "radius", "color")})
        self.edges = ColumnDataSource({c: [] for c in ("x0", "y0", "x1", "y1", "count",
                                                       "alpha")})
        self.figure = figure(title="Program activity graph by task group and location "
                             "(click a group for its states)",
                             y_range=CLASSES, x_axis_label="first seen (s)",
                             name="crux-overview", height=320,
                             tools="pan,wheel_zoom,tap,reset", **kwargs)
        self.figure.segment("x0", "y0", "x1", "y1", source=self.edges, line_alpha="alpha",
                            line_color="#888888")
        nodes = self.figure.scatter("x", "y", size="radius", color="color",
                                    source=self.source, fill_alpha=0.7,
                                    name="crux-overview-nodes")
        self.figure.add_tools(HoverTool(renderers=[nodes], tooltips=[
            ("group", "@label @klass"), ("states", "@count"), ("bytes", "@bytes{0.0 b}")]))
        self.details = ColumnDataSource({c: [] for c in DETAIL_COLUMNS})
        self.table = DataTable(source=self.details, height=200, index_position=None,
                               name="crux-overview-states",
                               columns=[TableColumn(field=c, title=c) for c in DETAIL_COLUMNS],
                               **kwargs)
        self.source.selected.on_change("indices", self._drill_down)
        self._store: PAGStore | None = None
        self.root = column(self.figure, self.table, **kwargs)

    def _reset(self) -> None:
        self._states_seen = 0
        self._mutations_seen = 0
        self._class_of_location: list[int] = []
        self._count: dict[int, int] = {}
        self._bytes: dict[int, int] = {}
        self._first: dict[int, float] = {}
        self._edge_count: dict[tuple[int, int], int] = {}

    def render(self, view: GraphView) -> None:
        store = view.store
        if store.run_id != self._run_id or store.n_states < self._states_seen:
            self._run_id = store.run_id
            self._reset()
        self._fold_in(store)
        self._store = store
        self._publish(store, view)

    def _fold_in(self, store: PAGStore) -> None:
        """Add the states and mutations that are new since the last update."""
        locations = store.locations.values
        for name in locations[len(self._class_of_location):]:
            self._class_of_location.append(_CLASS_CODE.get(location_class(name), 4))
        lo, hi = self._states_seen, store.n_states
        if hi > lo:
            ids = np.arange(lo, hi)
            group = self._groups(store, ids)
            size = store.column("state_size", ids)
            time = store.column("state_time", ids)
            uniques, first, inverse = np.unique(group, return_index=True, return_inverse=True)
            counts = np.bincount(inverse)
            sizes = np.bincount(inverse, weights=size)
            for g, i, c, b in zip(uniques.tolist(), first.tolist(), counts.tolist(),
                                  sizes.tolist()):
                self._count[g] = self._count.get(g, 0) + c
                self._bytes[g] = self._bytes.get(g, 0) + int(b)
                self._first.setdefault(g, float(time[i]))
            self._states_seen = hi
        lo, hi = self._mutations_seen, store.n_mutations
        if hi > lo:
            ids = np.arange(lo, hi)
            src = self._groups(store, store.column("mutation_src", ids))
            dst = self._groups(store, store.column("mutation_dst", ids))
            pairs, counts = np.unique(np.stack([src, dst], axis=1), axis=0, return_counts=True)
            for (a, b), c in zip(pairs.tolist(), counts.tolist()):
                self._edge_count[(a, b)] = self._edge_count.get((a, b), 0) + c
            self._mutations_seen = hi

    def _groups(self, store: PAGStore, states: np.ndarray) -> np.ndarray:
        label = store.column("key_label", store.column("state_key", states))
        klass = np.asarray(self._class_of_location)[store.column("state_location", states)]
        return label.astype("int64") * len(CLASSES) + klass

    @log_errors
    def _drill_down(self, attr: str, old: list, new: list) -> None:
        """The individual states of the group clicked (the first ``max_details``)."""
        self.details.data = self.states_of(self.source.data["group"][new[0]]) if new else {
            c: [] for c in DETAIL_COLUMNS}

    def states_of(self, group: int) -> dict[str, list]:
        """Columns of the states of one group, first ``max_details`` of them."""
        store = self._store
        if store is None:
            return {c: [] for c in DETAIL_COLUMNS}
        states = np.arange(store.n_states)
        ids = states[self._groups(store, states) == group][: self.max_details]
        frame = store.states_frame(ids)
        return {c: frame[c].astype(object).where(frame[c].notna(), None).tolist()
                for c in DETAIL_COLUMNS}

    def _publish(self, store: PAGStore, view: GraphView) -> None:
        shown = sorted(self._count, key=self._count.__getitem__, reverse=True)
        shown = shown[: self.max_groups]
        on_path: set[int] = set()
        path = view.wcp()
        if len(path.states):
            on_path = set(self._groups(store, path.states["state_id"].to_numpy()).tolist())
        t0 = min(self._first.values()) if self._first else 0.0
        labels = store.labels.values
        x = {g: self._first[g] - t0 for g in shown}
        y = {g: CLASSES[g % len(CLASSES)] for g in shown}
        self.source.data = {
            "x": [x[g] for g in shown], "y": [y[g] for g in shown], "group": shown,
            "label": [labels[g // len(CLASSES)] for g in shown],
            "klass": [y[g] for g in shown],
            "count": [self._count[g] for g in shown],
            "bytes": [self._bytes[g] for g in shown],
            "radius": [6 + 3 * math.log10(self._count[g]) for g in shown],
            "color": ["#d62728" if g in on_path else "#1f77b4" for g in shown],
        }
        visible = set(shown)
        edges = [(c, e) for e, c in self._edge_count.items()
                 if e[0] in visible and e[1] in visible and e[0] != e[1]]
        edges = sorted(edges, reverse=True)[: self.max_edges]
        top = edges[0][0] if edges else 1
        self.edges.data = {
            "x0": [x[a] for _, (a, b) in edges], "y0": [y[a] for _, (a, b) in edges],
            "x1": [x[b] for _, (a, b) in edges], "y1": [y[b] for _, (a, b) in edges],
            "count": [c for c, _ in edges],
            "alpha": [0.15 + 0.6 * c / top for c, _ in edges],
        }
