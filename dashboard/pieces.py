"""Column data sent to the browser in pieces, so that no turn of the event loop encodes much.

Bokeh sends a change of a source's column data as one message, encoded on the
scheduler's event loop: the timeline of the critical path of a million-state
graph (25,000 steps) took 0.15 s to encode.  Two things make that short:

- text goes as numpy string arrays (:func:`text`), which Bokeh hands to
  ``json`` whole, instead of lists, whose strings it encodes one at a time (a
  quarter as fast);
- a long source is set a piece of :data:`PIECE_ROWS` rows per turn of the loop
  (:func:`set_in_pieces`), and a component added to a page is sent without
  its long sources, which follow in pieces (:func:`hold_back`, :func:`release`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any
from weakref import WeakKeyDictionary

import numpy as np
from bokeh.models import ColumnDataSource

__all__ = ["PIECE_ROWS", "hold_back", "release", "set_in_pieces", "text"]

#: Rows of a source sent in one turn of the event loop: 2,000 rows of the critical path's
#: timeline, its widest source, encode in about 5 ms.
PIECE_ROWS = 2000

#: The pieces being sent: source -> the token of the data they belong to.
_sending: WeakKeyDictionary[ColumnDataSource, object] = WeakKeyDictionary()
#: The data of sources held back until they are in a document (see :func:`hold_back`).
_held: WeakKeyDictionary[ColumnDataSource, dict[str, Any]] = WeakKeyDictionary()


def text(values: Iterable[Any]) -> np.ndarray:
    """``values`` as a numpy array of strings (Bokeh sends it as one JSON list).

    A pandas Series is converted whole (missing values become ``""``), not
    read a value at a time.
    """
    if hasattr(values, "to_numpy"):
        values = values.to_numpy(dtype=object, na_value="")
    elif not isinstance(values, (list, np.ndarray)):
        values = list(values)
    return np.asarray(values, dtype=str)


def rows(data: dict[str, Any]) -> int:
    """The number of rows of column data ``data``."""
    return len(next(iter(data.values()), ()))


def set_in_pieces(source: ColumnDataSource, data: dict[str, Any],
                  piece: int | None = None) -> None:
    """Set ``source.data`` to ``data``, columns of equal length.

    A source in no document, or of at most ``piece`` rows (by default
    :data:`PIECE_ROWS`), is set at once.  Else the first row is set now and
    the rest streamed, ``piece`` rows per turn of the event loop, as numpy
    arrays; a later call for the same source stops the pieces of this one.
    On this side text columns are then kept as arrays of objects, so that
    appending a piece copies pointers, not each string at the width of the
    longest.
    """
    _held.pop(source, None)  # newer than what was held back
    document = source.document
    piece = piece or PIECE_ROWS
    length = rows(data)
    if document is None or length <= piece:
        _sending.pop(source, None)
        source.data = data
        return
    data = {name: column if isinstance(column, np.ndarray) else np.asarray(column)
            for name, column in data.items()}
    token = _sending[source] = object()
    source.data = {name: column[:1].astype(object) if column.dtype.kind == "U" else column[:1]
                   for name, column in data.items()}

    def send(start: int) -> None:
        if _sending.get(source) is not token:
            return  # superseded, or the page is gone
        stop = min(start + piece, length)
        source.stream({name: column[start:stop] for name, column in data.items()})
        if stop < length:
            document.add_next_tick_callback(functools.partial(send, stop))
        else:
            del _sending[source]

    document.add_next_tick_callback(functools.partial(send, 1))


def hold_back(sources: Iterable[ColumnDataSource], piece: int | None = None) -> None:
    """Empty those of ``sources`` in no document and longer than ``piece`` rows (by
    default :data:`PIECE_ROWS`), keeping their data for :func:`release`.

    A model added to a document goes to the browser with all its data; a source
    held back goes empty, and :func:`release` sends its rows in pieces after it.
    The sources are named, not looked for among a page's models: finding them
    walks every property of every model, on the event loop.
    """
    for source in sources:
        if source.document is None and rows(source.data) > (piece or PIECE_ROWS):
            data = dict(source.data)
            source.data = {name: column[:0] for name, column in data.items()}
            _held[source] = data


def release(sources: Iterable[ColumnDataSource], piece: int | None = None) -> None:
    """Set, in pieces of ``piece`` rows, what :func:`hold_back` kept of those of
    ``sources`` now in a document, unless newer data was set since."""
    for source in sources:
        if source.document is not None and source in _held:
            data = _held.pop(source)
            if rows(source.data) == 0:  # else set since, directly
                set_in_pieces(source, data, piece)
