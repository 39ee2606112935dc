"""The JSON of the API's answers: plain values, records, and long bodies cut in pieces.

The JSON of a long path or table is made where it is computed (see
:meth:`~crux_dask.plugins.CruxSchedulerPlugin.analyse`), not on the event loop,
and sent in pieces: tens of megabytes for a long path, which the loop would
otherwise receive, encode and write in one call each.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from crux_dask.plugins.scopes import scopes_table
from crux_dask.plugins.staging import Pieces

if TYPE_CHECKING:
    import pandas as pd

    from crux_dask.path import CriticalPath
    from crux_dask.store import PAGStore


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it: a numpy scalar's value, ``None`` for NaN, else text."""
    if isinstance(value, np.generic):
        return value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def records(frame: pd.DataFrame) -> list[dict]:
    """The rows of ``frame`` as JSON objects, ``None`` where a value is missing."""
    frame = frame.astype(object).where(frame.notna(), None)
    return frame.to_dict(orient="records")


def path_json(store: PAGStore, end: int, method: str, function: Callable[..., CriticalPath],
              *args: Any) -> Pieces:
    """The JSON of the path ``function(store, end, *args)`` found by ``method``."""
    path = function(store, end, *args)
    return Pieces.cut(json.dumps({"method": method, "length": path.length,
                                  "breakdown": path.breakdown,
                                  "states": records(path.states),
                                  "steps": records(path.to_frame())},
                                 default=plain).encode())


def computations_json(store: PAGStore, end: int, scopes: list) -> Pieces:
    """The JSON of the table of computations and spans (:func:`scopes_table`)."""
    return Pieces.cut(json.dumps({"computations": records(scopes_table(store, end, scopes))},
                                 default=plain).encode())
