"""The base of the Crux dashboard components: what they show, computed apart and then set."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bokeh.models import ColumnDataSource
from distributed.dashboard.components import DashboardComponent
from distributed.utils import log_errors

from crux_dask.dashboard.data import GraphView, Source
from crux_dask.dashboard.off_loop import kept
from crux_dask.dashboard.pieces import set_in_pieces


class Component(DashboardComponent):
    """Base of the Crux dashboard components: distributed's component contract.

    A component owns a ``root`` (its Bokeh model) and a ``source`` (its main
    :class:`~bokeh.models.ColumnDataSource`).  What it shows is made in two
    steps: :attr:`computer` reads a view and returns the new column data (in
    any thread or process: it touches no Bokeh model), :meth:`show` sets it
    (on the event loop).  :meth:`update` does both at once;
    :class:`~.off_loop.OffLoop` computes elsewhere.  Either re-renders only
    when the graph or the path selected changed since the last time, so an
    idle page costs nothing, and logs what a render raises.

    Parameters
    ----------
    data : Source
        Where the component reads the graph.
    """

    def __init__(self, data: Source) -> None:
        super().__init__()
        self.data = data
        self._version: Any = None

    @log_errors
    def update(self) -> None:
        """Render the current view, here and now, if it changed since the last update."""
        view = self.data()
        if view.version == self._version:
            return
        self.render(view)
        self._version = view.version

    def render(self, view: GraphView) -> None:
        """Build the complete new column data from ``view`` and set it at once."""
        self.show(self.compute(view))

    #: What :meth:`show` sets, read from a view: ``computer(view)``.  It travels
    #: pickled to where the graph is built (a function, by name; an object with a
    #: ``token`` is kept there, see :func:`~.off_loop.kept`).
    computer: Callable[[GraphView], Any]

    def compute(self, view: GraphView) -> Any:
        """What :meth:`show` sets, read from ``view``; touches no Bokeh model."""
        return kept(self.computer)(view)

    def show(self, computed: Any) -> None:
        """Set what :meth:`compute` returned on the component's models: by default, the
        column data of its ``source``, in pieces if it is long (:func:`set_in_pieces`)."""
        set_in_pieces(self.source, computed)

    @property
    def sources(self) -> list[ColumnDataSource]:
        """The sources that may grow as long as the graph's critical path (held back
        while a page adds the component, see :func:`~.pieces.hold_back`)."""
        return [self.source]
