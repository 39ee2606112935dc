"""JSON API on the scheduler's web server (``/crux/api/v1/...``).

Reads are open, like the rest of the dashboard, and answer from the graph as
applied so far: a request never applies the events still queued.  Writes — the
POST routes through which applications outside Dask add their data states —
are refused unless ``crux-dask.http.token`` is set, and then need that token
as a bearer token; each applies its own state at once, so that its id can be
returned.

Handlers use only the plugin's public interface: ``builder`` (read, once
``caught_up()``), ``stats()``, ``scopes()``, ``analyse()``, ``add_external()``,
``count_http_write()``, ``http_token`` and ``http_max_body``.  The path of one
computation or span, and the table of them, are computed off the event loop
on a copy of the graph.
"""

from __future__ import annotations

import functools
import hmac
import json
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from tornado import web
from tornado.iostream import StreamClosedError

from crux_dask.plugins.graph_process import GraphProcessGone
from crux_dask.plugins.scopes import path_of_graph, path_of_scope, scopes_table
from crux_dask.plugins.staging import KeptPieces, Pieces, fetched
from crux_dask.scopes import select
from crux_dask.wcp import METHODS

if TYPE_CHECKING:
    import pandas as pd

    from crux_dask.path import CriticalPath
    from crux_dask.plugins.scheduler import CruxSchedulerPlugin
    from crux_dask.store import PAGStore

PREFIX = "crux/api/v1"
MAX_LIMIT = 10_000


class BadParameter(ValueError):
    """A request parameter or body field that is not valid; ``parameter`` names it."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


class CruxHandler(web.RequestHandler):
    """Shared plumbing: the plugin, parameter parsing, JSON errors."""

    #: Whether a GET reads the graph applied so far (:attr:`store`).
    reads_graph = False

    def initialize(self, plugin: CruxSchedulerPlugin) -> None:
        self.plugin = plugin

    async def prepare(self) -> None:
        if self.reads_graph and self.request.method == "GET":
            await self.plugin.caught_up()  # every state received, a few milliseconds at a time

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
        ``again()`` (by the scheduler then, on its copy of the graph)."""
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

    def page(self) -> tuple[int, int]:
        """The ``offset`` and ``limit`` of a listing."""
        offset = self.number("offset", int, 0, minimum=0)
        limit = self.number("limit", int, 1000, minimum=1)
        if limit > MAX_LIMIT:
            raise BadParameter("limit", f"limit must be at most {MAX_LIMIT}, got {limit}")
        return offset, limit

    def state(self, name: str) -> int | None:
        value = self.number(name, int)
        if value is not None and not 0 <= value < self.store.n_states:
            raise BadParameter(name, f"{name} is not a state id (0 to "
                                     f"{self.store.n_states - 1}), got {value}")
        return value

    @property
    def store(self) -> PAGStore:
        """The graph applied so far."""
        return self.plugin.builder.store

    def respond(self, compute: Callable[[], Any]) -> None:
        """Answer with ``compute()`` as JSON, or a 400 naming a bad parameter."""
        try:
            self.finish(json.dumps(compute(), default=_plain))
        except BadParameter as error:
            self.fail(400, str(error), error.parameter)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def _records(frame: pd.DataFrame) -> list[dict]:
    frame = frame.astype(object).where(frame.notna(), None)
    return frame.to_dict(orient="records")


