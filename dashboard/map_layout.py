"""Where the task-group map puts each group: its layer across, its rank down the layer.

A layer of more groups than fit the map's height is split into columns side by
side, each of at most :data:`ROWS_PER_COLUMN` rows, and the layers after it move
right to make room, so that each node's label stays clear of the node above and
below it.  A layer that fits keeps one column, at its layer's number when no
layer before it was split.  Labels go above the nodes of one column and below
those of the next, so that long labels side by side do not meet.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

#: The map's height in pixels: its frame, between the title and the axis, about 290.
MAP_HEIGHT = 360
#: Rows a column of the map holds: a row of about 45 px keeps a label (8pt, 12 px tall,
#: 12 px off its node) clear of the next node.
ROWS_PER_COLUMN = 6
#: Room, in rows, above the top row and below the bottom one, for their labels.
ROW_PADDING = 0.75
#: Pixels from a node's centre to its label's.
LABEL_OFFSET = 18


def positions(ordered: Sequence[int], layer: dict[int, int],
              rows_per_column: int = ROWS_PER_COLUMN
              ) -> tuple[dict[int, float], dict[int, float]]:
    """Each group's place: its layer's column across, and its row, centred on zero.

    Parameters
    ----------
    ordered : sequence of int
        The groups to place, in the order they fill a layer: each column
        from the bottom up, then the next column to the right.
    layer : dict
        Group -> its layer.
    rows_per_column : int
        The most groups a column holds: a layer of more is split into as
        few columns as hold it, of as many groups each as can be.

    Returns
    -------
    x, y : dict
        Group -> where it is across (a column; the columns of a layer are
        one apart, as the layers are) and down.
    """
    members: dict[int, list[int]] = defaultdict(list)
    for group in ordered:
        members[layer[group]].append(group)
    x: dict[int, float] = {}
    y: dict[int, float] = {}
    shift = 0
    for depth in sorted(members):
        groups = members[depth]
        columns = -(-len(groups) // rows_per_column)
        rows = -(-len(groups) // columns)
        for column in range(columns):
            stacked = groups[column * rows:(column + 1) * rows]
            for rank, group in enumerate(stacked):
                x[group], y[group] = depth + shift + column, rank - (len(stacked) - 1) / 2
        shift += columns - 1
    return x, y


def layer_ticks(layers: Sequence[int], x: Sequence[float]) -> dict[float, str]:
    """Where the map's axis marks each layer (the middle of its columns), and its number.

    Parameters
    ----------
    layers, x : sequence
        The layer of each node, and where it is across.
    """
    extent: dict[int, tuple[float, float]] = {}
    for depth, where in zip(layers, x, strict=True):
        low, high = extent.get(depth, (where, where))
        extent[depth] = (min(low, where), max(high, where))
    return {(low + high) / 2: str(depth) for depth, (low, high) in sorted(extent.items())}


def label_offset(x: float) -> int:
    """Pixels down from a node to its label's middle: above the nodes of the even
    columns, below those of the odd ones."""
    return LABEL_OFFSET if int(x) % 2 else -LABEL_OFFSET
