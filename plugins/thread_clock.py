"""The clocks of a worker's threads: the CPU seconds each has run, and waited to run.

A task runs on one thread of its worker from its start to its end, so the
difference of its thread's clocks between the end of the task before it
there and its own end is what the task spent on the CPU, and waiting for a
core while it could run.  Both are Linux's own account of each thread
(``/proc/self/task/<id>/schedstat``: time on a CPU, then time runnable on a
run queue), where there is one: a thread still running as it is read may be
a scheduler tick behind there, which the next task on it makes up.  A thread
that is gone has no account, and reads as unknown.  (CPython's
``time.pthread_getcpuclockid`` is no way to read another thread: given a
thread that has ended, as an executor's may have by the time its task's end
is handled, it reads freed memory, and the worker crashed with a
segmentation fault.)
"""

from __future__ import annotations

import os
import threading

__all__ = ["ThreadClocks", "thread_cpu"]

_NS = 1e-9
#: ``os.open`` as it is before :mod:`crux_dask.plugins.files` watches it (that module
#: imports this one first).  Noting a task's first file reads its thread's clock: through
#: the watched ``os.open``, that read would be noted as the task's first file again, and
#: so on until the stack ran out.
_open_account = os.open


def thread_cpu(thread: int) -> float | None:
    """The CPU seconds of ``thread`` (a thread identifier) so far; None where unknown
    (a thread that is gone, a platform without Linux's account of threads)."""
    fd = _open(thread)
    if fd is None:
        return None
    try:
        return _clocks(fd)[0]
    finally:
        os.close(fd)


class ThreadClocks:
    """What each thread of this process ran and waited since it was last asked."""

    def __init__(self) -> None:
        # thread identifier -> its account's descriptor, its clocks when last read
        self._files: dict[int, int] = {}
        self._last: dict[int, tuple[float | None, float | None]] = {}
        for thread in threading.enumerate():
            if thread.ident is not None:
                self._last[thread.ident] = self._read(thread.ident)

    def since(self, thread: int, busy: bool = False) -> tuple[float | None, float | None]:
        """``(cpu, waited)``: the seconds ``thread`` ran on a CPU and waited for one since
        it was last asked (or since these clocks were made; all of them for a thread
        started since), None where they cannot be read.

        ``busy``: what the thread ran since holds a part of another task's
        run, which is not known, nor, next time, the rest of it (None then).
        """
        now = self._read(thread)
        before = self._last.get(thread, (0.0, 0.0))
        self._last[thread] = (None, None) if busy else now
        return tuple(None if a is None or b is None else max(a - b, 0.0)  # type: ignore
                     for a, b in zip(now, before))

    def close(self) -> None:
        """Let go of the threads' accounts."""
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def _read(self, thread: int) -> tuple[float | None, float | None]:
        # Each thread's account stays open and is read again from its start (a
        # microsecond; opening it each time took fourteen).
        fd = self._files.get(thread)
        if fd is None:
            fd = _open(thread)
            if fd is None:
                return None, None
            self._files[thread] = fd
        clocks = _clocks(fd)
        if clocks[0] is None:  # gone: its identifier may come again, for another thread
            os.close(self._files.pop(thread))
        return clocks


def _open(thread: int) -> int | None:
    """A descriptor of the account of ``thread`` (a thread identifier); None if none."""
    native = next((t.native_id for t in threading.enumerate() if t.ident == thread), None)
    if native is None:
        return None
    try:
        return _open_account(f"/proc/self/task/{native}/schedstat", os.O_RDONLY)
    except OSError:  # gone, or not Linux
        return None


def _clocks(fd: int) -> tuple[float | None, float | None]:
    """``(cpu, waited)`` seconds so far of the thread whose account ``fd`` is."""
    try:
        ran, waited = os.pread(fd, 128, 0).split()[:2]
        return int(ran) * _NS, int(waited) * _NS
    except (OSError, ValueError):  # the thread is gone
        return None, None