class StatesHandler(CruxHandler):
    reads_graph = True

    def get(self) -> None:
        self.respond(self._states)

    async def post(self) -> None:
        """An external application's new data (an APPEND from the run's root)."""
        await self.write_state("APPEND", external=False)

    async def write_state(self, kind: str, external: bool = True) -> None:
        body = self.authorised_body()
        if body is None:
            return
        try:
            fields = _check_body(body, kind, sources=external)
            try:
                state = await self.plugin.add_external(kind, **fields)
            except ValueError as error:
                raise BadParameter("src", str(error)) from None
            except GraphProcessGone as error:  # the graph is not being recorded any more
                self.plugin.count_http_write(accepted=False)
                self.fail(503, str(error))
                return
        except BadParameter as error:
            self.plugin.count_http_write(accepted=False)
            self.fail(404 if error.parameter == "src" and "no state" in str(error) else 400,
                      str(error), error.parameter)
            return
        self.plugin.count_http_write(accepted=True)
        self.set_status(201)
        self.finish(json.dumps({"state_id": state}))

    def authorised_body(self) -> dict | None:
        """The request's JSON body, or ``None`` after answering 403/401/413/400."""
        token = self.plugin.http_token
        if not token:
            self.plugin.count_http_write(accepted=False)
            self.fail(403, "writes are disabled: set crux-dask.http.token to enable them")
            return None
        given = self.request.headers.get("Authorization", "")
        expected = f"Bearer {token}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            self.plugin.count_http_write(accepted=False)
            self.fail(401, "missing or wrong bearer token")
            return None
        if len(self.request.body) > self.plugin.http_max_body:
            self.plugin.count_http_write(accepted=False)
            self.fail(413, f"body over {self.plugin.http_max_body} bytes")
            return None
        try:
            body = json.loads(self.request.body or b"null")
        except (ValueError, UnicodeDecodeError) as error:
            self.plugin.count_http_write(accepted=False)
            self.fail(400, f"body is not JSON: {error}", "body")
            return None
        if not isinstance(body, dict):
            self.plugin.count_http_write(accepted=False)
            self.fail(400, "body must be a JSON object", "body")
            return None
        return body

    def _states(self) -> dict:
        store = self.store
        offset, limit = self.page()
        start = self.number("start_time")
        end = self.number("end_time")
        mask = np.ones(store.n_states, dtype=bool)
        if start is not None or end is not None:
            time = store.column("state_time")
            mask &= time >= (start if start is not None else -np.inf)
            mask &= time <= (end if end is not None else np.inf)
        for name, table, column, via_key in (
                ("key", store.keys, "state_key", False),
                ("location", store.locations, "state_location", False),
                ("origin", store.labels, "key_origin", True)):
            wanted = self.get_argument(name, None)
            if wanted is None:
                continue
            codes = [i for i, v in enumerate(table.values) if v == wanted]
            values = store.column(column)
            if via_key:
                values = values[store.column("state_key")]
            mask &= np.isin(values, codes)
        ids = np.flatnonzero(mask)
        page = ids[offset:offset + limit]
        return {"total": len(ids), "offset": offset, "limit": limit,
                "states": _records(store.states_frame(page))}


class StateHandler(CruxHandler):
    reads_graph = True

    def get(self, state_id: str) -> None:
        store = self.store
        if not state_id.isdigit() or int(state_id) >= store.n_states:
            self.fail(404, f"no state {state_id}", "state_id")
            return
        self.finish(json.dumps(_records(store.states_frame(np.array([int(state_id)])))[0],
                               default=_plain))


class MutationsHandler(CruxHandler):
    reads_graph = True

    def get(self) -> None:
        self.respond(self._mutations)

    def _mutations(self) -> dict:
        store = self.store
        offset, limit = self.page()
        ids = np.arange(store.n_mutations)
        kind = self.get_argument("kind", None)
        if kind is not None:
            from crux_dask.model import MutationKind

            try:
                code = int(MutationKind.parse(kind))
            except ValueError as error:
                raise BadParameter("kind", str(error)) from None
            ids = ids[store.column("mutation_kind") == code]
        page = ids[offset:offset + limit]
        return {"total": len(ids), "offset": offset, "limit": limit,
                "mutations": _records(store.mutations_frame(page))}


class MutationWriteHandler(StatesHandler):
    """``POST /mutations/{kind}``: an external operation that made a new state."""

    reads_graph = False

    def get(self, kind: str) -> None:
        self.fail(405, "use POST to add a mutation; GET /mutations lists them")

    async def post(self, kind: str) -> None:
        from crux_dask.model import MutationKind

        try:
            MutationKind.parse(kind)
        except ValueError as error:
            self.fail(404, str(error), "kind")
            return
        await self.write_state(kind.upper(), external=kind.upper() != "APPEND")


def _check_body(body: dict, kind: str, sources: bool) -> dict:
    """The builder's arguments from a write request; BadParameter names the bad field."""
    allowed = {"key", "label", "origin", "location", "size", "time", "start", "stop", "src"}
    unknown = set(body) - allowed
    if unknown:
        raise BadParameter(sorted(unknown)[0], f"unknown field {sorted(unknown)[0]!r}")

    def text(name: str, default: str | None = None) -> str:
        value = body.get(name, default)
        if not isinstance(value, str) or not value or len(value) > 4096:
            raise BadParameter(name, f"{name} must be a non-empty string")
        return value

    def seconds(name: str, default: float | None = None) -> float:
        value = body.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise BadParameter(name, f"{name} must be a finite number (seconds since the epoch)")
        return float(value)

    key = text("key")
    stop = seconds("stop", body.get("time"))
    start = seconds("start", stop)
    if start > stop:
        raise BadParameter("start", "start is after stop")
    size = body.get("size", 0)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise BadParameter("size", "size must be a non-negative integer (bytes)")
    src = body.get("src", [])
    src = [src] if isinstance(src, int) and not isinstance(src, bool) else src
    if not isinstance(src, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in src):
        raise BadParameter("src", "src must be a state id or a list of them")
    if sources and not src:
        raise BadParameter("src", f"a {kind} needs at least one source state")
    if not sources and src:
        raise BadParameter("src", "new data has no source: use POST /mutations/{kind}")
    return {"sources": src, "key": key, "label": text("label", key),
            "origin": text("origin", "external"), "location": text("location"),
            "size": size, "start": start, "stop": stop}


