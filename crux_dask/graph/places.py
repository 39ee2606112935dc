"""Location codes, and the worker each location belongs to."""

from __future__ import annotations

from crux_dask.growable import NO_CODE
from crux_dask.model import ROOT, memory_location
from crux_dask.store import PAGStore

__all__ = ["Places", "worker_of"]


def worker_of(location: str) -> str | None:
    """The worker whose memory or disk ``location`` is (``None`` for other places)."""
    head, sep, rest = location.partition("@")
    return rest if sep and head in ("memory", "disk") else None


class Places:
    """The codes of a store's locations, and of the workers they belong to.

    Attributes
    ----------
    worker : dict of int to int
        Location code -> worker code (``NO_CODE`` for a file, the client, the root).
    memory : dict of str to int
        Worker address -> code of its memory.
    root : int
        Code of the ``root`` location.
    """

    def __init__(self, store: PAGStore) -> None:
        self.store = store
        self.worker: dict[int, int] = {}
        self.memory: dict[str, int] = {}
        self.root = self.code(ROOT)

    def code(self, location: str) -> int:
        """The code of ``location``, added if new."""
        locations = self.store.locations
        code = locations.codes.get(location)
        if code is None:
            code = locations.code(location)
            worker = worker_of(location)
            self.worker[code] = NO_CODE if worker is None else self.store.workers.code(worker)
        return code

    def memory_of(self, worker: str) -> int:
        """The code of ``worker``'s memory."""
        code = self.memory.get(worker)
        if code is None:
            code = self.memory[worker] = self.code(memory_location(worker))
        return code
