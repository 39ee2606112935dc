"""What every handler of the JSON API shares: the plugin, parameters, errors, answers.

Handlers use only the plugin's public interface: ``progress()``, ``stats()``,
``scopes()``, ``analyse()``, ``add_external()``,
``count_http_write()`` and ``settings``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tornado import web
from tornado.iostream import StreamClosedError

from crux_dask.dashboard.api_answers import plain
from crux_dask.plugins.graph_process import GraphProcessGone
from crux_dask.plugins.staging import KeptPieces, Pieces, fetched

if TYPE_CHECKING:
    from crux_dask.plugins.scheduler import CruxSchedulerPlugin

MAX_LIMIT = 10_000


class BadParameter(ValueError):
    """A request parameter or body field that is not valid; ``parameter`` names it."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


class CruxHandler(web.RequestHandler):
    """Shared plumbing: the plugin, parameter parsing, JSON errors."""

    def initialize(self, plugin: CruxSchedulerPlugin) -> None:
        self.plugin = plugin

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.finish(json.dumps({"error": self._reason}))

    def fail(self, status: int, message: str, parameter: str | None = None) -> None:
        self.set_status(status)
        body = {"error": message}
        if parameter:
            body["parameter"] = parameter
        self.finish(json.dumps(body))

    def number(self, name: str, kind: type = float, default: Any = None,
               minimum: float | None = None) -> Any:
        raw = self.get_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            value = kind(raw)
        except ValueError:
            raise BadParameter(name, f"{name} must be a {kind.__name__}, got {raw!r}") from None
        if kind is float and not math.isfinite(value):
            raise BadParameter(name, f"{name} must be finite, got {raw!r}")
        if minimum is not None and value < minimum:
            raise BadParameter(name, f"{name} must be at least {minimum}, got {raw!r}")
        return value

    async def finish_in_pieces(self, pieces: Pieces | KeptPieces,
                               again: Callable[[], Awaitable[Pieces | KeptPieces]]) -> None:
        """Send a body made where the graph is built, in pieces, a piece per write.  If
        the graph process, which keeps them, is gone before the first, the body is made
        ``again()`` (by the process that took over, or by the scheduler)."""
        sent = 0

        async def send(piece: bytes) -> None:
            nonlocal sent
            self.write(piece)
            sent += 1
            await self.flush()

        try:
            try:
                await fetched(pieces, send)
            except GraphProcessGone:
                if sent:  # the body is cut short: the error is logged
                    raise
                await fetched(await again(), send)
        except StreamClosedError:  # the client went away
            return
        self.finish()

    async def answer(self, function: Callable[..., Pieces | KeptPieces], *args: Any) -> None:
        """Send ``function(store, end, *args)``, asked of the graph host (see
        :meth:`finish_in_pieces`)."""
        make = functools.partial(self.plugin.analyse, function, *args)
        await self.finish_in_pieces(await make(), make)

    def page(self) -> tuple[int, int]:
        """The ``offset`` and ``limit`` of a listing."""
        offset = self.number("offset", int, 0, minimum=0)
        limit = self.number("limit", int, 1000, minimum=1)
        if limit > MAX_LIMIT:
            raise BadParameter("limit", f"limit must be at most {MAX_LIMIT}, got {limit}")
        return offset, limit

    def state(self, name: str) -> int | None:
        value = self.number(name, int)
        states = self.plugin.progress().n_states
        if value is not None and not 0 <= value < states:
            raise BadParameter(name, f"{name} is not a state id (0 to {states - 1}), "
                                     f"got {value}")
        return value

    def respond(self, compute: Callable[[], Any]) -> None:
        """Answer with ``compute()`` as JSON, or a 400 naming a bad parameter."""
        try:
            self.finish(json.dumps(compute(), default=plain))
        except BadParameter as error:
            self.fail(400, str(error), error.parameter)
