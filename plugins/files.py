"""Files that tasks open, seen through Python's audit hooks, without a change to user code.

Every ``open()`` (and ``os.open``, and what libraries build on them: pandas,
pyarrow's Python file objects, fsspec's local files) raises an ``open`` audit
event in the thread that opens the file.  A worker runs each task in a thread
of its own executor and marks that thread with the task's key
(``distributed.worker.thread_state``), so the hook knows which task opened
which file, and whether for writing, at the cost of a few attribute reads.
Sizes are taken when the task is done, once per file.

A task's seconds on files are the seconds its thread was off the CPU from
its first ``open`` to its end: the time it waited for storage (a read served
from the page cache costs CPU time, and counts as computing).  What its
thread read or wrote with calls that raise no audit event (a C library
opening files itself) is not seen.

Audit hooks cannot be removed: the hook is added once per process and does
nothing while no worker of the process records files.
"""

from __future__ import annotations

import os
import site
import sys
import threading
import time
from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any

from distributed.worker import thread_state

__all__ = ["FileRecorder"]

#: Recorders by the id of the worker they serve; the hook's only way in.
_recorders: dict[int, FileRecorder] = {}
_installed = False
_install_lock = threading.Lock()

#: Flags of an ``open`` that may change the file.
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: Files no task means to read as data: Python's own, the kernel's.
_SKIPPED_SUFFIXES = (".py", ".pyc", ".so", ".pth")
_SKIPPED_PREFIXES = ("/proc/", "/sys/", "/dev/")


def _audit(event: str, args: tuple) -> None:
    """The process's audit hook: hand an ``open`` by a task to its worker's recorder."""
    if event != "open" or not _recorders:
        return
    try:
        key = getattr(thread_state, "key", None)
        if key is None:
            return
        recorder = _recorders.get(id(thread_state.execution_state["worker"]))
        if recorder is not None:
            recorder.opened(key, args[0], args[2])
    except Exception:  # an audit hook that raises fails the open: never
        return


def _install() -> None:
    global _installed
    with _install_lock:
        if not _installed:
            sys.addaudithook(_audit)
            _installed = True


class FileRecorder:
    """The files the tasks of one worker opened, until each task is done.

    Parameters
    ----------
    worker : distributed.Worker
        The worker whose tasks are watched.
    include, exclude : iterable of str
        Glob patterns of paths: with ``include``, only paths matching one of
        them are recorded; paths matching an ``exclude`` pattern never are.
        The worker's own files (its local directory, where it spills), the
        Python installation's and ``/proc``, ``/sys`` and ``/dev`` are always
        left out, as are Python sources and extension modules.

    Attributes
    ----------
    by_task : dict
        For each task that opened files and is not done yet, ``{path: written}``.
    opened_files : int
        Opens recorded (a file opened twice by one task counts twice).
    """

    def __init__(self, worker: Any, include: Iterable[str] = (),
                 exclude: Iterable[str] = ()) -> None:
        self.worker = worker
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix,
                    *site.getsitepackages(), site.getusersitepackages(),
                    getattr(worker, "local_directory", None)}
        self.skipped = _SKIPPED_PREFIXES + tuple(
            os.path.join(os.path.abspath(p), "") for p in prefixes if p)
        self.opened_files = 0
        self.by_task: dict[Any, dict[str, bool]] = {}
        # key -> (wall, thread CPU, thread) at its first open
        self._first: dict[Any, tuple[float, float, int]] = {}

    def start(self) -> None:
        """Watch the worker's tasks from now on."""
        _install()
        _recorders[id(self.worker)] = self

    def stop(self) -> None:
        """Stop watching; what was recorded for tasks not done yet is dropped."""
        if _recorders.get(id(self.worker)) is self:
            del _recorders[id(self.worker)]
        self.by_task.clear()
        self._first.clear()

    def opened(self, key: Any, path: Any, flags: int) -> None:
        """The task ``key`` opened ``path`` with ``flags`` (in the task's thread)."""
        if type(path) is not str:
            if isinstance(path, int) or path is None:
                return  # a descriptor: its file was opened, and seen, before
            path = os.fsdecode(path)
        if flags & _DIRECTORY:
            return
        if path[:1] != "/":
            path = os.path.abspath(path)
        if path.startswith(self.skipped) or path.endswith(_SKIPPED_SUFFIXES):
            return
        if self.include and not any(fnmatchcase(path, p) for p in self.include):
            return
        if self.exclude and any(fnmatchcase(path, p) for p in self.exclude):
            return
        files = self.by_task.get(key)
        if files is None:
            self._first[key] = (time.time(), time.thread_time(), threading.get_ident())
            files = self.by_task[key] = {}
        files[path] = bool(flags & _WRITES) or files.get(path, False)
        self.opened_files += 1

    def done(self, key: Any, stop: float | None) -> tuple[float | None, list] | None:
        """What the task ``key``, done now, did with files: ``(io, files)`` or None.

        ``files`` are ``[path, written, size]`` (size ``-1`` for a file that
        is gone); ``io`` the seconds the task's thread was off the CPU from its
        first open to ``stop`` (the task's end in this process's clock), None
        where it cannot be read.  Called in the worker's event loop, after the
        task's thread let go of it.
        """
        files = self.by_task.pop(key, None)
        first = self._first.pop(key, None)
        if files is None or first is None:
            return None
        opened_at, cpu_at, thread = first
        io = None
        if stop is not None:
            try:
                cpu = time.clock_gettime(time.pthread_getcpuclockid(thread)) - cpu_at
                io = max(0.0, (stop - opened_at) - cpu)
            except (OSError, AttributeError, ValueError):
                io = None
        return io, [[path, written, _size(path)] for path, written in files.items()]

    def forget(self, key: Any) -> None:
        """The task ``key`` ended without a result: what it opened is not recorded."""
        self.by_task.pop(key, None)
        self._first.pop(key, None)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1
