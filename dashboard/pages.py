"""The "Crux" tab of the Dask dashboard and its individual pages."""

from __future__ import annotations

import asyncio
import functools
import html
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from bokeh.application import Application
from bokeh.application.handlers.handler import Handler
from bokeh.document import Document
from bokeh.events import ConnectionLost, DocumentReady
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, CustomJS, Div, Select, TextInput
from bokeh.server.server import BokehTornado
from distributed.dashboard.components import DashboardComponent
from distributed.dashboard.components.scheduler import BOKEH_THEME, env
from distributed.dashboard.core import DaskBokehTornado
from distributed.utils import log_errors

from crux_dask.dashboard.breakdown import Breakdown
from crux_dask.dashboard.callbacks import every, on_change, soon
from crux_dask.dashboard.data import (
    GraphView,
    OffLoop,
    PathSelection,
    RunChoice,
    Runs,
    Source,
    chosen_source,
    in_thread,
    live_source,
    selected_source,
)
from crux_dask.dashboard.layout import crux_layout
from crux_dask.dashboard.overview import PAGOverview
from crux_dask.dashboard.pieces import hold_back, release
from crux_dask.dashboard.prefixes import PrefixTable
from crux_dask.dashboard.steps import StepsTable
from crux_dask.dashboard.suggestions import SuggestionTable
from crux_dask.dashboard.tab import INDIVIDUAL_PAGES
from crux_dask.dashboard.timeline import WCPTimeline
from crux_dask.scopes import Scope
from crux_dask.wcp import METHODS

if TYPE_CHECKING:
    from crux_dask.plugins.scheduler import CruxSchedulerPlugin

#: Individual pages: route -> component class.
INDIVIDUAL = dict(zip(INDIVIDUAL_PAGES, (WCPTimeline, Breakdown, StepsTable, PrefixTable,
                                         PAGOverview, SuggestionTable), strict=True))
UPDATE_INTERVAL = 500  # milliseconds
CHECK_INTERVAL = 100  # milliseconds: how soon a path chosen on the page is shown
STAGES_AT_THE_LATEST = 5000  # milliseconds: see show_in_stages
#: What a page does when its websocket closes: ask for itself again, after half a
#: second and then every two, and reload once it is served (see
#: reload_when_served_again).
RELOAD_WHEN_SERVED = """
if (window.cruxReloading) { return; }
window.cruxReloading = true;
const again = (delay) => setTimeout(() => {
    fetch(window.location.href, {cache: "no-store"}).then(
        (answer) => answer.ok ? window.location.reload() : again(2000),
        () => again(2000));
}, delay);
again(500);
"""


class MadeOffLoop(Handler):
    """A Bokeh page whose components are made in a thread, not on the event loop.

    Making a page's Bokeh models is most of what a page costs (the ``/crux``
    page has a few hundred, made in a tenth of a second or more): Bokeh
    awaits :meth:`on_session_created` before it fills the session's document
    on the event loop, so they are made there, in a thread of their own, and
    :meth:`modify_document` only shows them.  ``make()`` returns the
    function that shows them in a document (with :func:`show_in_stages`).
    """

    def __init__(self, make: Callable[[], Callable[[Document], None]]) -> None:
        super().__init__()
        self._make = make
        self._made: WeakKeyDictionary = WeakKeyDictionary()

    async def on_session_created(self, session_context: Any) -> None:
        self._made[session_context] = await asyncio.wrap_future(
            in_thread(self._make, name="crux-page"))

    def modify_document(self, doc: Document) -> None:
        context = doc.session_context
        show = self._made.pop(context, None) if context is not None else None
        (show or self._make())(doc)  # made here if it was not made before (or failed)


def largest_first(parts: list[Any]) -> list[tuple[int, Any]]:
    """``parts`` (in the order the page shows them) with their positions, the part of
    most models first: the order :func:`show_in_stages` adds them in.

    A part added to a document costs a walk of every model already there and
    the encoding of its own: added largest first, no part pays for both a long
    walk and a long encoding.  Walks every model: call it off the event loop.
    """
    return sorted(enumerate(parts), key=lambda placed: -len(placed[1].references()))


def insert_in_place(layout: Any, position: int, part: Any, shown: list[int]) -> None:
    """Insert ``part`` in ``layout`` where its ``position`` puts it among the parts
    already shown (``shown``: their positions), and add its position to them."""
    layout.children.insert(sum(other < position for other in shown), part)
    shown.append(position)


def reload_when_served_again(doc: Document) -> None:
    """Have the browser reload the page shown by ``doc`` once its server is back.

    A page loses its websocket when its scheduler goes away; a scheduler that
    restarts serves it again.  BokehJS only announces the
    loss (``ConnectionLost``, once per attempt to reconnect): the page then
    asks for itself until it is answered, and reloads.  While nothing answers
    it keeps showing what it showed.
    """
    doc.js_on_event(ConnectionLost, CustomJS(code=RELOAD_WHEN_SERVED))


