"""Files that tasks open, seen through Python's audit hooks, without a change to user code.

Every ``open()`` (and ``os.open``, and what libraries build on them: pandas,
pyarrow's Python file objects, fsspec's local files) raises an ``open`` audit
event in the thread that opens the file.  A worker runs each task in a thread
of its own executor and marks that thread with the task's key
(``distributed.worker.thread_state``), so the hook knows which task opened
which file, and whether for writing, at the cost of a few attribute reads.
Sizes are taken when the task is done, once per file: in the worker's event
loop for a task that opened a few files, in a thread of their own for one
that opened many (:class:`crux_dask.plugins.worker.CruxWorkerPlugin`).

Some libraries open files in threads of their own while the task's thread
waits (zarr's stores, through an event loop and a thread pool of their own):
an ``open`` in a thread that runs no task is the task's when it is the only
one running on the worker (``Worker.active_threads``); with several running,
whose it is cannot be told, and it is not recorded.

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
import stat
import sys
import threading
import time
from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any

from distributed.worker import thread_state

__all__ = ["FileRecorder"]

#: Recorders by the id of the worker they serve; the hook's only way in, and
#: the only one when there is one (a worker process has one worker).
_recorders: dict[int, FileRecorder] = {}
_single: FileRecorder | None = None
#: The only recorder's :attr:`FileRecorder.by_task` (None unless there is one).
_single_by_task: dict | None = None
_installed = False
_install_lock = threading.Lock()

#: Flags of an ``open`` that may change the file.
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: The flags noted for the old and the new name of a file given another name.
_MOVED_AWAY, _MOVED_HERE = -1, -2
#: Files no task means to read as data: Python's own, the kernel's.
_SKIPPED_SUFFIXES = (".py", ".pyc", ".so", ".pth")
_SKIPPED_PREFIXES = ("/proc/", "/sys/", "/dev/")


def _audit(event: str, args: tuple, _state: Any = thread_state) -> None:
    """The process's audit hook: note an ``open`` (or a file moved) by a task for its
    worker's recorder.

    As little as can be, in the task's thread (the default saves a global
    lookup): with one recorder in the process (a worker process has one
    worker), an ``open`` of a task that opened files before costs two
    lookups and two appends of its path and flags to the task's list (kept
    as a tuple, each open would keep one more object for the garbage
    collector to walk); anything else goes to :func:`_open_slowly`, and the
    rest waits for :meth:`FileRecorder.take`.  A file written under a
    temporary name and then renamed (or linked) to its own, as zarr's stores
    write, is noted as both names, the first marked as moved away and the
    second as written.
    """
    if event == "open":
        try:
            opened = _single_by_task[_state.key]
        except Exception:  # no single recorder, no task in this thread, or its first open
            _open_slowly(args[0], args[2])
            return
        opened.append(args[0])
        opened.append(args[2])
    # A file given another name (os.replace raises os.rename), noted as two opens. Two
    # comparisons, not a set: each event is a new string, whose hash a set would
    # compute, and nearly all events (builtins.id, 90 a task) differ in length.
    elif event == "os.rename" or event == "os.link":
        _audit("open", (args[0], None, _MOVED_AWAY))
        _audit("open", (args[1], None, _MOVED_HERE))


def _open_slowly(path: Any, flags: int, _state: Any = thread_state) -> None:
    """An ``open`` the hook's quick way does not cover: the first of a task, one in a
    thread that runs no task, or any while several recorders share the process."""
    if not _recorders:
        return
    try:
        key = getattr(_state, "key", None)
        if key is None:  # no task's thread: perhaps one working for a task
            _note_for_a_task(path, flags)
            return
        recorder = _single or _recorders[id(_state.execution_state["worker"])]
        recorder.note(key, threading.get_ident(), path, flags)
    except Exception:  # an audit hook that raises fails the open: never
        return


def _note_for_a_task(path: Any, flags: int) -> None:
    """Noted in a thread that runs no task: the running task's, if only one runs.

    Never the worker's own threads' (its event loop's): those open its
    spill files, its logs, its configuration.
    """
    recorder = _single
    if recorder is None or threading.get_ident() == recorder.loop_thread:
        return
    running = recorder.worker.active_threads
    if len(running) != 1:
        return
    ((thread, key),) = running.items()  # may have changed meanwhile: the caller catches
    recorder.note(key, thread, path, flags)


def _single_or_none() -> None:
    """Set the recorder the hook's quick way takes: the only one, if there is one."""
    global _single, _single_by_task
    _single = next(iter(_recorders.values())) if len(_recorders) == 1 else None
    _single_by_task = None if _single is None else _single.by_task


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
        For each task that opened files and is not done yet, the path and
        flags of each ``open``, one after the other.
    opened_files : int
        Files recorded (a file opened by two tasks counts twice).
    gone : int
        Files left out because they were gone (or not regular files) when
        their task was done.
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
        self.gone = 0
        self.by_task: dict[Any, list] = {}
        # key -> (wall, thread CPU, thread) at its first open
        self._first: dict[Any, tuple[float, float, int]] = {}

    def start(self) -> None:
        """Watch the worker's tasks from now on (call it in the worker's event loop)."""
        self.loop_thread = threading.get_ident()
        _install()
        _recorders[id(self.worker)] = self
        _single_or_none()

    def stop(self) -> None:
        """Stop watching; what was recorded for tasks not done yet is dropped."""
        if _recorders.get(id(self.worker)) is self:
            del _recorders[id(self.worker)]
        _single_or_none()
        self.by_task.clear()
        self._first.clear()

    def note(self, key: Any, thread: int, path: Any, flags: int) -> None:
        """The task ``key``, run by ``thread``, opens (or moves) ``path`` now."""
        opened = self.by_task.get(key)
        if opened is None:  # its first: when, and its thread's CPU time then
            self._first[key] = (time.time(), _cpu_seconds(thread), thread)
            opened = self.by_task[key] = []
        opened.append(path)
        opened.append(flags)

    def take(self, key: Any, stop: float | None) -> tuple[float | None, list] | None:
        """What the task ``key``, done now, opened: ``(io, opened)``, or None if nothing.

        ``opened`` holds the path and flags of each ``open``, one after the
        other, for :meth:`files`; ``io`` is the seconds the task's thread was
        off the CPU from its first open to ``stop`` (the task's end in this
        process's clock), None where it cannot be read.  Called in the
        worker's event loop, after the task's thread let go of it: cheap
        whatever the task opened.
        """
        opened = self.by_task.pop(key, None)
        first = self._first.pop(key, None)
        if opened is None or first is None:
            return None
        opened_at, cpu_at, thread = first
        io = None
        if stop is not None and cpu_at is not None:
            cpu = _cpu_seconds(thread)
            if cpu is not None:
                io = max(0.0, (stop - opened_at) - (cpu - cpu_at))
        return io, opened

    def files(self, opened: list) -> list[list]:
        """The files of what a task opened (from :meth:`take`): ``[path, written, size]``.

        Each file once, those left out by the patterns or as the worker's own
        dropped (relative paths are taken from the current directory), sizes
        as they are now, ``-1`` for a file that is gone (see :meth:`keep`):
        about four microseconds a file, most of it in ``stat``.  Touches
        nothing of the recorder's but its patterns: safe in any thread.
        """
        written: dict[str, bool] = {}
        for path, flags in zip(opened[::2], opened[1::2]):
            if type(path) is not str:
                if isinstance(path, int) or path is None:
                    continue  # a descriptor: its file was opened, and seen, before
                path = os.fsdecode(path)
            if flags < 0:  # moved: the old name is gone, the new one written
                if flags == _MOVED_AWAY:
                    written.pop(path, None)
                else:
                    written[path] = True
            elif not flags & _DIRECTORY:
                written[path] = bool(flags & _WRITES) or written.get(path, False)
        wanted = self.wanted
        return [[path, wrote, _size(path)] for name, wrote in written.items()
                if wanted(path := name if _normal(name) else os.path.abspath(name))]

    def keep(self, files: list[list]) -> list[list]:
        """The files of :meth:`files` that are there, counted (in the worker's event loop)."""
        found = [entry for entry in files if entry[2] >= 0]
        self.gone += len(files) - len(found)
        self.opened_files += len(found)
        return found

    def wanted(self, path: str) -> bool:
        """Whether the file at ``path`` (absolute) is recorded."""
        if path.startswith(self.skipped) or path.endswith(_SKIPPED_SUFFIXES):
            return False
        if self.include and not any(fnmatchcase(path, p) for p in self.include):
            return False
        return not (self.exclude and any(fnmatchcase(path, p) for p in self.exclude))

    def forget(self, key: Any) -> None:
        """The task ``key`` ended without a result: what it opened is not recorded."""
        self.by_task.pop(key, None)
        self._first.pop(key, None)


def _normal(path: str) -> bool:
    """Whether ``path`` is absolute and normalized already (what ``abspath`` would give)."""
    return path[:1] == "/" and "/." not in path and "//" not in path and path[-1:] != "/"


def _cpu_seconds(thread: int) -> float | None:
    """The CPU seconds of ``thread`` (a thread identifier) so far; None where unknown."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread))
    except (OSError, AttributeError, ValueError):
        return None


def _size(path: str) -> int:
    """The file's size in bytes; -1 if it is gone (or not a file)."""
    try:
        found = os.stat(path)
    except OSError:
        return -1
    return found.st_size if stat.S_ISREG(found.st_mode) else -1
