"""Workflow critical paths over a program activity graph.

State times telescope: along any path from ``A`` to ``B`` the mutation costs add
up to ``B.time - A.time``, so the longest path *by cost* says nothing.  Two
well-defined answers instead:

``observed``
    Walk back from the end state, at each state taking the input that became
    available last (Jaeger's "last-finishing child").  Inputs are ranked by
    their *ready* time: a copy moved from another worker counts as ready its
    transfer's duration after its source was, because Dask starts moving an
    input only once its consumer can run, and the wait before the move belongs
    to the input that made the consumer ready.  Each state keeps its
    last-ready input incrementally, so the walk is O(path length).
``longest``
    The chain of mutations with the largest total ``busy`` time: the
    irreducible work, a lower bound on the makespan with unlimited workers.
    One pass over the mutations in topological order, O(V + E).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from crux_dask.build import rules
from crux_dask.model import MutationKind, location_class
from crux_dask.store import PAGStore

__all__ = ["METHODS", "CriticalPath", "critical_path", "longest_path", "observed_path"]

METHODS = ("observed", "longest")
#: Categories of the breakdown, in display order.
CATEGORIES = ("compute", "transfer", "spill", "io", "delete", "wait")


def observed_path(store: PAGStore, end: int, start: int | None = None) -> list[int]:
    """Mutation ids of the last-arriving chain ending at ``end``, in path order.

    Parameters
    ----------
    store : PAGStore
    end : int
        The state the path ends at.
    start : int, optional
        The state the path must start at.  Without it the walk stops at a state
        with no inputs (a root).  With it, only inputs that descend from
        ``start`` are followed, which costs one pass over the graph.

    Raises
    ------
    ValueError
        If ``end`` does not descend from ``start``.
    """
    if start is None:
        pred, src = store.state_pred, store.mutation_src
        path = []
        mid = pred[end]
        while mid >= 0:
            path.append(mid)
            mid = pred[src[mid]]
        path.reverse()
        return path

    reach = _descendants(store, start)
    if not reach[end]:
        raise ValueError(f"state {end} does not descend from state {start}")
    src = store.column("mutation_src")
    dst = store.column("mutation_dst")
    ready = store.column("state_ready")
    useful = np.flatnonzero(reach[src] & (dst <= end))
    best = rules.last_arriving_per_target(ready[src[useful]], useful, dst[useful],
                                          store.n_states)
    path = []
    state = end
    while state != start:
        mid = int(best[state])
        path.append(mid)
        state = int(src[mid])
    path.reverse()
    return path


def longest_path(store: PAGStore, start: int | None = None, end: int | None = None
                 ) -> list[int]:
    """Mutation ids of the path with the largest total ``busy``, in path order.

    Without ``start`` the path may begin anywhere; without ``end`` it ends
    wherever the total is largest (the first such state on ties).

    Raises
    ------
    ValueError
        If ``end`` does not descend from ``start``.
    """
    n = store.n_states
    src = store.column("mutation_src")
    dst = store.column("mutation_dst")
    busy = store.column("mutation_busy")
    order = np.argsort(dst, kind="stable")  # topological: ids only grow along edges
    if start is None:
        best = [0.0] * n
    else:
        best = [-np.inf] * n
        best[start] = 0.0
    via = [-1] * n
    for mid, s, d, b in zip(order.tolist(), src[order].tolist(), dst[order].tolist(),
                            busy[order].tolist()):
        candidate = best[s] + b
        if candidate > best[d]:
            best[d] = candidate
            via[d] = mid
    if end is None:
        end = int(np.argmax(best)) if n else -1
    if end < 0:
        return []
    if best[end] == -np.inf:
        raise ValueError(f"state {end} does not descend from state {start}")
    path = []
    mid = via[end]
    while mid >= 0 and (start is None or dst[mid] != start):
        path.append(mid)
        mid = via[src[mid]]
    path.reverse()
    return path


def _descendants(store: PAGStore, start: int) -> np.ndarray:
    """Boolean mask of the states reachable from ``start`` (itself included)."""
    src = store.column("mutation_src")
    dst = store.column("mutation_dst")
    order = np.argsort(dst, kind="stable")
    reach = [False] * store.n_states
    reach[start] = True
    for s, d in zip(src[order].tolist(), dst[order].tolist()):
        if reach[s]:
            reach[d] = True
    return np.array(reach, dtype=bool)


def critical_path(store: PAGStore, start: int | None = None, end: int | None = None,
                  method: str = "observed", default_end: int = -1) -> CriticalPath:
    """The critical path of ``store`` between two states.

    Parameters
    ----------
    store : PAGStore
    start, end : int, optional
        State ids.  ``end`` defaults to ``default_end`` for ``observed`` (the
        run's latest state that is not a tombstone).
    method : {"observed", "longest"}
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    for name, value in (("start", start), ("end", end)):
        if value is not None and not 0 <= value < store.n_states:
            raise ValueError(f"{name} state {value} is not in the graph "
                             f"(0 to {store.n_states - 1})")
    if method == "observed":
        end = default_end if end is None else end
        mids = observed_path(store, end, start) if end >= 0 else []
    else:
        mids = longest_path(store, start, end)
    return CriticalPath.from_store(store, mids, method, single=end if not mids else None)


@dataclass
class CriticalPath:
    """A critical path: ordered states and the mutations between them.

    Attributes
    ----------
    states : pandas.DataFrame
        The states along the path, first to last (data-state columns).
    mutations : pandas.DataFrame
        The mutations along the path, in order (data-mutation columns, plus
        ``category`` and ``wait``: the part of ``cost`` that was not busy).
    method : str
        ``"observed"`` or ``"longest"``.
    length : float
        Seconds from the first state to the last.
    breakdown : dict
        Seconds of the path by category: ``compute``, ``transfer``, ``spill``,
        ``io``, ``delete`` (the busy part of each mutation) and ``wait`` (the
        rest).  The values add up to ``length``.
    """

    states: pd.DataFrame
    mutations: pd.DataFrame
    method: str
    length: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)
    _frame: pd.DataFrame | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_store(cls, store: PAGStore, mutation_ids: list[int], method: str,
                   single: int | None = None) -> CriticalPath:
        mids = np.asarray(mutation_ids, dtype="int64")
        mutations = store.mutations_frame(mids).reset_index(drop=True)
        if len(mids):
            sids = np.concatenate([mutations["src"].to_numpy()[:1],
                                   mutations["dst"].to_numpy()])
        else:
            sids = np.asarray([] if single is None or single < 0 else [single], "int64")
        states = store.states_frame(sids).reset_index(drop=True)
        location = states["location"].tolist()
        categories = [
            _category(kind, location[i], location[i + 1])
            for i, kind in enumerate(mutations["kind"].tolist())
        ]
        cost = mutations["cost"].to_numpy()
        busy = np.minimum(np.maximum(mutations["busy"].to_numpy(), 0.0),
                          np.maximum(cost, 0.0))
        breakdown = dict.fromkeys(CATEGORIES, 0.0)
        for category, seconds in zip(categories, busy.tolist()):
            breakdown[category] += seconds
        breakdown["wait"] = float(cost.sum() - busy.sum())
        length = float(states["time"].iloc[-1] - states["time"].iloc[0]) if len(states) else 0.0
        mutations["category"] = pd.Series(categories, dtype="str")
        mutations["wait"] = cost - busy
        return cls(states, mutations, method, length, breakdown)

    def __len__(self) -> int:
        return len(self.mutations)

    def to_frame(self) -> pd.DataFrame:
        """One row per step: what happened, where, when, and how long was busy or waiting.

        The frame is built once and shared: treat it as read-only.
        """
        if self._frame is None:
            self._frame = self._steps()
        return self._frame

    def _steps(self) -> pd.DataFrame:
        m = self.mutations
        s = self.states
        return pd.DataFrame(
            {
                "step": np.arange(len(m)),
                "mutation_id": m["mutation_id"],
                "kind": m["kind"],
                "category": m["category"],
                "key": m["key"],
                "label": s["label"].iloc[1:].reset_index(drop=True),
                "source": s["location"].iloc[:-1].reset_index(drop=True),
                "destination": s["location"].iloc[1:].reset_index(drop=True),
                "size": s["size"].iloc[1:].reset_index(drop=True),
                "start": m["start"],
                "stop": m["stop"],
                "cost": m["cost"],
                "busy": m["cost"] - m["wait"],
                "wait": m["wait"],
            }
        )

    def summary(self) -> str:
        """A few lines of text: length, steps and the breakdown."""
        lines = [f"Workflow critical path ({self.method}): {self.length:.3f} s "
                 f"in {len(self)} steps"]
        for category, seconds in self.breakdown.items():
            share = seconds / self.length if self.length > 0 else 0.0
            lines.append(f"  {category:<9} {seconds:9.3f} s  {share:6.1%}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{v:.3f} s</td></tr>"
            for k, v in self.breakdown.items()
        )
        table = self.to_frame().to_html(index=False, max_rows=50)
        return (
            f"<div><strong>Workflow critical path ({html.escape(self.method)})</strong>: "
            f"{self.length:.3f} s in {len(self)} steps"
            f"<table><tr><th>category</th><th>seconds</th></tr>{rows}</table>{table}</div>"
        )


def _category(kind: str, source: str, destination: str) -> str:
    if kind == MutationKind.DELETE.name:
        return "delete"
    if kind != MutationKind.TRANSFER.name:
        return "compute"
    classes = {location_class(source), location_class(destination)}
    if "disk" in classes:
        return "spill"
    if "file" in classes:
        return "io"
    return "transfer"
