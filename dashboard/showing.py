"""Showing a page: its models made off the event loop, sent a part at a time, kept updated."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

from bokeh.application.handlers.handler import Handler
from bokeh.document import Document
from bokeh.events import ConnectionLost, DocumentReady
from bokeh.models import ColumnDataSource, CustomJS
from distributed.dashboard.components import DashboardComponent
from distributed.dashboard.components.scheduler import BOKEH_THEME

from crux_dask.dashboard.callbacks import every, soon
from crux_dask.dashboard.data import in_thread
from crux_dask.dashboard.pieces import hold_back, release

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
