"""The parts of a run a user names: computations and spans, and the path of each.

A session runs many computations on one cluster, and users mark stages of
their work with spans; the graph spans them all.  A :class:`Scope` is one such
part, as the scheduler describes it: when it began and ended, and the task
groups it holds.  A state belongs to a scope when its key's task group is one
of the scope's and it was made within the scope's time (group names repeat
when the same code runs twice; its time tells the runs apart).

The path of a scope is the critical path that ends at the last state its tasks
made, cut where it leaves the scope's time: the walk may still go through a
task of an earlier computation (the data it persisted, the thread it held),
and such steps say so (``in_scope`` is false).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from crux_dask.model import MutationKind
from crux_dask.path import CATEGORIES, CriticalPath
from crux_dask.store import PAGStore
from crux_dask.wcp import critical_path

# pandas is imported where frames are made: a scheduler loads this module as it
# starts, and importing pandas takes a quarter of a second.
if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SCOPE_COLUMNS", "Scope", "members", "scope_path", "scopes_frame", "select"]

#: Columns of :func:`scopes_frame`.
SCOPE_COLUMNS = ("kind", "id", "name", "parent", "start", "stop", "makespan", "tasks",
                 "path_length", "top_categories")
#: Seconds a state may end after its scope's stop and still belong to it (the
#: scheduler's stop and the states' times come through different clocks).
SLACK = 0.01
#: What makes a state by computing it: the kinds of a task's mutation.
_COMPUTED = np.array([int(k) for k in (MutationKind.APPEND, MutationKind.CONVERT,
                                        MutationKind.MERGE, MutationKind.SPLIT)])


@dataclass(frozen=True)
class Scope:
    """One computation or span of a run.

    Attributes
    ----------
    kind : str
        ``"computation"`` or ``"span"``.
    id : str
        The scheduler's id of it.
    name : str
        A span's tags joined by ``/``; a computation's line of code.
    start, stop : float
        When it was submitted, and when its last task finished (the scheduler's clock).
    groups : frozenset of str
        Names of its task groups (a span's include its children's).
    parent : str or None
        The id of the span it is part of.
    """

    kind: str
    id: str
    name: str
    start: float
    stop: float
    groups: frozenset[str]
    parent: str | None = None


def select(scopes: Sequence[Scope], computation: int | None = None,
           span: str | None = None) -> Scope:
    """The scope a user asks for: a computation by index, or a span by id or name.

    Parameters
    ----------
    scopes : sequence of Scope
        Computations and spans, oldest first.
    computation : int, optional
        Index among the computations (``-1``: the latest).
    span : str, optional
        A span's id, its name (tags joined by ``/``) or its last tag; the
        newest span of that name, an exact id or name before a last tag.

    Raises
    ------
    ValueError
        If neither or both are given, or nothing matches.
    """
    if (computation is None) == (span is None):
        raise ValueError("give one of computation or span")
    if computation is not None:
        found = [s for s in scopes if s.kind == "computation"]
        try:
            return found[int(computation)]
        except (IndexError, TypeError, ValueError):
            raise ValueError(f"no computation {computation!r}: {len(found)} recorded") from None
    found = [s for s in scopes if s.kind == "span"]
    exact = [s for s in found if span in (s.id, s.name)]
    matching = exact or [s for s in found if s.name.rsplit("/", 1)[-1] == span]
    if not matching:
        raise ValueError(f"no span {span!r}; spans: "
                         + (", ".join(sorted({s.name for s in found})) or "none"))
    return max(matching, key=lambda s: s.start)


def members(store: PAGStore, scope: Scope, groups: np.ndarray,
            computed_only: bool = True) -> np.ndarray:
    """Ids of the states of ``scope``: those its tasks computed (or, also, moved).

    Parameters
    ----------
    store : PAGStore
    scope : Scope
    groups : ndarray
        The task group of each key (:func:`~crux_dask.groups.key_groups`).
    computed_only : bool
        Only states made by computing a task, not copies, spills or releases.
    """
    key_in = np.isin(groups, list(scope.groups))
    if not key_in.any():
        return np.zeros(0, np.int64)
    time = store.column("state_time")
    chosen = key_in[store.column("state_key")] & (time >= scope.start) & (
        time <= scope.stop + SLACK)
    pred = store.column("state_pred")
    made = pred >= 0
    kind = np.full(store.n_states, -1, np.int64)
    kind[made] = store.column("mutation_kind", pred[made])
    chosen &= np.isin(kind, _COMPUTED) if computed_only else (
        kind != int(MutationKind.DELETE))
    return np.flatnonzero(chosen)


def scope_path(store: PAGStore, scope: Scope, groups: np.ndarray,
               method: str = "observed") -> CriticalPath:
    """The critical path of ``scope``: to the last state its tasks made, from its start.

    Steps that end before the scope's start are cut, and the first step is
    clipped at it (:meth:`CriticalPath.clipped`), so the path's length is at
    most the scope's makespan.  The steps have one more column, ``in_scope``:
    whether the step made a state of one of the scope's task groups.

    Raises
    ------
    ValueError
        If no state of the graph belongs to ``scope``.
    """
    states = members(store, scope, groups)
    if not len(states):
        raise ValueError(f"no state of the graph belongs to {scope.kind} {scope.name!r}")
    end = int(states[np.argmax(store.column("state_time", states))])
    path = critical_path(store, None, end, method)
    steps = path.steps
    if len(steps):
        made_at = store.column("state_time", steps["dst"].to_numpy())
        keep = made_at >= scope.start
        keep[-1] = True  # the step that made the end is the scope's, whatever the clocks
        first = int(np.argmax(keep))
        if first:
            through_cause = (steps["via"] != "data").to_numpy()
            ids = np.where(through_cause, steps["cause_id"], steps["mutation_id"])
            path = CriticalPath.from_store(
                store, (through_cause[first:], ids[first:].astype(np.int64)), method)
    path = path.clipped(scope.start)
    path.steps["in_scope"] = np.isin(
        groups[store.column("state_key", path.steps["dst"].to_numpy())], list(scope.groups))
    return path


def scopes_frame(store: PAGStore, scopes: Sequence[Scope], groups: np.ndarray) -> pd.DataFrame:
    """One row per scope: :data:`SCOPE_COLUMNS`.

    ``tasks`` counts the states its tasks computed; ``path_length`` and
    ``top_categories`` (up to three, as ``"compute 61 %"``, most first) are
    those of its path, empty where none of its states was recorded.
    """
    import pandas as pd
    rows = []
    for scope in scopes:
        tasks = len(members(store, scope, groups))
        length, top = float("nan"), ""
        if tasks:
            path = scope_path(store, scope, groups)
            length = path.length
            ranked = sorted(((seconds, c) for c, seconds in path.breakdown.items()
                             if seconds > 0 and c in CATEGORIES), reverse=True)[:3]
            top = "; ".join(f"{c} {seconds / length:.0%}" for seconds, c in ranked
                            ) if length > 0 else ""
        rows.append((scope.kind, scope.id, scope.name, scope.parent, scope.start, scope.stop,
                     scope.stop - scope.start, tasks, length, top))
    return pd.DataFrame(rows, columns=list(SCOPE_COLUMNS)).astype(
        {"tasks": "int64", "start": "float64", "stop": "float64", "makespan": "float64",
         "path_length": "float64"})
