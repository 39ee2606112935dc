"""The Crux pages relayed by the scheduler from the graph's own process.

That process serves the pages with a Bokeh server of its own, on the local
interface (see :mod:`.apart`); the scheduler's web server passes each page's
HTTP requests and its websocket through, bytes in and bytes out, under the
dashboard's prefix.  Bokeh's static files come from the scheduler's own
Bokeh server, as for distributed's pages.  The scheduler's event loop spends
on a page only the copying; what the page reads of the scheduler, the
computations and spans, is sent to the process while a page is open.  If
the process dies, the scheduler serves the pages itself from then on.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import tornado.httpclient
import tornado.web
import tornado.websocket
from tornado.httputil import HTTPServerRequest
from tornado.ioloop import PeriodicCallback
from tornado.routing import PathMatches

if TYPE_CHECKING:
    from crux_dask.plugins.scheduler import CruxSchedulerPlugin

logger = logging.getLogger(__name__)

__all__ = ["Upstream", "install_relay"]

#: Headers of a request that concern one connection only, not passed on.
HOP_BY_HOP = frozenset({"host", "connection", "keep-alive", "upgrade", "accept-encoding",
                        "proxy-connection", "te", "trailer", "transfer-encoding"})
#: The largest message either side of a relayed websocket may send: a page's first
#: document can be tens of megabytes.
MAX_MESSAGE_BYTES = 1 << 30
#: Milliseconds between two looks at the scheduler's computations and spans while a
#: page is open (the pages look at them as often).
SCOPES_INTERVAL = 500


class Upstream:
    """Where the pages are served: the port of the graph process's Bokeh server.

    The process starts its server when a page is first asked for; until then
    it imports no Bokeh.  :attr:`open_pages` counts the websockets relayed now.

    Parameters
    ----------
    port : callable
        Awaitable of the port, which starts the server the first time.
    alive : callable
        Whether the process lives.
    fall_back : callable
        Has the scheduler serve the pages itself, once the process is gone.
    """

    def __init__(self, port: Callable[[], Awaitable[int]], alive: Callable[[], bool],
                 fall_back: Callable[[], None]) -> None:
        self._port = port
        self.alive = alive
        self._fall_back = fall_back
        self.fell_back = False
        self.open_pages = 0

    def fall_back(self) -> None:
        """Have the scheduler serve the pages (the first call only)."""
        if not self.fell_back:
            self.fell_back = True
            logger.warning("Crux's graph process is gone: the scheduler serves the Crux "
                           "pages itself from now on")
            self._fall_back()

    async def url(self, uri: str, scheme: str = "http") -> str:
        """``uri`` (a path and a query) at the process's server.

        Raises
        ------
        GraphProcessGone
            If the process is gone.
        Exception
            What the process raised when it started its server.
        """
        return f"{scheme}://127.0.0.1:{await self._port()}{uri}"


class WhileApart(PathMatches):
    """Matches its path while the graph process lives.  Once it is gone, the first
    request has the scheduler serve the pages itself (:meth:`Upstream.fall_back`), and
    every request goes to those pages."""

    def __init__(self, pattern: str, upstream: Upstream) -> None:
        super().__init__(pattern)
        self.upstream = upstream

    def match(self, request: HTTPServerRequest) -> dict[str, Any] | None:
        if self.upstream.alive():
            return super().match(request)
        self.upstream.fall_back()
        return None


class PageRelay(tornado.web.RequestHandler):
    """Passes a page's HTTP request on to the process, and its answer back."""

    def initialize(self, upstream: Upstream) -> None:
        self.upstream = upstream

    async def get(self, *_: Any) -> None:
        try:
            url = await self.upstream.url(self.request.uri)
        except Exception as error:  # gone, or it could not start its server
            self.set_status(503)
            self.write(f"Crux's pages are served by its graph process, which cannot serve "
                       f"them: {error}.  The JSON API (crux/api/v1) still answers.")
            return
        headers = {name: value for name, value in self.request.headers.get_all()
                   if name.lower() not in HOP_BY_HOP}
        try:
            answer = await tornado.httpclient.AsyncHTTPClient().fetch(
                url, headers=headers, raise_error=False, follow_redirects=False)
            failed = answer.error if answer.code == 599 else None
        except OSError as error:  # it died since, or it is stuck
            failed = error
        if failed is not None:
            self.set_status(502)
            self.write(f"Crux's graph process did not answer: {failed!r}")
            return
        self.set_status(answer.code)
        for name in ("Content-Type", "Location", "Cache-Control", "Set-Cookie"):
            for value in answer.headers.get_list(name):
                self.add_header(name, value)
        self.write(answer.body)


