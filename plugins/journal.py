"""The graph process's journal: what it did, in order, so that another can do it again.

Every step the graph process takes (:class:`~crux_dask.plugins.engine.Engine`)
is written down with each reading of a clock it made; the same steps with the
same readings make the same graph.  A generation of the journal is a snapshot
of the engine (pickled, when a process starts or resumes) and the steps after
it, an Arrow IPC stream.  A new process loads the latest generation and does
its steps again; so does :func:`~crux_dask.plugins.engine.recover`, for the
graph of a scheduler that is gone.

Each step is written to the operating system as it is flushed, and so
survives the death of the process that wrote it (not that of the machine:
nothing is synced).  A process killed while it wrote leaves a torn last step,
which reading skips.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

logger = logging.getLogger(__name__)

__all__ = ["Clocks", "Journal", "journals"]

#: One row a step: its name, what it took (pickled), the clock readings it made.
SCHEMA = pa.schema([("step", pa.string()), ("payload", pa.binary()),
                    ("clocks", pa.list_(pa.float64()))])
#: Where a journal lives, under the spool directory: one folder a recording.
FOLDER = "journal"


class Clocks:
    """The clocks a step reads: read and kept (:meth:`take`), or played back (:meth:`play`)."""

    def __init__(self) -> None:
        self._read: list[float] = []
        self._playing: Iterator[float] | None = None

    def monotonic(self) -> float:
        return self._reading(time.monotonic)

    def wall(self) -> float:
        return self._reading(time.time)

    def take(self) -> list[float]:
        """The readings since the last call."""
        read, self._read = self._read, []
        return read

    def play(self, readings: list[float] | None) -> None:
        """Answer the next readings with ``readings`` (``None``: read the clocks again)."""
        self._playing = None if readings is None else iter(readings)

    def _reading(self, clock: Any) -> float:
        if self._playing is not None:
            try:
                return next(self._playing)
            except StopIteration:
                raise RuntimeError("a step read a clock more often than when it was "
                                   "journaled") from None
        value = clock()
        self._read.append(value)
        return value

    def __getstate__(self) -> dict[str, Any]:
        return {"_read": [], "_playing": None}


class Journal:
    """The journal of one recording, in ``directory/journal/<run_id>``.

    Parameters
    ----------
    directory : str
        The spool directory.
    run_id : str
        The recording's id (that of its first segment).
    """

    def __init__(self, directory: str, run_id: str) -> None:
        self.path = Path(directory) / FOLDER / run_id
        self.path.mkdir(parents=True, exist_ok=True)
        self.generation = latest(self.path)
        self.steps = 0  # written in this generation
        self._rows: list[tuple[str, bytes, list[float]]] = []
        self._file: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def load(self) -> tuple[Any, Iterator[tuple[str, bytes, list[float]]]] | None:
        """The latest snapshot and the steps after it; ``None`` if there is none."""
        return None if self.generation < 0 else read(self.path, self.generation)

    def add(self, step: str, payload: bytes, clocks: list[float]) -> None:
        """Keep one step, to be written at the next :meth:`flush`."""
        self._rows.append((step, payload, clocks))

    def flush(self) -> bool:
        """Write the steps kept since the last flush; whether there were any."""
        if not self._rows or self._writer is None:
            return False
        rows, self._rows = self._rows, []
        steps, payloads, clocks = zip(*rows, strict=True)
        self._writer.write_batch(pa.record_batch([list(steps), list(payloads), list(clocks)],
                                                 schema=SCHEMA))
        self.steps += len(rows)
        return True

    def snapshot(self, state: Any) -> None:
        """Start a new generation from ``state`` (the steps kept are written first),
        and remove the ones before."""
        self.flush()
        self._close_stream()
        self.generation += 1
        stem = self.path / f"{self.generation:06d}"
        partial = stem.with_suffix(".partial")
        with open(partial, "wb") as file:
            pickle.dump(state, file, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, stem.with_suffix(".snapshot"))
        self._file = pa.OSFile(str(stem.with_suffix(".arrow")), "wb")
        self._writer = pa.ipc.new_stream(self._file, SCHEMA)
        self.steps = 0
        for older in self.path.iterdir():
            if older.stem < stem.name:
                older.unlink(missing_ok=True)

    def close(self, remove: bool = False) -> None:
        """Stop writing; with ``remove``, remove the journal (the recording ended well)."""
        self.flush()
        self._close_stream()
        if remove:
            shutil.rmtree(self.path, ignore_errors=True)

    def _close_stream(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._file.close()
            self._writer = self._file = None


def read(path: Path, generation: int) -> tuple[Any, Iterator[tuple[str, bytes, list[float]]]]:
    """The snapshot of ``generation`` in journal ``path``, and its steps, in order."""
    stem = path / f"{generation:06d}"
    with open(stem.with_suffix(".snapshot"), "rb") as file:
        state = pickle.load(file)
    return state, _steps(stem.with_suffix(".arrow"))


def journals(directory: str) -> list[Path]:
    """The journals left in a spool directory (by schedulers that did not close)."""
    root = Path(directory) / FOLDER
    return sorted(path for path in root.iterdir() if latest(path) >= 0) if root.is_dir() else []


def _steps(path: Path) -> Iterator[tuple[str, bytes, list[float]]]:
    if not path.exists():
        return
    try:
        with pa.OSFile(str(path), "rb") as file, pa.ipc.open_stream(file) as stream:
            for batch in stream:
                yield from zip(*(column.to_pylist() for column in batch.columns),
                               strict=True)
    except (pa.ArrowInvalid, OSError) as error:  # torn by a process killed as it wrote
        logger.warning("Crux read the journal %s up to a torn step: %r", path, error)


def latest(path: Path) -> int:
    """The latest generation with a snapshot in journal ``path`` (``-1``: none)."""
    return max((int(file.stem) for file in path.glob("*.snapshot")), default=-1)
