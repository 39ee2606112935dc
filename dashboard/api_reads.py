"""The read routes of the JSON API: states, mutations, paths, computations, stats.

Reads are open, like the rest of the dashboard, and answer from the graph as
applied so far: a request never applies the events still queued.  Each is a
question the graph host answers off the event loop, where the graph is.
"""

from __future__ import annotations

import functools
from typing import Any

from crux_dask.dashboard.api_answers import (
    computations_json,
    mutations_json,
    path_json,
    state_json,
    states_json,
)
from crux_dask.dashboard.api_handler import BadParameter, CruxHandler
from crux_dask.plugins.scopes import path_of_graph, path_of_scope
from crux_dask.scopes import select
from crux_dask.wcp import METHODS


class StatesReader(CruxHandler):
    """``GET /states``: a page of the states, filtered by time, key, location or origin."""

    async def get(self) -> None:
        try:
            offset, limit = self.page()
            query = (self.number("start_time"), self.number("end_time"),
                     {name: value for name in ("key", "location", "origin")
                      if (value := self.get_argument(name, None)) is not None},
                     offset, limit)
        except BadParameter as error:
            self.fail(400, str(error), error.parameter)
            return
        await self.answer(states_json, *query)


class StateHandler(CruxHandler):
    async def get(self, state_id: str) -> None:
        if not state_id.isdigit() or int(state_id) >= self.plugin.progress().n_states:
            self.fail(404, f"no state {state_id}", "state_id")
            return
        make = functools.partial(self.plugin.analyse, state_json, int(state_id))
        body = await make()
        if body is None:  # spooled since
            self.fail(404, f"no state {state_id}", "state_id")
            return
        await self.finish_in_pieces(body, make)


class MutationsHandler(CruxHandler):
    async def get(self) -> None:
        try:
            offset, limit = self.page()
            kind = self.get_argument("kind", None)
            if kind is not None:
                from crux_dask.model import MutationKind

                try:
                    kind = int(MutationKind.parse(kind))
                except ValueError as error:
                    raise BadParameter("kind", str(error)) from None
        except BadParameter as error:
            self.fail(400, str(error), error.parameter)
            return
        await self.answer(mutations_json, kind, offset, limit)


class WCPHandler(CruxHandler):
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


class ComputationsHandler(CruxHandler):
    async def get(self) -> None:
        await self.answer(computations_json, self.plugin.scopes())


class StatsHandler(CruxHandler):
    def get(self) -> None:
        self.respond(self.plugin.stats)


class NotFoundHandler(CruxHandler):
    def get(self, *args: Any) -> None:
        self.fail(404, f"no such endpoint: {self.request.path}")
