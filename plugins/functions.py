"""The scheduler's recorder of the function table: the function each task group runs.

Of each task group a graph brings (``TaskState.group``), only the first task
the scheduler receives is looked at: its ``run_spec`` (a
:class:`dask._task_spec.Task`, a function and arguments that may hold further
tasks, subgraphs and callables) is walked for the first callable of the
user's code, else the first of a library's besides Dask's plumbing of tasks,
and described (:func:`crux_dask.functions.describe`).  Every other task of the
graph costs at most a look-up of its group.  A task whose function cannot be
read is counted, and its group kept without a function: nothing raises into
the scheduler.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import tlz.functoolz
import toolz.functoolz
from dask.task_spec import GraphNode, Task, TaskRef

from crux_dask.functions import (
    NO_FUNCTION,
    Function,
    FunctionLog,
    code_of,
    describe,
    is_library,
    module_of,
)

if TYPE_CHECKING:
    from distributed import Scheduler
    from distributed.scheduler import TaskState

__all__ = ["LOOKED_AT_MOST", "FunctionRecorder", "callables", "task_function"]

#: Objects of a task's ``run_spec`` looked at, at most (a fused task holds a subgraph,
#: a reduction the references to each of its inputs).
LOOKED_AT_MOST = 256
#: The classes of toolz's compositions of functions (tlz's may be cytoolz's).
_COMPOSITIONS = (toolz.functoolz.Compose, tlz.functoolz.Compose)
#: The module of Dask's plumbing of tasks: subgraphs, containers, casts.
_PLUMBING = "dask._task_spec"


def callables(run_spec: object) -> Iterator[Callable[..., Any]]:
    """The callables in a task's ``run_spec``, depth first in the order of its
    arguments: a task's function before its arguments, a partial's function before
    its own, a composition's functions from the one applied last; the values of
    dictionaries and the items of lists, tuples and sets.  At most
    :data:`LOOKED_AT_MOST` objects are looked at."""
    stack: list[object] = [run_spec]
    for _ in range(LOOKED_AT_MOST):
        if not stack:
            return
        node = stack.pop()
        inner: Iterable[object]
        if isinstance(node, Task):
            inner = itertools.chain((node.func,), node.args, node.kwargs.values())
        elif isinstance(node, GraphNode | TaskRef | str | bytes):  # data, references
            continue
        elif isinstance(node, functools.partial):
            inner = itertools.chain((node.func,), node.args, node.keywords.values())
        elif isinstance(node, _COMPOSITIONS):  # the function applied last first
            inner = (*reversed(node.funcs), node.first)
        elif isinstance(node, dict):
            inner = node.values()
        elif isinstance(node, list | tuple | set | frozenset):
            inner = node
        else:
            if callable(node):
                yield node
            continue
        stack.extend(reversed(list(itertools.islice(inner, LOOKED_AT_MOST))))


def task_function(run_spec: object) -> Function:
    """The function of a task: the first of :func:`callables` that is the user's code,
    else the first that is not Dask's plumbing of tasks, else its first; described
    (:func:`~crux_dask.functions.describe`).  :data:`NO_FUNCTION` for a task of data.

    Raises
    ------
    Exception
        Whatever reading a callable's attributes raised.
    """
    first = library = None
    for candidate in callables(run_spec):
        module = module_of(code_of(candidate))
        if not is_library(module):
            return describe(candidate)
        if first is None:
            first = candidate
        if library is None and not module.startswith(_PLUMBING):
            library = candidate
    chosen = library if library is not None else first
    return NO_FUNCTION if chosen is None else describe(chosen)


class FunctionRecorder:
    """The function table of the task groups a scheduler receives.

    Attributes
    ----------
    log : FunctionLog
        The table so far.
    failed : int
        Tasks whose function could not be read (their groups are kept without one).
    seconds : float
        Seconds spent in :meth:`record`, on the scheduler's event loop.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.log = FunctionLog()
        self.failed = 0
        self.seconds = 0.0
        self._absent: set[str] = set()  # groups no graph they were looked for in held

    def record(self, keys: Iterable[Any]) -> None:
        """Keep the function of each task group not kept yet that has a task among
        ``keys`` (the tasks the scheduler just received), read from its first task
        there.  Never raises.

        Only the scheduler's groups not kept yet are looked for, and only until
        each is found: the scheduler lists a graph's tasks depth first from its
        outputs, so the first tasks of each group come early.  A group none of
        whose tasks is among ``keys`` (data scattered, tasks received before
        Crux attached) is looked for once.
        """
        started = time.perf_counter()
        try:
            groups = self.scheduler.task_groups.keys()
            missing = groups - self.log.groups() - self._absent
            if missing:
                self._find(keys, missing)
                self._absent = (self._absent | missing) & groups
        except Exception:  # the scheduler's own state, not as expected: counted
            self.failed += 1
        finally:
            self.seconds += time.perf_counter() - started

    def _find(self, keys: Iterable[Any], missing: set[str]) -> None:
        """Keep the function of the first task among ``keys`` of each group of
        ``missing``, taking each group found out of it."""
        tasks, log, last = self.scheduler.tasks, self.log, None
        for key in keys:
            ts = tasks.get(key)
            if ts is None or ts.group is last:
                continue
            last = ts.group
            if last.name in missing:
                missing.discard(last.name)
                log.add(last.name, ts.prefix.name, self._function(ts))
                if not missing:
                    return

    def _function(self, ts: TaskState) -> Function:
        try:
            return task_function(ts.run_spec)
        except Exception:  # a callable whose attributes raise: counted
            self.failed += 1
            return NO_FUNCTION

    @property
    def counts(self) -> dict[str, float]:
        """The groups kept and dropped, the tasks that failed, and the seconds spent."""
        return {"function_groups": len(self.log), "functions_dropped": self.log.dropped,
                "functions_failed": self.failed, "seconds_finding_functions": self.seconds}
