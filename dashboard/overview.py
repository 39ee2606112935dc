"""The whole graph as a map of task groups, in layers, with the critical path over it.

A node is a task group (every state of a key counts for its key's group:
computed, moved, spilled or released), sized by its data volume; an edge
counts the mutations from one group to another, and a group sits one layer to
the right of the deepest group it takes data from (a layer too tall for one
column in columns side by side, on a grid that keeps every label readable: see
:mod:`~.map_layout`).  Groups the path goes
through are coloured by where the path's time in them went (its busy
categories, then its gaps: client, the stages, queued, wait) and joined by the
path's own edges; the others are grey.

Each update folds in only the states and mutations added since the last one,
and the figure shows at most ``max_groups`` nodes (those on the path first,
then the largest) and ``max_edges`` edges, so neither the server's work nor
the browser's depends on the size of the graph.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from itertools import pairwise
from typing import Any

import numpy as np
from bokeh.layouts import column
from bokeh.models import (
    ColumnDataSource,
    DataTable,
    FixedTicker,
    HoverTool,
    Legend,
    Range1d,
    ScrollBox,
)
from bokeh.palettes import Category20
from bokeh.plotting import figure
from distributed.utils import log_errors

from crux_dask.dashboard.callbacks import on_change
from crux_dask.dashboard.component import Component
from crux_dask.dashboard.data import GraphView, Source
from crux_dask.dashboard.datatables import table_columns
from crux_dask.dashboard.map_layout import (
    LABEL_OFFSET,
    NAME_CHARS,
    frame,
    layer_ticks,
    node_px,
    positions,
)
from crux_dask.dashboard.off_loop import kept
from crux_dask.graph.rules import key_label
from crux_dask.path import CATEGORIES, PARTS, CriticalPath
from crux_dask.store import PAGStore

DETAIL_COLUMNS = ("state_id", "key", "location", "time", "size")
NODE_COLUMNS = ("x", "y", "layer", "group", "label", "name", "count", "bytes", "size",
                "color", "dominant", "on_path")
#: A colour per category of the path's time; groups off the path are grey.
CATEGORY_COLORS = dict(zip(CATEGORIES, Category20[len(CATEGORIES)]))
OFF_PATH = "#c7c7c7"
#: What a group off the path is "mostly", in the legend and the hover.
OFF_PATH_LABEL = "off the path"

logger = logging.getLogger(__name__)


class GroupFold:
    """The groups, their sizes and the mutations between them, folded in as the graph
    grows; the map drawn from them.

    Touches no Bokeh model: it computes where the graph is (see
    :class:`~.off_loop.OffLoop`), and is kept there by its ``token``
    (:func:`~.off_loop.kept`), so that each update folds in only what is new.
    """

    def __init__(self, max_groups: int = 150, max_edges: int = 300,
                 max_details: int = 500) -> None:
        self.token = uuid.uuid4().hex
        self.max_groups = max_groups
        self.max_edges = max_edges
        self.max_details = max_details
        self._run_id: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._states_seen = 0
        self._mutations_seen = 0
        self._names: list[str] = []  # group code -> name
        self._code: dict[str, int] = {}  # group name -> code
        self._key_group = np.zeros(0, np.int64)  # key code -> group code
        self._count: dict[int, int] = defaultdict(int)
        self._bytes: dict[int, int] = defaultdict(int)
        self._first: dict[int, float] = {}
        self._edge_count: dict[tuple[int, int], int] = defaultdict(int)

    def __call__(self, view: GraphView) -> tuple[dict, dict, dict]:
        """Fold in what is new in ``view``; the nodes, edges and path edges to show."""
        store = view.store
        if store.run_id != self._run_id or store.n_states < self._states_seen:
            self._run_id = store.run_id
            self._reset()
        self._fold_in(store, view.key_groups())
        return self._drawn(store, view.wcp())

    # -- aggregation ----------------------------------------------------------------
    def _fold_in(self, store: PAGStore, names: np.ndarray) -> None:
        """Add the keys (``names``: the group of each), states and mutations that are
        new since the last update."""
        if len(names) > len(self._key_group):
            fresh = [self._code.setdefault(name, len(self._code))
                     for name in names[len(self._key_group):].tolist()]
            self._names.extend(list(self._code)[len(self._names):])
            self._key_group = np.concatenate([self._key_group, np.array(fresh, np.int64)])
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
                self._count[g] += c
                self._bytes[g] += int(b)
                self._first.setdefault(g, float(time[i]))
            self._states_seen = hi
        lo, hi = self._mutations_seen, store.n_mutations
        if hi > lo:
            ids = np.arange(lo, hi)
            src = self._groups(store, store.column("mutation_src", ids))
            dst = self._groups(store, store.column("mutation_dst", ids))
            between = src != dst
            # One number per pair of groups: sorting numbers is much faster than rows.
            width = len(self._names)
            pairs, counts = np.unique(src[between] * width + dst[between], return_counts=True)
            for pair, c in zip(pairs.tolist(), counts.tolist()):
                self._edge_count[divmod(pair, width)] += c
            self._mutations_seen = hi

    def _groups(self, store: PAGStore, states: np.ndarray) -> np.ndarray:
        return self._key_group[store.column("state_key", states)]

    def layers(self) -> dict[int, int]:
        """Each group's layer: one more than the deepest group it takes data from.

        Groups that take data from each other round a cycle are placed after
        the layers found so far.
        """
        incoming: dict[int, list[int]] = defaultdict(list)
        waiting = {g: 0 for g in self._count}
        for a, b in self._edge_count:
            if a in waiting and b in waiting:
                incoming[b].append(a)
                waiting[b] += 1
        outgoing: dict[int, list[int]] = defaultdict(list)
        for b, sources in incoming.items():
            for a in sources:
                outgoing[a].append(b)
        layer = {}
        ready = [g for g, n in waiting.items() if n == 0]
        while ready:
            g = ready.pop()
            layer[g] = max((layer[a] + 1 for a in incoming[g] if a in layer), default=0)
            for b in outgoing[g]:
                waiting[b] -= 1
                if waiting[b] == 0:
                    ready.append(b)
        deepest = max(layer.values(), default=-1)
        for g in waiting:
            layer.setdefault(g, deepest + 1)
        return layer

    # -- drawing --------------------------------------------------------------------
    def _drawn(self, store: PAGStore, path: CriticalPath) -> tuple[dict, dict, dict]:
        """Columns of the nodes, the edges and the path's edges."""
        on_path, sequence = self._path_through_groups(store, path)
        by_size = sorted(self._count, key=self._count.__getitem__, reverse=True)
        shown = list(dict.fromkeys([*sequence, *by_size]))[: self.max_groups]
        layer = self.layers()
        x, y = positions(sorted(shown, key=lambda g: self._first.get(g, 0.0)), layer)
        visible = set(shown)
        return (self._node_columns(shown, layer, x, y, on_path),
                self._edge_columns(visible, x, y), _path_edge_columns(sequence, visible, x, y))

    def _path_through_groups(self, store: PAGStore, path: CriticalPath
                             ) -> tuple[dict[int, dict[str, float]], list[int]]:
        """The seconds the path spends in each group it goes through, and those groups.

        Returns
        -------
        on_path : dict
            Group code -> seconds of the path in it by category: its busy
            categories, then the gaps (:data:`~crux_dask.path.PARTS`).
        sequence : list of int
            The groups in the order the path goes through them, each run of
            one group once.
        """
        steps = path.steps
        if not len(steps):
            return {}, []
        groups = self._groups(store, steps["dst"].to_numpy())
        visited, where = np.unique(groups, return_inverse=True)
        seconds = np.zeros((len(visited), len(CATEGORIES)))
        column = {c: i for i, c in enumerate(CATEGORIES)}
        np.add.at(seconds, (where, steps["category"].map(column).to_numpy()),
                  steps["busy"].to_numpy())
        for part in PARTS:
            seconds[:, column[part]] += np.bincount(where, steps[part].to_numpy(),
                                                    len(visited))
        on_path = {g: dict(zip(CATEGORIES, row))
                   for g, row in zip(visited.tolist(), seconds.tolist())}
        first = self._groups(store, steps["src"].to_numpy()[:1])
        chain = np.concatenate([first, groups])
        return on_path, chain[np.r_[True, chain[1:] != chain[:-1]]].tolist()

    def _node_columns(self, shown: list[int], layer: dict[int, int], x: dict[int, int],
                      y: dict[int, float], on_path: dict[int, dict[str, float]]
                      ) -> dict[str, list]:
        """Columns of the nodes: one per group shown, coloured by where the path's time
        in it mostly went (grey off the path)."""
        dominant = {g: max(seconds, key=seconds.__getitem__) for g, seconds in on_path.items()}
        return {
            "x": [x[g] for g in shown], "y": [y[g] for g in shown],
            "layer": [layer[g] for g in shown], "group": shown,
            "label": [self._names[g] for g in shown],
            "name": [_short_name(self._names[g]) for g in shown],
            "count": [self._count[g] for g in shown],
            "bytes": [self._bytes[g] for g in shown],
            "size": [node_px(self._bytes[g]) for g in shown],
            "color": [CATEGORY_COLORS[dominant[g]] if g in dominant else OFF_PATH
                      for g in shown],
            "dominant": [dominant.get(g, OFF_PATH_LABEL) for g in shown],
            "on_path": [sum(on_path[g].values()) if g in on_path else 0.0 for g in shown],
        }

    def _edge_columns(self, visible: set[int], x: dict[int, float], y: dict[int, float]
                      ) -> dict[str, list]:
        """Columns of the edges between groups shown: the ``max_edges`` that count the
        most mutations, more opaque the more they count."""
        edges = sorted(((c, e) for e, c in self._edge_count.items()
                        if e[0] in visible and e[1] in visible), reverse=True)
        edges = edges[: self.max_edges]
        top = edges[0][0] if edges else 1
        return {
            "x0": [x[a] for _, (a, b) in edges], "y0": [y[a] for _, (a, b) in edges],
            "x1": [x[b] for _, (a, b) in edges], "y1": [y[b] for _, (a, b) in edges],
            "count": [c for c, _ in edges],
            "alpha": [0.15 + 0.6 * c / top for c, _ in edges],
        }

    def states_of(self, store: PAGStore, group: int) -> dict[str, list]:
        """Columns of the states of one group folded in, the first ``max_details``."""
        states = np.arange(min(store.n_states, self._states_seen))
        ids = states[self._groups(store, states) == group][: self.max_details]
        frame = store.states_frame(ids)
        return {c: frame[c].astype(object).where(frame[c].notna(), None).tolist()
                for c in DETAIL_COLUMNS}


