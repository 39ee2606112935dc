"""Files that tasks open, seen through the functions that open them, without a change to
user code.

While a worker of the process records files, ``open()`` (``builtins.open`` and
``io.open``, one function), ``os.open``, ``os.rename``, ``os.replace`` and
``os.link`` are wrapped: each calls the function it wraps, then notes what it
opened (or moved) for the task of the calling thread.  That covers what
libraries build on them: pandas, pyarrow's Python file objects, fsspec's
local files, pathlib, numpy, zarr's local stores.  A worker runs each task in
a thread of its own executor and marks that thread with the task's key
(``distributed.worker.thread_state``), so a wrapper knows which task opened
which file, and whether for writing, at the cost of a few attribute reads.
The functions are put back as they were when the last recorder of the
process stops (unless something wrapped them again meanwhile).  Sizes are
taken when the task is done, once per file: in the worker's event loop for a
task that opened a few files, in a thread of their own for one that opened
many (:class:`crux_dask.plugins.worker.CruxWorkerPlugin`).

Why not an audit hook, which sees every ``open`` (also ``io.FileIO`` built
directly, and code that kept a reference to ``open`` from before)?  The
interpreter calls an audit hook for every audited event of the process, and
distributed's worker raises about 90 for each task (``builtins.id``, in
``TaskState.__hash__``): about 0.19 µs each with any hook at all, even one in
C, which is 17 µs a task and 1.1 % of the worker's CPU on tiny tasks, for
files that nearly all tasks never open.  The wrappers cost nothing to a task
that opens no file, and about as much as the hook did to one that does.

Some libraries open files in threads of their own while the task's thread
waits (zarr's stores, through an event loop and a thread pool of their own):
an ``open`` in a thread that runs no task is the task's when it is the only
one running on the worker (``Worker.active_threads``); with several running,
whose it is cannot be told, and it is not recorded.

A task's seconds on files are the seconds its thread was off the CPU from
its first ``open`` to its end: the time it waited for storage (a read served
from the page cache costs CPU time, and counts as computing).  Files a task
opens through other ways (a C library opening them itself) are not seen.
"""

from __future__ import annotations

import builtins
import functools
import io
import os
import site
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable
from fnmatch import fnmatchcase
from types import ModuleType
from typing import Any

from distributed.worker import thread_state

from crux_dask.plugins.thread_clock import thread_cpu

__all__ = ["FileRecorder"]

#: Recorders by the id of the worker they serve; the wrappers' only way in, and
#: the only one when there is one (a worker process has one worker).
_recorders: dict[int, FileRecorder] = {}
_single: FileRecorder | None = None
#: The only recorder's :attr:`FileRecorder.by_task` (None unless there is one).
_single_by_task: dict | None = None
#: What is wrapped now: (module, name, the function it was, its wrapper).
_wrapped: list[tuple[ModuleType, str, Callable, Callable]] = []
_install_lock = threading.Lock()

#: Flags of an ``open`` that may change the file.
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: The flags noted for the old and the new name of a file given another name.
_MOVED_AWAY, _MOVED_HERE = -1, -2
#: Files no task means to read as data: Python's own, the kernel's.
_SKIPPED_SUFFIXES = (".py", ".pyc", ".so", ".pth")
_SKIPPED_PREFIXES = ("/proc/", "/sys/", "/dev/")


def _opened(path: Any, flags: int, _state: Any = thread_state) -> None:
    """Note that ``path`` was opened (or moved) now, with ``flags``, by the task of this
    thread, for its worker's recorder.

    As little as can be, in the task's thread (the default saves a global
    lookup): with one recorder in the process (a worker process has one
    worker), an ``open`` of a task that opened files before costs two
    lookups and two appends of its path and flags to the task's list (kept
    as a tuple, each open would keep one more object for the garbage
    collector to walk); anything else goes to :func:`_open_slowly`, and the
    rest waits for :meth:`FileRecorder.take`.
    """
    try:
        opened = _single_by_task[_state.key]
    except Exception:  # no single recorder, no task in this thread, or its first open
        _open_slowly(path, flags)
        return
    opened.append(path)
    opened.append(flags)


def _watch_open(open_file: Callable) -> Callable:
    """``open()`` (``io.open``), noting the file it opened."""
    @functools.wraps(open_file)
    def open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened = open_file(file, mode, *args, **kwargs)
        # Only one of r, w, a and x is allowed, and + adds writing.
        _opened(file, os.O_RDONLY if "r" in mode and "+" not in mode else os.O_WRONLY)
        return opened
    open.__module__ = "io"  # where it is found (3.13's is "_io"), so it pickles as itself
    return open


def _watch_os_open(open_descriptor: Callable) -> Callable:
    """``os.open``, noting the file it opened."""
    @functools.wraps(open_descriptor)
    def open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        descriptor = open_descriptor(path, flags, *args, **kwargs)
        _opened(path, flags)
        return descriptor
    open.__module__ = "os"  # where it is found, so that it pickles as itself
    return open


def _watch_move(move: Callable) -> Callable:
    """``os.rename``, ``os.replace`` or ``os.link``, noting the file as its new name.

    A file written under a temporary name and then renamed (or linked) to its
    own, as zarr's stores write, is noted as both names, the first marked as
    moved away and the second as written.
    """
    @functools.wraps(move)
    def moved(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        move(src, dst, *args, **kwargs)
        _opened(src, _MOVED_AWAY)
        _opened(dst, _MOVED_HERE)
    moved.__module__ = "os"  # where it is found, so that it pickles as itself
    return moved


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
    except Exception:  # the open succeeded: noting it never fails it
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
    """Wrap the functions that open and move files, unless they are wrapped already
    (with ``_install_lock`` held)."""
    if _wrapped:
        return
    watched_open = _watch_open(io.open)  # builtins.open is io.open
    for module, name, wrapper in (
            (builtins, "open", watched_open), (io, "open", watched_open),
            (os, "open", _watch_os_open(os.open)), (os, "rename", _watch_move(os.rename)),
            (os, "replace", _watch_move(os.replace)), (os, "link", _watch_move(os.link))):
        _wrapped.append((module, name, getattr(module, name), wrapper))
        setattr(module, name, wrapper)


def _uninstall() -> None:
    """Put back each function wrapped, unless something else replaced the wrapper since
    (with ``_install_lock`` held)."""
    for module, name, original, wrapper in _wrapped:
        if getattr(module, name) is wrapper:
            setattr(module, name, original)
    _wrapped.clear()


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
        with _install_lock:  # workers of one process may start and stop in several threads
            _install()
            _recorders[id(self.worker)] = self
            _single_or_none()

    def stop(self) -> None:
        """Stop watching; what was recorded for tasks not done yet is dropped.

        The last recorder of the process to stop puts back the functions it wrapped.
        """
        with _install_lock:
            if _recorders.get(id(self.worker)) is self:
                del _recorders[id(self.worker)]
            _single_or_none()
            if not _recorders:
                _uninstall()
        self.by_task.clear()
        self._first.clear()

    def note(self, key: Any, thread: int, path: Any, flags: int) -> None:
        """The task ``key``, run by ``thread``, opens (or moves) ``path`` now."""
        opened = self.by_task.get(key)
        if opened is None:  # its first: when, and its thread's CPU time then
            self._first[key] = (time.time(), thread_cpu(thread), thread)
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
            cpu = thread_cpu(thread)
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


def _size(path: str) -> int:
    """The file's size in bytes; -1 if it is gone (or not a file)."""
    try:
        found = os.stat(path)
    except OSError:
        return -1
    return found.st_size if stat.S_ISREG(found.st_mode) else -1
