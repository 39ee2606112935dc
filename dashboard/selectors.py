"""The selectors of the ``/crux`` page: the run, the computation or span, and the path."""

from __future__ import annotations

import asyncio
import html
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div, Select, TextInput
from distributed.dashboard.components import DashboardComponent
from distributed.utils import log_errors

from crux_dask.dashboard.callbacks import on_change
from crux_dask.dashboard.data import GraphView, PathSelection, RunChoice, Runs, Source
from crux_dask.scopes import Scope
from crux_dask.wcp import METHODS

if TYPE_CHECKING:
    from crux_dask.plugins.scheduler import CruxSchedulerPlugin


class RunSelector(DashboardComponent):
    """Which run the page shows: the one being recorded, or a segment spooled before it.

    ``source`` lists the runs (``value``, ``label``) and the selector offers
    them; :meth:`update` (periodic) lists new segments and reports a segment
    being read.
    """

    def __init__(self, runs: Runs, choice: RunChoice,
                 components: list[DashboardComponent]) -> None:
        super().__init__()
        self.runs, self.choice, self.components = runs, choice, components
        options = runs.options()
        self.source = ColumnDataSource(_run_columns(options))
        self.select = Select(title="run", options=options, value="", width=260,
                             name="crux-run")
        self.message = Div(text="", name="crux-run-message")
        self.root = column(self.select, self.message)
        on_change(self.select, "value", self._chosen)

    @log_errors
    def _chosen(self, attr: str, old: str, new: str) -> None:
        self.choice.run_id = new
        self.update()
        for component in self.components:
            component.update()

    @log_errors
    def update(self) -> None:
        """List the runs, if they changed, and say whether the one chosen can be shown."""
        options = self.runs.options()
        columns = _run_columns(options)
        if columns != dict(self.source.data):
            self.source.data = columns
            self.select.options = options
        text = ""
        if self.choice.run_id:
            try:
                if self.runs.view(self.choice.run_id) is None:
                    text = "reading the spooled run..."
            except Exception as error:
                text = f"<b>cannot show this run: {html.escape(str(error))}</b>"
        if text != self.message.text:
            self.message.text = text


class SelectionCheck(DashboardComponent):
    """A path selection chosen on the page, checked off the event loop before it applies.

    :meth:`propose` starts finding, in a thread, the path the selection
    names in the graph shown as it is now (at a million states that takes as
    long as the path itself); :meth:`update` (periodic) then applies it and
    updates the components, or, if it does not apply to the graph, says why
    and leaves the page as it was.
    """

    def __init__(self, data: Source, selection: PathSelection,
                 components: list[DashboardComponent]) -> None:
        super().__init__()
        self.data, self.selection, self.components = data, selection, components
        self._pending: tuple[PathSelection, Div, Future] | None = None

    def propose(self, chosen: PathSelection, message: Div) -> None:
        """Check ``chosen``; ``message`` says what becomes of it."""
        check = asyncio.ensure_future(self.data().analyse(find_path, chosen))
        self._pending = (chosen, message, check)
        message.text = "finding that path&hellip;"

    def busy(self) -> bool:
        """Whether a selection is being checked."""
        return self._pending is not None and not self._pending[2].done()

    @log_errors
    def update(self) -> None:
        """Apply the selection checked, or say why it does not apply."""
        if self._pending is None or not self._pending[2].done():
            return
        chosen, message, check = self._pending
        self._pending = None
        try:
            check.result()
        except ValueError as error:
            message.text = f"<b>{html.escape(str(error))}</b>"
            return
        message.text = ""
        vars(self.selection).update(vars(chosen))
        for component in self.components:
            component.update()


def find_path(store: Any, end: int, chosen: PathSelection) -> None:
    """Find the path ``chosen`` names in ``store`` (``ValueError`` if there is none)."""
    GraphView(store, end, chosen).wcp()


class ScopeSelector(DashboardComponent):
    """Whose path the page shows: the whole run, or one computation or span.

    ``source`` lists the choices (``value``, ``label``); :meth:`update`
    (periodic) adds computations and spans as the scheduler records them.  A
    choice is applied once ``check`` found its path; one with no state in the
    graph shown leaves the page as it was and says why.
    """

    def __init__(self, plugin: CruxSchedulerPlugin, check: SelectionCheck) -> None:
        super().__init__()
        self.plugin, self.check = plugin, check
        self.scopes: dict[str, Scope] = {}
        options = [("", "the whole run")]  # the rest on the event loop, at each update
        self.source = ColumnDataSource(_run_columns(options))
        self.select = Select(title="computation or span", options=options, value="",
                             width=300, name="crux-scope")
        self.message = Div(text="", name="crux-scope-message")
        self.root = column(self.select, self.message)
        on_change(self.select, "value", self._chosen)

    def _options(self) -> list[tuple[str, str]]:
        self.scopes = {f"{s.kind}:{s.id}": s for s in self.plugin.scopes()}
        return [("", "the whole run")] + [(value, f"{s.kind}: {s.name}"[:60])
                                          for value, s in self.scopes.items()]

    @log_errors
    def _chosen(self, attr: str, old: str, new: str) -> None:
        scope = self.scopes.get(new)
        current = self.check.selection
        chosen = (PathSelection(method=current.method, scope=scope) if scope is not None
                  else PathSelection(current.start, current.end, current.method))
        self.check.propose(chosen, self.message)

    @log_errors
    def update(self) -> None:
        """List the computations and spans, if they changed."""
        options = self._options()
        columns = _run_columns(options)
        if columns != dict(self.source.data):
            self.source.data = columns
            self.select.options = options


def _run_columns(options: list[tuple[str, str]]) -> dict[str, list[str]]:
    return {"value": [value for value, _ in options], "label": [label for _, label in options]}


def path_controls(check: SelectionCheck) -> Any:
    """Start state, end state and method of the critical path shown, with error messages.

    A choice is applied once ``check`` found its path.
    """
    start = TextInput(title="from state id (empty: the graph's root)", width=220,
                      name="crux-start")
    end = TextInput(title="to state id (empty: the workflow's end)", width=220,
                    name="crux-end")
    method = Select(title="method", options=list(METHODS), value="observed", width=140,
                    name="crux-method")
    message = Div(text="", name="crux-message")

    @log_errors
    def changed(attr: str, old: Any, new: Any) -> None:
        scope = check.selection.scope
        try:
            chosen = PathSelection(_state_id(start.value, "from"), _state_id(end.value, "to"),
                                   method.value, scope)
            if scope is not None and (chosen.start, chosen.end) != (None, None):
                raise ValueError("from and to do not apply to a computation or span: "
                                 "choose the whole run first")
        except ValueError as error:
            message.text = f"<b>{html.escape(str(error))}</b>"
            return
        check.propose(chosen, message)

    for widget in (start, end, method):
        on_change(widget, "value", changed)
    return row(start, end, method, message)


def _state_id(text: str, name: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"'{name}' must be a state id, got {text!r}")
    return int(text)