def _short_name(name: str) -> str:
    """What a group's label shows: its task prefix, or a file's name, at most
    :data:`~.map_layout.NAME_CHARS` characters."""
    short = name.rstrip("/").rsplit("/", 1)[-1] if name.startswith("/") else key_label(name)
    return short[:NAME_CHARS]


def _path_edge_columns(sequence: list[int], visible: set[int], x: dict[int, float],
                       y: dict[int, float]) -> dict[str, list]:
    """Columns of the path's edges: each hop of ``sequence`` between groups shown."""
    hops = [(a, b) for a, b in pairwise(sequence) if a in visible and b in visible]
    return {
        "x0": [x[a] for a, _ in hops], "y0": [y[a] for a, _ in hops],
        "x1": [x[b] for _, b in hops], "y1": [y[b] for _, b in hops],
    }


def _states_of(store: PAGStore, end: int, fold: GroupFold, group: int) -> dict[str, list]:
    """:meth:`GroupFold.states_of` by the fold kept where the graph is."""
    return kept(fold).states_of(store, group)


class PAGOverview(Component):
    """The task-group map: nodes are task groups in layers, edges count mutations.

    What it draws is computed by its :class:`GroupFold`.
    """

    def __init__(self, data: Source, max_groups: int = 150, max_edges: int = 300,
                 max_details: int = 500, **kwargs: Any) -> None:
        super().__init__(data)
        self.fold = GroupFold(max_groups, max_edges, max_details)
        self.source = ColumnDataSource({c: [] for c in NODE_COLUMNS})
        self.edges = ColumnDataSource({c: [] for c in ("x0", "y0", "x1", "y1", "count",
                                                       "alpha")})
        self.path_edges = ColumnDataSource({c: [] for c in ("x0", "y0", "x1", "y1")})
        empty = frame(1, 1)
        # Sized to the grid of the groups it shows (see show), not to the page: a label
        # is readable at the grid's pitch in pixels, whatever the page's width.
        self.figure = figure(title="Task groups in layers, the critical path over them "
                             "(click a group for its states)",
                             x_axis_label="layer (data flows left to right)",
                             name="crux-overview", frame_width=empty.width,
                             frame_height=empty.height, x_range=Range1d(*empty.x_range),
                             y_range=Range1d(*empty.y_range),
                             tools="pan,wheel_zoom,tap,reset")
        self.layer_ticker = FixedTicker(ticks=[])
        self.figure.xaxis.ticker = self.layer_ticker
        self.figure.xgrid.ticker = self.layer_ticker
        self.figure.yaxis.visible = False
        self.figure.ygrid.visible = False
        self.figure.add_layout(Legend(label_text_font_size="8pt"), "right")
        self.figure.segment("x0", "y0", "x1", "y1", source=self.edges, line_alpha="alpha",
                            line_color="#888888")
        self.figure.segment("x0", "y0", "x1", "y1", source=self.path_edges,
                            line_color="#d62728", line_width=3, name="crux-overview-path")
        nodes = self.figure.scatter("x", "y", size="size", color="color",
                                    source=self.source, fill_alpha=0.85, line_color="#333333",
                                    legend_field="dominant", name="crux-overview-nodes")
        self.figure.text("x", "y", text="name", source=self.source, text_font_size="8pt",
                         text_align="left", text_baseline="middle", x_offset=LABEL_OFFSET,
                         text_color="#444444")
        self.figure.add_tools(HoverTool(renderers=[nodes], tooltips=[
            ("group", "@label"), ("layer", "@layer"), ("states", "@count"),
            ("bytes", "@bytes{0.0 b}"), ("on the path", "@on_path{0.000} s"),
            ("mostly", "@dominant")]))
        self.details = ColumnDataSource({c: [] for c in DETAIL_COLUMNS})
        self.table = DataTable(source=self.details, height=200, index_position=None,
                               name="crux-overview-states",
                               columns=table_columns(*((c, c) for c in DETAIL_COLUMNS)),
                               **kwargs)
        on_change(self.source.selected, "indices", self._drill_down)
        # A map wider than the page scrolls in its own box; the page keeps its width.
        self.root = column(ScrollBox(child=self.figure, horizontal_scrollbar="auto",
                                     vertical_scrollbar="hidden", **kwargs),
                           self.table, **kwargs)

    @property
    def computer(self) -> GroupFold:
        return self.fold

    def show(self, computed: tuple[dict, dict, dict]) -> None:
        nodes, edges, path_edges = computed
        columns = max(nodes["x"], default=0) + 1
        rows = 2 * max((abs(y) for y in nodes["y"]), default=0.0) + 1
        shape = frame(columns, round(rows))
        plot = self.figure
        if (plot.frame_width, plot.frame_height) != (shape.width, shape.height):
            plot.frame_width, plot.frame_height = shape.width, shape.height
        for axis, (start, end) in ((plot.x_range, shape.x_range), (plot.y_range, shape.y_range)):
            if (axis.start, axis.end) != (start, end):
                axis.update(start=start, end=end, reset_start=start, reset_end=end)
        ticks = layer_ticks(nodes["layer"], nodes["x"])
        if self.layer_ticker.ticks != list(ticks):
            self.layer_ticker.ticks = list(ticks)
            plot.xaxis.major_label_overrides = ticks
        self.source.data = nodes
        self.edges.data = edges
        self.path_edges.data = path_edges

    @log_errors
    def _drill_down(self, attr: str, old: list, new: list) -> None:
        """The individual states of the group clicked (the first ``max_details``), read
        where the graph is."""
        if not new:
            self.details.data = {c: [] for c in DETAIL_COLUMNS}
            return
        group = self.source.data["group"][new[0]]
        asking = asyncio.ensure_future(self.data().analyse(_states_of, self.fold, group))
        document = self.details.document

        def answered(_: asyncio.Future) -> None:
            if document is None:
                self._show_details(asking)
            else:
                document.add_next_tick_callback(lambda: self._show_details(asking))

        asking.add_done_callback(answered)

    def _show_details(self, asking: asyncio.Future) -> None:
        try:
            self.details.data = asking.result()
        except Exception:
            logger.exception("Crux: the states of a group could not be read")
