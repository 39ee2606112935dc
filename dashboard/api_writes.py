"""The write routes of the JSON API: the states that applications outside Dask add.

Writes are refused unless ``crux-dask.http.token`` is set, and then need that
token as a bearer token; each applies its own state at once, so that its id can
be returned.
"""

from __future__ import annotations

import hmac
import json
import math

from crux_dask.dashboard.api_handler import BadParameter, CruxHandler
from crux_dask.plugins.graph_process import GraphProcessGone


class StateWriter(CruxHandler):
    """What a write does: check its token and body, add its state, answer with its id."""

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
        token = self.plugin.settings.http_token
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
        if len(self.request.body) > self.plugin.settings.http_max_body:
            self.plugin.count_http_write(accepted=False)
            self.fail(413, f"body over {self.plugin.settings.http_max_body} bytes")
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


class NewDataWriter(StateWriter):
    """``POST /states``: an external application's new data."""

    async def post(self) -> None:
        """An external application's new data (an APPEND from the run's root)."""
        await self.write_state("APPEND", external=False)


class MutationWriteHandler(StateWriter):
    """``POST /mutations/{kind}``: an external operation that made a new state."""


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
