"""A small client for applications outside Dask (standard library only).

An MPI code, a shell script or a service adds its data states to the
workflow's graph through the scheduler's ``/crux/api/v1`` routes::

    from crux_dask.external import CruxWriter

    crux = CruxWriter("http://scheduler:8787", token="...")
    [prep] = crux.states(key="prep")                  # a Dask task's output
    out = crux.mutation("CONVERT", src=prep["state_id"], key="mpi-out",
                        location="file@node1:/scratch/out.h5", start=t0, stop=t1)

The same with curl::

    curl -X POST -H "Authorization: Bearer $TOKEN" \\
         -d '{"src": 12, "key": "mpi-out", "location": "file@node1:/out.h5",
              "start": 1790000000.0, "stop": 1790000042.5}' \\
         http://scheduler:8787/crux/api/v1/mutations/convert
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["CruxHTTPError", "CruxWriter"]


class CruxHTTPError(RuntimeError):
    """The scheduler refused a request; ``status`` and ``body`` say why."""

    def __init__(self, status: int, body: dict) -> None:
        super().__init__(f"{status}: {body.get('error', body)}")
        self.status = status
        self.body = body


class CruxWriter:
    """Add data states and mutations to a running Crux graph over HTTP.

    Parameters
    ----------
    address : str
        The scheduler's dashboard address, e.g. ``http://scheduler:8787``.
    token : str, optional
        The configured ``crux-dask.http.token`` (needed to write).
    timeout : float
        Seconds to wait for each request.
    """

    def __init__(self, address: str, token: str | None = None, timeout: float = 10.0) -> None:
        self.base = address.rstrip("/") + "/crux/api/v1"
        self.token = token
        self.timeout = timeout

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            try:
                detail = json.loads(error.read() or b"{}")
            except ValueError:
                detail = {}
            raise CruxHTTPError(error.code, detail) from None

    def state(self, key: str, location: str, time: float, size: int = 0,
              label: str | None = None, origin: str = "external") -> int:
        """New data (a file that appeared, a message received); returns its state id."""
        body = {"key": key, "location": location, "time": time, "size": size,
                "origin": origin, "label": label or key}
        return self._request("POST", "/states", body)["state_id"]

    def mutation(self, kind: str, src: int | list[int], key: str, location: str,
                 start: float, stop: float, size: int = 0, label: str | None = None,
                 origin: str = "external") -> int:
        """An operation on existing states that made a new one; returns its state id."""
        body = {"src": src, "key": key, "location": location, "start": start, "stop": stop,
                "size": size, "origin": origin, "label": label or key}
        return self._request("POST", f"/mutations/{kind.lower()}", body)["state_id"]

    def states(self, **filters: Any) -> list[dict]:
        """States matching ``filters`` (``key``, ``location``, ``origin``, ...)."""
        query = urllib.parse.urlencode({"limit": 10_000, **filters})
        return self._request("GET", f"/states?{query}")["states"]

    def wcp(self, **params: Any) -> dict:
        """The workflow critical path (``start``, ``end``, ``method``)."""
        query = urllib.parse.urlencode(params)
        return self._request("GET", f"/wcp?{query}")
