"""The read routes of the JSON API: states, mutations, paths, computations, stats.

Reads are open, like the rest of the dashboard, and answer from the graph as
applied so far: a request never applies the events still queued.  The path of
one computation or span, and the table of them, are computed off the event loop
on a copy of the graph.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from crux_dask.dashboard.api_answers import computations_json, path_json, plain, records
from crux_dask.dashboard.api_handler import BadParameter, CruxHandler
from crux_dask.plugins.scopes import path_of_graph, path_of_scope
from crux_dask.scopes import select
from crux_dask.wcp import METHODS


class StatesReader(CruxHandler):
    """``GET /states``: a page of the states, filtered by time, key, location or origin."""

    reads_graph = True

    def get(self) -> None:
        self.respond(self._states)

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
                "states": records(store.states_frame(page))}


class StateHandler(CruxHandler):
    reads_graph = True

    def get(self, state_id: str) -> None:
        store = self.store
        if not state_id.isdigit() or int(state_id) >= store.n_states:
            self.fail(404, f"no state {state_id}", "state_id")
            return
        self.finish(json.dumps(records(store.states_frame(np.array([int(state_id)])))[0],
                               default=plain))


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
                "mutations": records(store.mutations_frame(page))}


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