class WCPHandler(CruxHandler):
    reads_graph = True

    async def get(self) -> None:
        whole = self.get_argument("computation", None) is None and self.get_argument(
            "span", None) is None
        try:  # computed off the event loop
            method = self.method()
            if whole:
                start, end = self.state("start"), self.state("end")
                make = functools.partial(self.plugin.analyse, path_json, method,
                                         path_of_graph, start, end, method)
                try:
                    body = await make()
                except ValueError as error:
                    raise BadParameter("start" if start is not None else "end",
                                       str(error)) from None
            else:
                scope = select(self.plugin.scopes(), self.number("computation", int),
                               self.get_argument("span", None))
                make = functools.partial(self.plugin.analyse, path_json, method,
                                         path_of_scope, scope, method)
                body = await make()
        except BadParameter as error:
            self.fail(400, str(error), error.parameter)
            return
        except ValueError as error:
            self.fail(400, str(error), "span" if "span" in str(error) else "computation")
            return
        await self.finish_in_pieces(body, make)

    def method(self) -> str:
        method = self.get_argument("method", "observed")
        if method not in METHODS:
            raise BadParameter("method", f"method must be one of {', '.join(METHODS)}, "
                                         f"got {method!r}")
        return method


# -- analyses (see CruxSchedulerPlugin.analyse): the JSON of a long path or table is made
# where it is computed, not on the event loop, and sent in pieces: tens of megabytes for a
# long path, which the loop would otherwise receive, encode and write in one call each.
def path_json(store: PAGStore, end: int, method: str, function: Callable[..., CriticalPath],
              *args: Any) -> Pieces:
    """The JSON of the path ``function(store, end, *args)`` found by ``method``."""
    path = function(store, end, *args)
    return Pieces.cut(json.dumps({"method": method, "length": path.length,
                                  "breakdown": path.breakdown,
                                  "states": _records(path.states),
                                  "steps": _records(path.to_frame())},
                                 default=_plain).encode())


def computations_json(store: PAGStore, end: int, scopes: list) -> Pieces:
    """The JSON of the table of computations and spans (:func:`scopes_table`)."""
    return Pieces.cut(json.dumps({"computations": _records(scopes_table(store, end, scopes))},
                                 default=_plain).encode())


class ComputationsHandler(CruxHandler):
    async def get(self) -> None:
        make = functools.partial(self.plugin.analyse, computations_json, self.plugin.scopes())
        await self.finish_in_pieces(await make(), make)


class StatsHandler(CruxHandler):
    def get(self) -> None:
        self.respond(self.plugin.stats)


class NotFoundHandler(CruxHandler):
    def get(self, *args: Any) -> None:
        self.fail(404, f"no such endpoint: {self.request.path}")


def routes(plugin: CruxSchedulerPlugin, prefix: str = "/") -> list[tuple]:
    """The Crux JSON routes under ``prefix``, each handler bound to ``plugin``."""
    base = "/" + "/".join(p for p in (prefix.strip("/"), PREFIX) if p)
    options = {"plugin": plugin}
    return [
        (f"{base}/states", StatesHandler, options),
        (rf"{base}/states/([^/]+)", StateHandler, options),
        (f"{base}/mutations", MutationsHandler, options),
        (rf"{base}/mutations/([a-zA-Z]+)", MutationWriteHandler, options),
        (f"{base}/wcp", WCPHandler, options),
        (f"{base}/computations", ComputationsHandler, options),
        (f"{base}/stats", StatsHandler, options),
        (rf"{base}/(.*)", NotFoundHandler, options),
    ]


def install_routes(scheduler: Any, plugin: CruxSchedulerPlugin, prefix: str = "/") -> bool:
    """Add the JSON routes to the scheduler's web server; ``False`` if it has none."""
    application = getattr(scheduler, "http_application", None)
    if application is None:
        return False
    application.add_handlers(r".*", routes(plugin, prefix))
    return True