class WebSocketRelay(tornado.websocket.WebSocketHandler):
    """Passes a page's websocket messages on to the process's, both ways, in order.

    Bokeh's subprotocol (which carries the session's token) and the origin go
    through: the process's Bokeh server checks them as distributed's would.
    """

    def initialize(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.connection: tornado.websocket.WebSocketClientConnection | None = None
        self.counted = False

    def check_origin(self, origin: str) -> bool:
        return True  # checked by the process's server, which gets the origin

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return subprotocols[0] if subprotocols else None

    async def open(self, *_: Any) -> None:
        self.upstream.open_pages += 1
        self.counted = True
        headers = {"Origin": self.request.headers.get("Origin", "")}
        protocols = [protocol.strip() for protocol in
                     self.request.headers.get("Sec-WebSocket-Protocol", "").split(",")
                     if protocol.strip()]
        try:
            request = tornado.httpclient.HTTPRequest(
                await self.upstream.url(self.request.uri, "ws"), headers=headers)
            self.connection = await tornado.websocket.websocket_connect(
                request, subprotocols=protocols, on_message_callback=self._back,
                max_message_size=MAX_MESSAGE_BYTES)
        except Exception as error:  # gone, could not serve, or refused it
            logger.warning("Crux could not relay a page's websocket: %r", error)
            self.close(1011, "Crux's graph process did not answer")
            return
        if self.ws_connection is None:  # the page closed meanwhile
            self.connection.close()

    def on_message(self, message: str | bytes) -> None:
        if self.connection is not None:
            self.connection.write_message(message, binary=isinstance(message, bytes))

    def _back(self, message: str | bytes | None) -> None:
        if message is None:  # the process closed it
            self.close()
        else:
            with contextlib.suppress(tornado.websocket.WebSocketClosedError):
                self.write_message(message, binary=isinstance(message, bytes))

    def on_close(self) -> None:
        if self.counted:
            self.counted = False
            self.upstream.open_pages -= 1
        if self.connection is not None:
            self.connection.close()


def install_relay(scheduler: Any, plugin: CruxSchedulerPlugin, routes: list[str],
                  settings: dict[str, Any], fall_back: Callable[[], None]) -> Upstream:
    """Relay ``routes`` (pages, under ``settings["prefix"]``) to the graph process, which
    serves them with ``settings`` (see :func:`.apart.serve_pages`); ``fall_back`` has the
    scheduler serve them once the process is gone.

    While a page is open, the scheduler's computations and spans are sent to
    the process whenever they change.
    """
    upstream = Upstream(lambda: plugin.ingest.pages(settings), lambda: plugin.graph_apart,
                        fall_back)
    names = "|".join(re.escape(route.strip("/")) for route in routes)
    prefix = re.escape(settings["prefix"])
    scheduler.http_application.add_handlers(r".*", [
        (WhileApart(rf"{prefix}({names})/ws", upstream), WebSocketRelay,
         {"upstream": upstream}),
        (WhileApart(rf"{prefix}({names})(/autoload\.js|/metadata)?/?", upstream), PageRelay,
         {"upstream": upstream}),
    ])
    scheduler.http_application.crux_relayed = True

    def send_scopes() -> None:
        if upstream.open_pages:
            plugin.ingest.send_scopes(plugin.scopes())

    callback = PeriodicCallback(send_scopes, SCOPES_INTERVAL)
    scheduler.periodic_callbacks["crux-scopes"] = callback
    callback.start()
    return upstream
