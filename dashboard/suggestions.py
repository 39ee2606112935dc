"""What to fix: candidate changes ranked by the seconds a what-if replay predicts they save."""

from __future__ import annotations

import asyncio
import contextlib
import html
import multiprocessing
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from bokeh.layouts import column
from bokeh.models import ColumnDataSource, DataTable, Div
from distributed.utils import log_errors

from crux_dask.dashboard.component import Component
from crux_dask.dashboard.data import GraphView, Source, in_thread
from crux_dask.dashboard.datatables import table_columns
from crux_dask.dashboard.scaling import ScalingPlot
from crux_dask.plugins.host import graph_pieces
from crux_dask.store import PAGStore

# pandas (with the what-if replay) is imported when a replay is asked for: a scheduler
# that serves no Crux page never loads it (tests/test_layering.py checks it).
if TYPE_CHECKING:
    import pandas as pd

    from crux_dask.scaling import Scaling

COLUMNS = ("kind", "change", "why", "predicted", "range", "saved", "saved_share", "path_then")
#: How much less the process replaying a live run is favoured than the scheduler.
NICENESS = 10


def _suggestions(store: PAGStore, end: int, load: Any) -> tuple[pd.DataFrame, Scaling]:
    """The advice and the ranked changes of the whole run, and how many workers are
    enough (see :func:`crux_dask.advice.fixes`)."""
    from crux_dask.advice import fixes

    return fixes(store, end, load)


def _suggestions_apart(pieces: list[bytes], end: int, load: Any
                       ) -> tuple[pd.DataFrame, Scaling]:
    """:func:`_suggestions` of the store cut into ``pieces``
    (:meth:`~crux_dask.store.PAGStore.to_pieces`), replayed in a process of its own at a
    lower priority; call it in a thread.

    The pieces go to the process one at a time, each a short hold of the
    interpreter (all at once, as the process's arguments, they would be
    pickled in one call holding it, and the scheduler's event loop, for as long
    as copying the whole graph takes); the replay's CPU and its garbage
    collections stay out of this process.  The process is a daemon: a
    scheduler that exits ends it instead of waiting for it.

    Raises
    ------
    ValueError
        If the run has no tasks or timing to replay.
    RuntimeError
        If the process ended without an answer.
    """
    from crux_dask.advice import fixes_apart

    if multiprocessing.current_process().daemon:  # the graph's own process has no children
        return _suggestions(PAGStore.from_pieces(pieces), end, load)
    context = multiprocessing.get_context("spawn")
    answer, sender = context.Pipe(duplex=False)
    receiver, feeder = context.Pipe(duplex=False)
    process = context.Process(target=fixes_apart, name="crux-what-if", daemon=True,
                              args=(receiver, end, NICENESS, sender, load))
    process.start()
    sender.close()  # the child's ends: closed here, so that its exit ends the waits
    receiver.close()
    try:
        with contextlib.suppress(BrokenPipeError):  # it died: said below
            for piece in pieces:
                feeder.send_bytes(piece)
            feeder.send_bytes(b"")
        fixed, error = answer.recv()
    except EOFError:  # it died: killed, or out of memory
        fixed = error = None
    finally:
        feeder.close()
        answer.close()
        process.join()
    if error is not None:
        raise error
    if fixed is None:
        raise RuntimeError(f"the what-if process ended with code {process.exitcode} "
                           "without an answer")
    return fixed


def _replayed(view: GraphView) -> asyncio.Future:
    """:func:`_suggestions_apart` of ``view``: its graph cut where it is (see
    :meth:`~crux_dask.plugins.CruxSchedulerPlugin.pieces`), and replayed from a thread
    that feeds a process of its own."""

    load = None if view.load is None else view.load()

    async def replayed() -> tuple[pd.DataFrame, Scaling]:
        cut = await view.analyse(graph_pieces)
        try:
            pieces = await cut.fetch_all()
        finally:
            cut.release()
        return await asyncio.wrap_future(in_thread(_suggestions_apart, pieces, cut.head,
                                                   load, name="crux-what-if"))

    return asyncio.ensure_future(replayed())


class SuggestionTable(Component):
    """One row per candidate change of the whole run, most seconds saved first.

    Each row gives the predicted makespan (and its range, where the run does not
    tell whether a label holds the GIL), the seconds and share saved, and
    the labels the path then spends most time in (the path that takes over).
    A line above the table gives the unchanged replay's error, which bounds
    how far to trust the figures; below it, how many workers are enough
    (:class:`~.scaling.ScalingPlot`).

    Parameters
    ----------
    data : Source
    background : bool
        Replay in a process of its own, off the event loop (see
        :func:`_suggestions_apart`), and only once the graph has
        stopped changing between two updates (between computations): the
        live page.  ``False`` replays at once: a graph that no longer changes,
        as in the standalone report.
    """

    def __init__(self, data: Source, background: bool = True, **kwargs: Any) -> None:
        super().__init__(data)
        self.background = background
        self.source = ColumnDataSource({c: [] for c in COLUMNS})
        self.table = DataTable(source=self.source, name="crux-suggestions",
                               index_position=None, height=230, columns=table_columns(
            ("kind", "from", 60), ("change", "change", 170), ("why", "why", 330),
            ("predicted", "predicted (s)", 90, "0.000"), ("range", "range (s)", 90),
            ("saved", "saved (s)", 80, "0.000"), ("saved_share", "saved", 60, "0.0%"),
            ("path_then", "the path then spends most in", 330)), **kwargs)
        self.note = Div(text="", name="crux-suggestions-note")
        self.scaling = ScalingPlot(**kwargs)
        self.root = column(Div(text="<b>What to fix</b>: advice from the path's stages and "
                                    "their load, then the whole run replayed with each "
                                    "change"), self.note, self.table, self.scaling.root,
                           **kwargs)
        self._seen: tuple | None = None  # the graph at the last update
        self._running: tuple[tuple, Future] | None = None

    @log_errors
    def update(self) -> None:
        """Show a finished replay; start one once the graph shown stopped changing."""
        if not self.background:
            super().update()
            return
        if self._running is not None:
            graph, replay = self._running
            if not replay.done():
                return
            self._running = None
            self._version = graph
            self._show(replay.result)
        view = self.data()
        graph = view.version[:4]  # the graph, not the path selected
        if graph == self._version:
            return
        if graph != self._seen:  # still changing: wait for a quiet moment
            self._seen = graph
            return
        self._running = (graph, _replayed(view))
        self.note.text = "replaying the run&hellip;"

    def render(self, view: GraphView) -> None:
        self._show(lambda: _suggestions(view.store, view.end,
                                        None if view.load is None else view.load()))

    def _show(self, suggestions: Callable[[], tuple[pd.DataFrame, Scaling]]) -> None:
        try:
            table, scaling = suggestions()
        except ValueError as error:  # a run without tasks or timing
            self.note.text = f"No suggestions: {html.escape(str(error))}"
            self.source.data = {c: [] for c in COLUMNS}
            self.scaling.show(None)
            return
        self.scaling.show(scaling)
        replayed = table["replay_error"].dropna()
        error = float(replayed.iloc[0]) if len(replayed) else 0.0
        self.note.text = (f"The unchanged replay is {abs(error):.1%} "
                          f"{'longer' if error >= 0 else 'shorter'} than the recorded run.")
        table = table.assign(range=[
            f"{low:.3f}-{high:.3f}" if high == high else ""
            for low, high in zip(table["low"], table["high"])])
        self.source.data = {c: (table[c].fillna("") if c in ("why", "path_then")
                                else table[c]).tolist() for c in COLUMNS}
