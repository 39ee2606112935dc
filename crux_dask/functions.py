"""The code behind each task group: the function its tasks run, and whether it is the user's.

A step of a path names a key (``('chunk_sum-42c3…', 7, 3)``), not the line of
the user's script that made it.  The scheduler looks at the first task it
receives of each task group (:mod:`crux_dask.plugins.functions`) and keeps, in
the function table, the function that task runs: its module, qualified name,
source file and first line, and whether it is the user's code rather than a
library's (:data:`LIBRARIES` and the standard library).  A task of
``map_partitions`` runs Dask's function, which calls the user's: the user's is
the one kept, wherever it is among the task's arguments.

:func:`describe` reads a function with :mod:`inspect`'s public functions;
:func:`code_label` is what the dashboard shows of it (``etl.py:42 clean``).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, KeysView
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BY_VALUE", "FUNCTIONS_MAX", "FUNCTION_COLUMNS", "LIBRARIES", "NO_FUNCTION", "Function",
           "FunctionLog", "code_label", "code_of", "describe", "function_frame", "is_library",
           "module_of"]

#: The columns of the function table, with their pandas dtypes: per task group, its
#: ``group`` and ``prefix`` (as the scheduler names them), and of the function its
#: first task runs, the ``module``, ``qualname``, source ``file`` and first ``line``
#: (``""`` and 0 where not known: a builtin, code made by ``exec``, a task without a
#: function), and whether it is the ``user``'s code.
FUNCTION_COLUMNS: dict[str, str] = {
    "group": "str", "prefix": "str", "module": "str", "qualname": "str", "file": "str",
    "line": "int64", "user": "bool",
}
#: The top-level packages whose functions are not the user's code, besides the standard
#: library's.
LIBRARIES = frozenset({"dask", "distributed", "toolz", "tlz", "cytoolz", "pandas", "numpy"})
#: Task groups kept, the newest.
FUNCTIONS_MAX = 100_000
#: The file name of the code of a function cloudpickle pickled by value (a function of
#: ``__main__``, or one defined inside another function); it keeps the ``__file__`` of
#: the function's module in its globals.
BY_VALUE = "<dynamic-code>"
_STANDARD = frozenset(sys.stdlib_module_names)


class Function(NamedTuple):
    """What the function table says of one function (see :data:`FUNCTION_COLUMNS`)."""

    module: str = ""
    qualname: str = ""
    file: str = ""
    line: int = 0
    user: bool = False


#: The row of a task group whose function is not known: a task of data, or one whose
#: function could not be read.
NO_FUNCTION = Function()


def is_library(module: str) -> bool:
    """Whether ``module`` (a dotted name) belongs to :data:`LIBRARIES` or to the
    standard library."""
    top = module.partition(".")[0]
    return top in LIBRARIES or top in _STANDARD


def code_of(function: Callable[..., Any]) -> Any:
    """The code ``function`` runs: the function a decorator wraps
    (``functools.wraps``), a bound method's function, a callable object's
    class's ``__call__`` (its class, if that is not Python code); else
    ``function`` itself (a function, a class, a builtin)."""
    code = inspect.unwrap(function)
    if inspect.ismethod(code):
        code = code.__func__
    if not (inspect.isfunction(code) or inspect.isclass(code) or inspect.isbuiltin(code)):
        call = inspect.getattr_static(type(code), "__call__", None)
        code = call if inspect.isfunction(call) else type(code)
    return code


def module_of(code: Any) -> str:
    """The module that defines ``code`` (see :func:`code_of`)."""
    return str(getattr(code, "__module__", None) or type(code).__module__)


def describe(function: Callable[..., Any]) -> Function:
    """Where the code ``function`` runs (:func:`code_of`) is defined: its module,
    qualified name, source file and first line, and whether it is the user's code.

    Raises
    ------
    Exception
        Whatever reading ``function``'s attributes raised.
    """
    code = code_of(function)
    module = module_of(code)
    qualname = getattr(code, "__qualname__", None) or getattr(code, "__name__", "")
    user = not is_library(module)
    return Function(module, str(qualname), *_place(code, user), user)


def _place(code: Any, user: bool) -> tuple[str, int]:
    """The source file and first line of ``code``; ``("", 0)`` where :mod:`inspect`
    cannot locate it (a builtin, a function made by ``exec``).

    A function's first line is that of its definition (as
    :func:`inspect.getsourcelines` gives it), read without reading its file:
    the file of a function pickled by value (:data:`BY_VALUE`) is not where
    the scheduler runs.  A library's class has no line: :mod:`inspect` would
    parse its whole module to find it.
    """
    if inspect.isfunction(code):
        filename = code.__code__.co_filename
        if filename == BY_VALUE:
            file = code.__globals__.get("__file__") or ""
        else:
            file = "" if filename.startswith("<") else inspect.getsourcefile(code) or ""
        return (file, code.__code__.co_firstlineno) if file else ("", 0)
    try:
        file = inspect.getsourcefile(code) or ""
    except TypeError:  # a builtin: no source
        return "", 0
    if not (file and user):
        return file, 0
    try:
        return file, inspect.getsourcelines(code)[1]
    except (OSError, TypeError):  # the file changed, or holds no such code
        return file, 0


def code_label(function: Function) -> str:
    """What the dashboard shows of ``function``: ``file:line qualname`` (the file's name)
    for the user's code found in a file, else its qualified name."""
    if function.user and function.file:
        return f"{os.path.basename(function.file)}:{function.line} {function.qualname}"
    return function.qualname


class FunctionLog:
    """The function table of a run, the newest :data:`FUNCTIONS_MAX` task groups, in
    columns, and the label (:func:`code_label`) of each group and prefix.

    A prefix's label is that of its first group of the user's code, else that of
    its first group with a function.

    Attributes
    ----------
    dropped : int
        Groups let go to keep the newest.
    """

    def __init__(self, most: int = FUNCTIONS_MAX) -> None:
        self.most = most
        self.dropped = 0
        self._columns: dict[str, list] = {name: [] for name in FUNCTION_COLUMNS}
        self._groups: dict[str, str] = {}  # group -> its label
        self._prefixes: dict[str, tuple[bool, str]] = {}  # prefix -> (user, label)

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, group: object) -> bool:
        return group in self._groups

    def groups(self) -> KeysView[str]:
        """The task groups kept, as a set-like view."""
        return self._groups.keys()

    def add(self, group: str, prefix: str, function: Function = NO_FUNCTION) -> None:
        """Keep the row of one task group (a group kept already is left as it is)."""
        if group in self._groups:
            return
        for name, value in zip(FUNCTION_COLUMNS, (group, prefix, *function), strict=True):
            self._columns[name].append(value)
        label = self._groups[group] = code_label(function)
        user, _ = self._prefixes.get(prefix, (False, ""))
        if label and not user and (function.user or prefix not in self._prefixes):
            self._prefixes[prefix] = (function.user, label)
        extra = len(self._groups) - self.most
        if extra >= max(self.most // 10, 1):  # let the oldest go, a tenth at a time
            for oldest in self._columns["group"][:extra]:
                del self._groups[oldest]
            for values in self._columns.values():
                del values[:extra]
            self.dropped += extra

    def group_label(self, group: str) -> str:
        """The label of a task group's function; ``""`` if not known."""
        return self._groups.get(group, "")

    def prefix_label(self, prefix: str) -> str:
        """The label of a task prefix's code; ``""`` if not known."""
        return self._prefixes.get(prefix, (False, ""))[1]

    @classmethod
    def of(cls, functions: pd.DataFrame | dict[str, list] | None) -> FunctionLog:
        """The log of a function table (:func:`function_frame` reads it): of a run read
        back, as :func:`crux_dask.read_functions` gives it."""
        log = cls()
        table = function_frame(functions)
        for row in zip(*(table[name].tolist() for name in FUNCTION_COLUMNS)):
            log.add(row[0], row[1], Function(*row[2:]))
        return log

    def columns(self) -> dict[str, list]:
        """The rows as lists, oldest first: what :func:`function_frame` reads."""
        return {name: list(values) for name, values in self._columns.items()}

    def frame(self) -> pd.DataFrame:
        """The rows as a table of :data:`FUNCTION_COLUMNS`, oldest first."""
        return function_frame(self.columns())


def function_frame(functions: pd.DataFrame | dict[str, list] | None) -> pd.DataFrame:
    """A function table of :data:`FUNCTION_COLUMNS`: ``functions`` itself, the table of
    :meth:`FunctionLog.columns`, or an empty one for None."""
    import pandas as pd

    if isinstance(functions, pd.DataFrame):
        return functions
    if functions is None:
        return pd.DataFrame(columns=list(FUNCTION_COLUMNS)).astype(FUNCTION_COLUMNS)
    return pd.DataFrame({name: functions[name] for name in FUNCTION_COLUMNS}).astype(
        FUNCTION_COLUMNS)
