"""Building the program activity graph from events, on the scheduler.

Only the scheduler imports this package: workers import what they send
(:mod:`crux_dask.events`, :mod:`crux_dask.columns`, :mod:`crux_dask.codec`).

:mod:`~crux_dask.graph.rules`
    The mapping rules, each in one place: mutation kinds, ``SPLIT``, ready
    times, the last-arriving input, the graph's end.  The live builder, its
    windows and the offline rebuild all call them.
:mod:`~crux_dask.graph.holdings`
    Which copies of which data are held where.
:mod:`~crux_dask.graph.waiting`
    Events that wait for an input not reported yet.
:mod:`~crux_dask.graph.builder`
    :class:`PAGBuilder`, applying events one by one.
:mod:`~crux_dask.graph.handlers`
    Each kind of event applied to the builder.
:mod:`~crux_dask.graph.window`
    A window of routine events applied at once with numpy, exactly as one by one.
:mod:`~crux_dask.graph.commit`
    A planned window's rows appended to the store, the builder brought up to date.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PAGBuilder"]


def __getattr__(name: str) -> Any:
    # Lazily: the offline rebuild and the critical path need the rules, not the builder.
    if name == "PAGBuilder":
        from crux_dask.graph.builder import PAGBuilder

        return PAGBuilder
    raise AttributeError(f"module 'crux_dask.graph' has no attribute {name!r}")