def show_in_stages(doc: Document, root: Any, body: Any, parts: list[tuple[int, Any]],
                   sources: list[ColumnDataSource]) -> None:
    """Add ``root`` to ``doc`` now, and each of ``parts`` (``(position, part)``, see
    :func:`largest_first`) to ``body`` (a layout in it) at its position once the browser
    shows the rest, one per turn of the event loop.

    Bokeh checks every model of a document when its session starts, and the
    browser pulls them all at once: a page added whole holds the event loop
    for both, tens of milliseconds for ``/crux``.  Added a part at a time,
    the check sees only ``root`` and each part is sent as a change of its
    own, the long ones of ``sources`` (its components') in pieces after it
    (:func:`~.pieces.hold_back`).  A client that never says it shows the page
    (BokehJS does: ``DocumentReady``) gets the parts after
    :data:`STAGES_AT_THE_LATEST` ms.  The page reloads itself once served again
    after its server went away (:func:`reload_when_served_again`).
    """
    reload_when_served_again(doc)
    doc.theme = BOKEH_THEME  # before the models: a theme set later is applied to each again
    doc.add_root(root)
    waiting = list(parts)
    shown: list[int] = []  # the positions of the parts added
    started = False

    def add_next() -> None:
        if waiting:
            position, part = waiting.pop(0)
            hold_back(sources)
            insert_in_place(body, position, part, shown)
            release(sources)
            doc.add_next_tick_callback(add_next)

    def start(*_: Any) -> None:
        nonlocal started
        if not started:
            started = True
            add_next()

    doc.on_event(DocumentReady, start)
    doc.add_timeout_callback(start, STAGES_AT_THE_LATEST)


def update_on_the_loop(doc: Document, periodic: list[tuple[DashboardComponent, int]]) -> None:
    """Update each component of ``periodic`` once, then every so many milliseconds, on
    the event loop (the document may be filled in another thread, see
    :mod:`~crux_dask.dashboard.callbacks`)."""
    def first() -> None:
        for component, _ in periodic:
            component.update()  # starts computing what the page shows, off the loop

    soon(doc, first)
    for component, interval in periodic:
        every(doc, component.update, interval)


def crux_page(data: Source, runs: Runs, extra: dict) -> Callable[[Document], None]:
    """The ``/crux`` page: all components, in the dashboard's template.

    Makes the components (in any thread); what it returns shows them in a
    document, on the event loop, with the selectors, which read the
    scheduler's state.
    """
    selection = PathSelection()
    choice = RunChoice()
    selected = selected_source(chosen_source(data, runs, choice), selection)
    updaters, layout = crux_layout(selected)
    parts = largest_first(list(layout.children))
    layout.children = []

    def show(doc: Document) -> None:
        selector = RunSelector(runs, choice, updaters)
        check = SelectionCheck(selected, selection, updaters)
        scopes = ScopeSelector(runs.plugin, check)
        periodic = [(updater, UPDATE_INTERVAL) for updater in updaters] + [
            (selector, UPDATE_INTERVAL), (check, CHECK_INTERVAL), (scopes, UPDATE_INTERVAL)]
        update_on_the_loop(doc, periodic)
        doc.title = "Dask: Crux"
        doc.template = env.get_template("simple.html")
        doc.template_variables.update(extra)
        root = column(row(selector.root, scopes.root, path_controls(check)), layout,
                      sizing_mode="stretch_width")
        show_in_stages(doc, root, layout, parts, [
            source for updater in updaters
            for component in getattr(updater, "components", [updater])
            for source in component.sources])

    return show


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
        view = self.data()
        if view.analyse is not None:  # where the graph is built
            check: Any = asyncio.ensure_future(view.analyse(find_path, chosen))
        else:
            check = in_thread(lambda: view.with_selection(chosen).wcp())
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


def individual_page(cls: type, data: Source) -> Callable[[Document], None]:
    """An individual page: one component, all the window."""
    component = cls(data, sizing_mode="stretch_both")

    def show(doc: Document) -> None:
        # What it shows is computed off the event loop, from the first update on.
        updater = (component if isinstance(component, SuggestionTable)
                   else OffLoop(data, [component]))
        update_on_the_loop(doc, [(updater, UPDATE_INTERVAL)])
        doc.title = f"Dask: Crux {cls.__name__}"
        body = column(sizing_mode="stretch_both")
        show_in_stages(doc, body, body, [(0, component.root)], component.sources)

    return show


def page_makers(host: Any, extra: dict) -> dict[str, Callable[[], Callable[[Document], None]]]:
    """Route -> what makes that page (see :class:`MadeOffLoop`), reading ``host``'s graph.

    ``host`` is what the pages read: the scheduler plugin.  ``extra`` are the
    dashboard template's variables.
    """
    data = live_source(host)
    pages = {"/crux": functools.partial(crux_page, data, Runs(host), extra)}
    pages.update({route: functools.partial(individual_page, cls, data)
                  for route, cls in INDIVIDUAL.items()})
    return pages


def pages_application(host: Any, extra: dict, settings: dict) -> BokehTornado:
    """The Bokeh application of the Crux pages, made as distributed makes its own.

    ``settings``: ``prefix``, ``origins`` (the websocket origins allowed) and
    ``bokeh`` (distributed's ``bokeh-application`` settings, without them).
    """
    return DaskBokehTornado({route: Application(MadeOffLoop(make))
                             for route, make in page_makers(host, extra).items()},
                            prefix=settings["prefix"], use_index=False,
                            extra_websocket_origins=settings["origins"], absolute_url="",
                            **settings["bokeh"])
