"""The Crux pages served by the graph's own process.

The process's main thread applies events; a thread of its own runs the
pages' event loop and a Bokeh server on the local interface, which the
scheduler relays (see :mod:`.relay`).  What a page computes from the graph
is computed by the main thread, between two slices of events, as the
scheduler's pages have the process compute it
(:meth:`ProcessHost.analyse`): the graph is never read while it grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crux_dask.build.builder import PAGBuilder
    from crux_dask.pag import PAG
    from crux_dask.plugins.ingest import Ingest
    from crux_dask.scopes import Scope

logger = logging.getLogger(__name__)

__all__ = ["ProcessHost", "serve_pages"]

#: Seconds the pages' server may take to start (it imports Bokeh and the pages).
START_TIMEOUT = 60.0


class ProcessHost:
    """What the pages read in the graph process, as they read the scheduler plugin.

    Parameters
    ----------
    ingest : Ingest
        The process's ingest: its builder and its spool.

    Attributes
    ----------
    known_scopes : list of Scope
        The scheduler's computations and spans, as it last sent them.
    wake : socket.socket
        Readable when the pages asked something (:meth:`answer` answers it).
    """

    graph_apart = True  # what a page computes is computed by the main thread

    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest
        self.known_scopes: list[Scope] = []
        self.wake, self._waker = socket.socketpair()
        self.wake.setblocking(False)
        self._questions: deque = deque()

    @property
    def builder(self) -> PAGBuilder:
        return self.ingest.builder

    def behind(self) -> bool:
        return False  # the builder is the graph itself

    def spooled_runs(self) -> list[str]:
        return self.ingest.spool.run_ids

    def read_spooled(self, run_id: str) -> Future[PAG]:
        return self.ingest.spool.read(run_id)

    def scopes(self) -> list[Scope]:
        return self.known_scopes

    async def analyse(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(store, end, *args)`` on the graph, by the process's main thread."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._questions.append((function, args, loop, future))
        self._waker.send(b"\0")
        return await future

    def answer(self) -> None:
        """Answer what the pages asked (from the main thread, between two slices)."""
        with contextlib.suppress(BlockingIOError):
            while self.wake.recv(4096):
                pass
        while self._questions:
            function, args, loop, future = self._questions.popleft()
            builder = self.ingest.builder
            try:
                value, error = function(builder.store, builder.end, *args), None
            except Exception as failure:
                value, error = None, failure
            with contextlib.suppress(RuntimeError):  # the pages' loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, future, value, error)


def _settle(future: asyncio.Future, value: Any, error: Exception | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def serve_pages(host: ProcessHost, settings: dict[str, Any]) -> int:
    """Serve the Crux pages from ``host`` in a thread of their own; the server's port.

    ``settings``: as :func:`~crux_dask.dashboard.pages.pages_application`'s,
    and ``extra``, the dashboard template's variables.

    Raises
    ------
    Exception
        What starting the server raised, or ``TimeoutError``.
    """
    started: Future = Future()

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            port = loop.run_until_complete(_start(host, settings))
        except BaseException as error:
            started.set_exception(error)
            return
        started.set_result(port)
        loop.run_forever()

    threading.Thread(target=run, name="crux-pages", daemon=True).start()
    return started.result(START_TIMEOUT)


async def _start(host: ProcessHost, settings: dict[str, Any]) -> int:
    from tornado.httpserver import HTTPServer
    from tornado.ioloop import IOLoop
    from tornado.netutil import bind_sockets

    from crux_dask.dashboard.pages import pages_application

    app = pages_application(host, settings["extra"], settings)
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(app, max_body_size=1 << 20)
    server.add_sockets(sockets)
    app.initialize(IOLoop.current())
    app.start()
    return sockets[0].getsockname()[1]

