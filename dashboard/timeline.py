"""Gantt chart of the critical path: one bar per step, lane per location.

A step released by a freed resource (a thread, a queue slot) is linked to the
step that freed it: a line from where and when that task finished to where and
when this one started.  A step that made a straggler (:mod:`crux_dask.groups`)
carries a triangle over its bar, red for skew, orange for a slow task.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.palettes import Category10
from bokeh.plotting import figure
from bokeh.transform import dodge, factor_cmap

from crux_dask.dashboard.component import Component
from crux_dask.dashboard.data import GraphView, Source
from crux_dask.dashboard.pieces import set_in_pieces, text
from crux_dask.model import CauseKind, MutationKind
from crux_dask.path import PARTS

KIND_COLORS = dict(zip([k.name for k in (*MutationKind, *CauseKind)], Category10[8]))
#: A bar's lane is its step's destination.
COLUMNS = ("left", "right", "wait_left", "kind", "via", "key", "label", "size", "source",
           "destination", "busy", "io", *PARTS[1:], "start", "stop", "straggler",
           "slowdown", "bytes_ratio", "mark")
TEXT = ("kind", "via", "key", "label", "source", "destination", "straggler")
#: The colour of the mark over a straggler's bar, by its kind.
STRAGGLER_COLORS = {"skew": "#d62728", "slow": "#ff7f0e"}
#: The size of that mark, in pixels.
MARK_SIZE = 12
LINKS = ("x0", "y0", "x1", "y1", "kind", "via")


def timeline_columns(view: GraphView) -> tuple[list, dict, dict]:
    """The lanes, the bars and the links of the path of ``view``, as numpy arrays (numbers
    go to the browser in binary, text as one list: see :mod:`.pieces`)."""
    path = view.wcp()
    steps = path.to_frame()
    t0 = float(path.states["time"].iloc[0]) if len(path.states) else 0.0
    stop = steps["stop"].to_numpy() - t0
    data = {
        "left": stop - steps["busy"].to_numpy() - steps["io"].to_numpy(),
        "right": stop,
        "wait_left": stop - steps["cost"].to_numpy(),
        **{c: text(steps[c]) for c in TEXT},
        **{c: steps[c].to_numpy() for c in ("size", "busy", *PARTS, "start", "stop",
                                            "slowdown", "bytes_ratio")},
        "mark": np.where(steps["straggler"].to_numpy(object) != "", MARK_SIZE, 0),
    }
    handoff = data["via"] != "data"
    links = {
        "x0": data["wait_left"][handoff],
        "y0": data["source"][handoff],
        "x1": data["start"][handoff] - t0,
        "y1": data["destination"][handoff],
        "kind": data["kind"][handoff],
        "via": data["via"][handoff],
    }
    return sorted(set(data["destination"].tolist())), data, links


class WCPTimeline(Component):
    """The critical path's steps as bars: the busy part and its io solid, the wait a line."""

    computer = staticmethod(timeline_columns)

    def __init__(self, data: Source, **kwargs: Any) -> None:
        super().__init__(data)
        self.source = ColumnDataSource({c: [] for c in COLUMNS})
        self.links = ColumnDataSource({c: [] for c in LINKS})
        self.root = figure(title="Workflow critical path", y_range=FactorRange(),
                           x_axis_label="seconds since the path's start", name="crux-timeline",
                           tools="xpan,xwheel_zoom,reset", height=300, **kwargs)
        lanes = self.root.y_range
        # Colours are mapped in the browser: no column of them to send.
        color = factor_cmap("kind", list(KIND_COLORS.values()), list(KIND_COLORS))
        self.bars = self.root.quad(left="left", right="right",
                                   top=dodge("destination", 0.35, range=lanes),
                                   bottom=dodge("destination", -0.35, range=lanes),
                                   color=color, source=self.source, legend_field="kind",
                                   name="crux-timeline-bars")
        self.root.segment(x0="wait_left", x1="left", y0="destination", y1="destination",
                          line_dash="dotted", line_color=color, source=self.source)
        self.root.segment(x0="x0", y0="y0", x1="x1", y1="y1", line_color=color,
                          line_width=2, source=self.links, name="crux-timeline-links")
        self.root.scatter(x="right", y=dodge("destination", 0.45, range=lanes),
                          marker="inverted_triangle", size="mark", source=self.source,
                          color=factor_cmap("straggler", list(STRAGGLER_COLORS.values()),
                                            list(STRAGGLER_COLORS)),
                          name="crux-timeline-stragglers")
        self.root.add_tools(HoverTool(renderers=[self.bars], tooltips=[
            ("step", "@kind @label"), ("released by", "@via"), ("key", "@key"),
            ("size", "@size{0.0 b}"), ("from", "@source"), ("to", "@destination"),
            ("busy", "@busy{0.000} s"),
            *((part, f"@{part}{{0.000}} s") for part in PARTS),
            ("straggler", "@straggler @slowdown{0.0}x its group's median seconds, "
                          "@bytes_ratio{0.0}x its bytes")]))
        self.root.legend.location = "top_left"

    @property
    def sources(self) -> list[ColumnDataSource]:
        return [self.source, self.links]

    def show(self, computed: tuple[list, dict, dict]) -> None:
        lanes, bars, links = computed
        self.root.y_range.factors = lanes
        set_in_pieces(self.source, bars)
        set_in_pieces(self.links, links)
