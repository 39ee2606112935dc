"""Bokeh callbacks that run on the event loop that serves the page.

Bokeh 3.10 fills a new session's document, and runs a document's plain
callbacks (periodic, next-tick, a property's ``on_change``), in a thread of
its own; a coroutine function it runs on the event loop, under the
document's lock, as earlier versions run every callback.  What the Crux pages
do in a callback reads the scheduler's state and starts asyncio work, which
belong on the event loop: each is run there through these helpers.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from bokeh.document import Document
from bokeh.model import Model

__all__ = ["every", "on_change", "soon"]


def _on_the_loop(function: Callable[..., Any], *args: Any
                 ) -> Callable[[], Coroutine[Any, Any, None]]:
    """``function(*args)`` as a coroutine function: what Bokeh runs on the event loop."""
    async def call() -> None:
        function(*args)

    return call


def soon(doc: Document, function: Callable[..., Any], *args: Any) -> None:
    """Call ``function(*args)`` on the event loop, at its next turn, ``doc`` locked."""
    doc.add_next_tick_callback(_on_the_loop(function, *args))


def every(doc: Document, function: Callable[[], Any], milliseconds: int) -> None:
    """Call ``function()`` on the event loop every so many ``milliseconds``, ``doc`` locked."""
    doc.add_periodic_callback(_on_the_loop(function), milliseconds)


def on_change(model: Model, attr: str, handler: Callable[[str, Any, Any], Any]) -> None:
    """Call ``handler(attr, old, new)`` on the event loop when ``attr`` of ``model``
    changes (at once if ``model`` is in no document)."""
    def changed(attr: str, old: Any, new: Any) -> None:
        doc = model.document
        if doc is None:
            handler(attr, old, new)
        else:
            soon(doc, handler, attr, old, new)

    model.on_change(attr, changed)
