"""The scheduler's computations and spans, as :class:`~crux_dask.scopes.Scope` objects.

Every ``compute`` or ``persist`` is a computation (``Scheduler.computations``,
the newest ``distributed.diagnostics.computations.max-history``); stages a user
marks with ``distributed.span`` are spans, which nest.  Both name their task
groups, which is how the graph's states are matched to them.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from crux_dask.groups import key_groups
from crux_dask.plugins.staging import Pieces
from crux_dask.scopes import Scope, scope_path, scopes_frame
from crux_dask.wcp import critical_path

if TYPE_CHECKING:
    import pandas as pd
    from distributed import Scheduler

    from crux_dask.path import CriticalPath
    from crux_dask.store import PAGStore

__all__ = ["computations", "path_of_graph", "path_of_scope", "scopes_table",
           "spans"]

def computations(scheduler: Scheduler) -> list[Scope]:
    """The computations the scheduler remembers, oldest first.

    Each is named by the line of code that submitted it, where Dask recorded
    it (``distributed.diagnostics.computations.nframes`` > 0), else by its
    task prefixes.
    """
    return [Scope("computation", str(c.id), _code_line(c.code) or _prefixes(c.groups),
                  c.start, c.stop, frozenset(tg.name for tg in c.groups))
            for c in scheduler.computations if c.groups]


def spans(scheduler: Scheduler) -> list[Scope]:
    """Every span the scheduler knows, parents before their children."""
    extension = scheduler.extensions.get("spans")
    if extension is None:
        return []
    found = []
    for span in extension.spans.values():
        groups = frozenset(tg.name for tg in span.traverse_groups())
        if not groups:
            continue
        parent = span.parent
        found.append(Scope("span", str(span.id), "/".join(map(str, span.name)),
                           span.enqueued, span.stop, groups,
                           None if parent is None else str(parent.id)))
    return found


def _prefixes(groups: Any, most: int = 3) -> str:
    """The task prefixes of ``groups``, those with most tasks first."""
    tasks: dict[str, int] = {}
    for tg in groups:
        tasks[tg.prefix.name] = tasks.get(tg.prefix.name, 0) + sum(tg.states.values())
    names = sorted(tasks, key=lambda name: (-tasks[name], name))
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def _code_line(code: Any) -> str:
    """The line that submitted a computation: the innermost of the code Dask recorded."""
    for snippets in reversed(list(code or ())):
        for snippet in reversed(snippets):
            lines = str(getattr(snippet, "code", "")).splitlines()
            number = getattr(snippet, "lineno_relative", 0)
            if 0 < number <= len(lines) and lines[number - 1].strip():
                return lines[number - 1].strip()
    return ""


# -- analyses, as CruxSchedulerPlugin.analyse runs them: (store, end, *args) ---------
def pickled(store: PAGStore, end: int, function: Callable[..., Any], *args: Any) -> Pieces:
    """``function(store, end, *args)``, pickled where it runs, cut into pieces of
    :data:`~crux_dask.store.PIECE_BYTES`.

    What a client asked for then crosses the scheduler as bytes, a piece per
    message: a long path is neither unpickled nor pickled again on the
    scheduler's event loop, nor held there in one buffer of tens of megabytes
    (whose fresh memory the loop's thread would fault in, and which distributed
    would copy again into its reply).
    """
    return Pieces.cut(pickle.dumps(function(store, end, *args),
                                   protocol=pickle.HIGHEST_PROTOCOL))


def path_of_graph(store: PAGStore, end: int, start: int | None, stop: int | None,
                  method: str) -> CriticalPath:
    """The critical path from ``start`` to ``stop`` (default: the graph's ``end``)."""
    return critical_path(store, start, stop, method, default_end=end)


def path_of_scope(store: PAGStore, end: int, scope: Scope, method: str) -> CriticalPath:
    """The critical path of one computation or span."""
    return scope_path(store, scope, key_groups(store), method)


def scopes_table(store: PAGStore, end: int, scopes: list[Scope]) -> pd.DataFrame:
    """One row per computation and span, with its path's length and top categories."""
    return scopes_frame(store, scopes, key_groups(store))
