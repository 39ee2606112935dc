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


def states_json(store: PAGStore, end: int, start_time: float | None,
                end_time: float | None, wanted: dict[str, str], offset: int,
                limit: int) -> Pieces:
    """The JSON of a page of the states: those between ``start_time`` and ``end_time``
    whose ``key``, ``location`` or ``origin`` is as ``wanted``."""
    mask = np.ones(store.n_states, dtype=bool)
    if start_time is not None or end_time is not None:
        time = store.column("state_time")
        mask &= time >= (start_time if start_time is not None else -np.inf)
        mask &= time <= (end_time if end_time is not None else np.inf)
    for name, table, column, via_key in (
            ("key", store.keys, "state_key", False),
            ("location", store.locations, "state_location", False),
            ("origin", store.labels, "key_origin", True)):
        if name not in wanted:
            continue
        codes = [i for i, v in enumerate(table.values) if v == wanted[name]]
        values = store.column(column)
        if via_key:
            values = values[store.column("state_key")]
        mask &= np.isin(values, codes)
    ids = np.flatnonzero(mask)
    return _page_json(ids, offset, limit, "states", store.states_frame)


def mutations_json(store: PAGStore, end: int, kind: int | None, offset: int,
                   limit: int) -> Pieces:
    """The JSON of a page of the mutations, of one ``kind`` (its code) if given."""
    ids = np.arange(store.n_mutations)
    if kind is not None:
        ids = ids[store.column("mutation_kind") == kind]
    return _page_json(ids, offset, limit, "mutations", store.mutations_frame)


def state_json(store: PAGStore, end: int, state_id: int) -> Pieces | None:
    """The JSON of one state; ``None`` if there is no such state."""
    if state_id >= store.n_states:
        return None
    return Pieces.cut(json.dumps(records(store.states_frame(np.array([state_id])))[0],
                                 default=plain).encode())


def _page_json(ids: np.ndarray, offset: int, limit: int, name: str,
               frame: Callable[[np.ndarray], pd.DataFrame]) -> Pieces:
    return Pieces.cut(json.dumps({"total": len(ids), "offset": offset, "limit": limit,
                                  name: records(frame(ids[offset:offset + limit]))},
                                 default=plain).encode())
