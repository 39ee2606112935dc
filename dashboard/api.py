"""Read-only JSON API on the scheduler's web server (``/crux/api/v1/...``)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from tornado import web

from crux_dask.wcp import METHODS

PREFIX = "crux/api/v1"
MAX_LIMIT = 10_000


class BadParameter(ValueError):
    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


class CruxHandler(web.RequestHandler):
    """Shared plumbing: the plugin, parameter parsing, JSON errors."""

    def initialize(self, plugin: Any) -> None:
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

    def state(self, name: str) -> int | None:
        value = self.number(name, int)
        if value is not None and not 0 <= value < self.store.n_states:
            raise BadParameter(name, f"{name} is not a state id (0 to "
                                     f"{self.store.n_states - 1}), got {value}")
        return value

    @property
    def store(self):
        return self.plugin.builder.store

    def respond(self, compute) -> None:
        try:
            self.plugin.apply_pending()
            self.finish(json.dumps(compute(), default=_plain))
        except BadParameter as error:
            self.fail(400, str(error), error.parameter)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def _records(frame) -> list[dict]:
    frame = frame.astype(object).where(frame.notna(), None)
    return frame.to_dict(orient="records")


class StatesHandler(CruxHandler):
    def get(self) -> None:
        self.respond(self._states)

    def _states(self) -> dict:
        store = self.store
        offset = self.number("offset", int, 0, minimum=0)
        limit = self.number("limit", int, 1000, minimum=1)
        if limit > MAX_LIMIT:
            raise BadParameter("limit", f"limit must be at most {MAX_LIMIT}, got {limit}")
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
    def get(self, state_id: str) -> None:
        self.plugin.apply_pending()
        store = self.store
        if not state_id.isdigit() or int(state_id) >= store.n_states:
            self.fail(404, f"no state {state_id}", "state_id")
            return
        self.finish(json.dumps(_records(store.states_frame(np.array([int(state_id)])))[0],
                               default=_plain))


class MutationsHandler(CruxHandler):
    def get(self) -> None:
        self.respond(self._mutations)

    def _mutations(self) -> dict:
        store = self.store
        offset = self.number("offset", int, 0, minimum=0)
        limit = self.number("limit", int, 1000, minimum=1)
        if limit > MAX_LIMIT:
            raise BadParameter("limit", f"limit must be at most {MAX_LIMIT}, got {limit}")
        ids = np.arange(store.n_mutations)
        kind = self.get_argument("kind", None)
        if kind is not None:
            from crux_dask.schema import MutationKind

            try:
                code = int(MutationKind.parse(kind))
            except ValueError as error:
                raise BadParameter("kind", str(error)) from None
            ids = ids[store.column("mutation_kind") == code]
        page = ids[offset:offset + limit]
        return {"total": len(ids), "offset": offset, "limit": limit,
                "mutations": _records(store.mutations_frame(page))}


class WCPHandler(CruxHandler):
    def get(self) -> None:
        self.respond(self._wcp)

    def _wcp(self) -> dict:
        method = self.get_argument("method", "observed")
        if method not in METHODS:
            raise BadParameter("method", f"method must be one of {', '.join(METHODS)}, "
                                         f"got {method!r}")
        start, end = self.state("start"), self.state("end")
        builder = self.plugin.builder
        from crux_dask.wcp import critical_path

        try:
            path = critical_path(builder.store, start, end, method, default_end=builder.end)
        except ValueError as error:
            raise BadParameter("start" if start is not None else "end", str(error)) from None
        return {"method": method, "length": path.length, "breakdown": path.breakdown,
                "states": _records(path.states), "steps": _records(path.to_frame())}


class StatsHandler(CruxHandler):
    def get(self) -> None:
        self.respond(self.plugin.stats)


class NotFoundHandler(CruxHandler):
    def get(self, *args: Any) -> None:
        self.fail(404, f"no such endpoint: {self.request.path}")


def routes(plugin: Any, prefix: str = "/") -> list[tuple]:
    base = "/" + "/".join(p for p in (prefix.strip("/"), PREFIX) if p)
    options = {"plugin": plugin}
    return [
        (f"{base}/states", StatesHandler, options),
        (rf"{base}/states/([^/]+)", StateHandler, options),
        (f"{base}/mutations", MutationsHandler, options),
        (f"{base}/wcp", WCPHandler, options),
        (f"{base}/stats", StatsHandler, options),
        (rf"{base}/(.*)", NotFoundHandler, options),
    ]


def install_routes(scheduler: Any, plugin: Any, prefix: str = "/") -> bool:
    """Add the JSON routes to the scheduler's web server; ``False`` if it has none."""
    application = getattr(scheduler, "http_application", None)
    if application is None:
        return False
    application.add_handlers(r".*", routes(plugin, prefix))
    return True
