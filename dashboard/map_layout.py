"""Where the task-group map puts each group, in pixels that keep every label readable.

The map is laid out on a grid of fixed pitch: columns :data:`COLUMN_PX` apart,
rows :data:`ROW_PX` apart.  Each layer takes one column, or as few columns side
by side as hold it at :data:`ROWS_PER_COLUMN` rows each; the layers after it move
right to make room.  A node is at most :data:`NODE_PX` across, and its label
(at most :data:`NAME_CHARS` characters of 8pt text) starts just right of it.
The pitch is chosen so that, whatever the graph, a label ends before the next
column's nodes begin and stays within its own row: the figure's frame is sized
to the grid (:func:`frame`) rather than the grid stretched to the frame.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["COLUMN_PX", "LABEL_OFFSET", "NAME_CHARS", "NODE_PX", "ROWS_PER_COLUMN", "ROW_PX",
           "Frame", "frame", "layer_ticks", "node_px", "positions"]

#: Most groups a column holds before its layer takes another column beside it.
ROWS_PER_COLUMN = 10
#: Pixels between two rows: a node (:data:`NODE_PX`) and a line of 8pt text (about
#: 11 px), each centred on its row, with room between them and the next row's.
ROW_PX = 26
#: Pixels between two columns: a label's offset, its longest name (:data:`NAME_CHARS`
#: characters of 8pt sans-serif, at most about 6 px each) and half a node, with room.
COLUMN_PX = 150
#: The widest a node is drawn, in pixels.
NODE_PX = 20
#: Pixels from a node's centre to the start of its label.
LABEL_OFFSET = NODE_PX // 2 + 3
#: The most characters of a group's name its label shows (the hover shows it whole).
NAME_CHARS = 18
#: Room, in columns and rows, around the grid: on the right for the last column's
#: labels, elsewhere for half a node.
PAD_LEFT, PAD_RIGHT, PAD_ROWS = 0.5, 0.9, 0.6


def positions(ordered: Sequence[int], layer: dict[int, int],
              rows_per_column: int = ROWS_PER_COLUMN
              ) -> tuple[dict[int, int], dict[int, float]]:
    """Each group's place on the grid: its column across, and its row, centred on zero.

    Parameters
    ----------
    ordered : sequence of int
        The groups to place, in the order they fill a layer: each column
        from the top down, then the next column to the right.
    layer : dict
        Group -> its layer.
    rows_per_column : int
        The most groups a column holds: a layer of more is split into as
        few columns as hold it, of as many groups each as can be.

    Returns
    -------
    x, y : dict
        Group -> its column (consecutive from 0) and its row.
    """
    members: dict[int, list[int]] = defaultdict(list)
    for group in ordered:
        members[layer[group]].append(group)
    x: dict[int, int] = {}
    y: dict[int, float] = {}
    at = 0
    for depth in sorted(members):
        groups = members[depth]
        columns = -(-len(groups) // rows_per_column)
        rows = -(-len(groups) // columns)
        for column in range(columns):
            stacked = groups[column * rows:(column + 1) * rows]
            for rank, group in enumerate(stacked):
                x[group], y[group] = at + column, (len(stacked) - 1) / 2 - rank
        at += columns
    return x, y


class Frame(NamedTuple):
    """The map's frame for a grid: its size in pixels and the ranges it shows."""

    width: int
    height: int
    x_range: tuple[float, float]
    y_range: tuple[float, float]


def frame(columns: int, rows: int) -> Frame:
    """The frame that shows a grid of ``columns`` × ``rows`` at its fixed pitch."""
    columns, rows = max(columns, 1), max(rows, 1)
    x_range = (-PAD_LEFT, columns - 1 + PAD_RIGHT)
    half = (rows - 1) / 2 + PAD_ROWS
    return Frame(round((x_range[1] - x_range[0]) * COLUMN_PX), round(2 * half * ROW_PX),
                 x_range, (-half, half))


def node_px(nbytes: float) -> float:
    """A node's size in pixels for its group's bytes: 6 for a byte, 1.5 more for each
    power of ten, at most :data:`NODE_PX` (about 10 GB)."""
    return min(6.0 + 1.5 * math.log10(max(nbytes, 1.0)), float(NODE_PX))


def layer_ticks(layers: Sequence[int], x: Sequence[int]) -> dict[float, str]:
    """Where the map's axis marks each layer (the middle of its columns), and its number.

    Parameters
    ----------
    layers, x : sequence
        The layer of each node, and its column.
    """
    extent: dict[int, tuple[int, int]] = {}
    for depth, where in zip(layers, x, strict=True):
        low, high = extent.get(depth, (where, where))
        extent[depth] = (min(low, where), max(high, where))
    return {(low + high) / 2: str(depth) for depth, (low, high) in sorted(extent.items())}
