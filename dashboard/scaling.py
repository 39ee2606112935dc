"""How many workers are enough, drawn: the run's predicted makespan on each cluster shape."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from bokeh.layouts import column
from bokeh.models import ColumnDataSource, Div, HoverTool, Span
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from crux_dask.advice import SCALING_SHAPES

if TYPE_CHECKING:
    from crux_dask.scaling import Scaling

#: The columns of each line's source: one point per shape.
POINTS = ("total", "workers", "threads", "predicted", "low", "high", "change")


class ScalingPlot:
    """The predicted makespan against the threads in all, a line per number of threads
    per worker (:data:`~crux_dask.advice.SCALING_SHAPES`), each point's range where the
    run does not tell whether a label holds the GIL, the shape that is enough marked
    and the recorded run dashed.

    Set by :meth:`show` (on the event loop) from what
    :func:`~crux_dask.advice.fixes` computed elsewhere.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.lines = {threads: ColumnDataSource({c: [] for c in POINTS})
                      for threads in SCALING_SHAPES[1]}
        self.enough = ColumnDataSource({c: [] for c in POINTS})
        self.recorded = Span(location=0, dimension="width", line_dash="dashed",
                             line_color="gray", visible=False)
        self.figure = figure(name="crux-scaling", height=260, tools="",
                             x_axis_label="threads in all (workers × threads per worker)",
                             y_axis_label="predicted makespan (s)", **kwargs)
        points = []
        for i, (threads, source) in enumerate(self.lines.items()):
            color = Category10_10[i % len(Category10_10)]
            name = f"{threads} thread{'s' * (threads > 1)} per worker"
            self.figure.line("total", "predicted", source=source, color=color,
                             legend_label=name)
            self.figure.segment("total", "low", "total", "high", source=source, color=color,
                                line_width=3, alpha=0.4)
            points.append(self.figure.scatter("total", "predicted", source=source, size=7,
                                              color=color, legend_label=name))
        points.append(self.figure.scatter("total", "predicted", source=self.enough, size=16,
                                          marker="star", color="black", legend_label="enough"))
        self.figure.add_layout(self.recorded)
        self.figure.legend.location = "top_right"
        self.figure.add_tools(HoverTool(renderers=points, tooltips=[
            ("shape", "@workers × @threads"), ("predicted", "@predicted{0.000} s"),
            ("range", "@low{0.000}–@high{0.000} s"), ("change", "×@change{0.00}")]))
        self.note = Div(text="", name="crux-scaling-note")
        self.root = column(Div(text="<b>How many workers are enough</b>: the run replayed "
                                    "on each cluster shape; the dashed line is the run as "
                                    "recorded"), self.note, self.figure, **kwargs)

    def show(self, scaling: Scaling | None) -> None:
        """Draw ``scaling``, or nothing (a run that cannot be replayed)."""
        table = None if scaling is None else scaling.table.assign(
            total=scaling.table["workers"] * scaling.table["threads"])
        for threads, source in self.lines.items():
            shown = None if table is None else table[table["threads"] == threads]
            source.data = _points(shown)
        self.enough.data = _points(None if table is None else table[table["enough"]])
        self.recorded.visible = scaling is not None
        if scaling is not None:
            self.recorded.location = scaling.recorded
        self.note.text = "" if scaling is None else html.escape(scaling.summary())


def _points(table: Any) -> dict[str, list]:
    """The columns of :data:`POINTS` of ``table``'s rows (none for None)."""
    if table is None:
        return {c: [] for c in POINTS}
    return {c: table[c].tolist() for c in POINTS}
