"""Emulation atoms: tasks that consume a given amount of one resource.

Each atom does real work of a known size — CPU time, memory held, bytes written
and read, bytes of output that must move between workers, or plain waiting —
so that a workflow built from atoms has a critical path known in advance.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

__all__ = [
    "compute",
    "compute_nogil",
    "hold_memory",
    "output",
    "read_file",
    "wait",
    "write_file",
]

_BLOCK = bytes(range(256)) * 256  # 64 KiB of input for hashing


def compute(seconds: float, *inputs: Any, nbytes: int = 0) -> bytes:
    """Spin the CPU (holding the GIL) for ``seconds``; return ``nbytes`` of output."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        for _ in range(1_000):
            x += 1
    return output(nbytes)


def compute_nogil(seconds: float, *inputs: Any, nbytes: int = 0) -> bytes:
    """Hash data for ``seconds``; hashlib releases the GIL, so other threads run."""
    end = time.perf_counter() + seconds
    digest = hashlib.sha256()
    while time.perf_counter() < end:
        digest.update(_BLOCK)
    return output(nbytes)


def hold_memory(nbytes: int, seconds: float, *inputs: Any) -> int:
    """Allocate and touch ``nbytes``, hold them for ``seconds``; return the size held."""
    block = bytearray(nbytes)
    for i in range(0, nbytes, 4096):  # touch every page so it is really resident
        block[i] = 1
    time.sleep(seconds)
    return len(block)


def write_file(path: str | os.PathLike, nbytes: int, block_size: int = 1 << 20,
               *inputs: Any, sync: bool = True) -> str:
    """Write ``nbytes`` to ``path`` in blocks of ``block_size``, synced to disk unless
    ``sync`` is false; return the path."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    block = b"\xab" * min(block_size, max(nbytes, 1))
    with open(path, "wb") as f:
        remaining = nbytes
        while remaining > 0:
            f.write(block[:remaining])
            remaining -= min(remaining, len(block))
        if sync:
            f.flush()
            os.fsync(f.fileno())
    return str(path)


def read_file(path: str | os.PathLike, block_size: int = 1 << 20, *inputs: Any) -> int:
    """Read ``path`` in blocks of ``block_size``; return the bytes read."""
    total = 0
    with open(path, "rb") as f:
        while chunk := f.read(block_size):
            total += len(chunk)
    return total


_RANDOM: list[bytes] = []


def output(nbytes: int) -> bytes:
    """``nbytes`` of incompressible data, so that moving it between workers is a real transfer.

    Copied from one random buffer made once per process: making fresh random
    bytes would cost milliseconds per megabyte, time the caller did not ask for.
    """
    if nbytes <= 0:
        return b""
    if not _RANDOM:
        _RANDOM.append(os.urandom(1 << 20))  # repeats beyond lz4's 64 KiB window
    pool = _RANDOM[0]
    if nbytes <= len(pool):
        return pool[:nbytes]
    return (pool * (nbytes // len(pool) + 1))[:nbytes]


def wait(seconds: float, *inputs: Any, nbytes: int = 0) -> bytes:
    """Sleep for ``seconds`` (an external service, a queue); return ``nbytes`` of output."""
    time.sleep(seconds)
    return output(nbytes)
