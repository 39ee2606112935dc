"""Task groups: how their tasks' seconds and bytes spread, and the tasks far slower
than their siblings.

A task group is what Dask's scheduler groups a graph's tasks by: the name of a
tuple key (``"('chunk_sum-42c3…', 7, 3)"`` → ``chunk_sum-42c3…``), the prefix
of any other key.  Of each group of a run, :func:`group_stats` gives the
distribution of its tasks' compute seconds, output bytes and input bytes.

A task is a **straggler** when it took more than :data:`SLOWER` times its
group's median seconds, and at least ``floor`` seconds more than that median,
in a group of at least :data:`LEAST_TASKS` tasks.  A straggler is **skew**
when its bytes explain it (its input or output bytes over :data:`SLOWER` times
its group's medians: a hot key, an uneven partition or file), else **slow**
(the same bytes, slower: a slow worker, a slow file, a pause of the process).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from dask.utils import key_split

from crux_dask.growable import NO_CODE
from crux_dask.model import MutationKind
from crux_dask.store import NO_THREAD, PAGStore

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FLAG_COLUMNS",
    "FLOOR",
    "GROUP_COLUMNS",
    "LEAST_TASKS",
    "SLOWER",
    "GroupCodes",
    "KeyGroups",
    "Tasks",
    "describe_straggler",
    "flag_steps",
    "group_name",
    "group_stats",
    "key_groups",
    "no_groups",
    "straggler_kinds",
    "tasks",
]

#: How many times its group's median seconds a straggler took at least, and how many
#: times its group's median bytes a skewed straggler's input or output holds.
SLOWER = 2.0
#: The fewest seconds a straggler took over its group's median, by default: a task
#: of a few milliseconds stalls for a tenth of a second now and then on a busy
#: machine (its process descheduled, a garbage collection), which is no straggler
#: to fix (0.11 s the most over 40 runs of equal partitions on two shared cores).
FLOOR = 0.2
#: The fewest tasks a group has for its median to say what its tasks usually take.
LEAST_TASKS = 3
#: The columns a step of a path gains (:func:`flag_steps`).
FLAG_COLUMNS = ("group", "median", "slowdown", "bytes_ratio", "straggler")
#: The columns of :func:`group_stats`, with their pandas dtypes.
GROUP_COLUMNS: dict[str, str] = {
    "group": "str", "prefix": "str", "tasks": "int64", "stragglers": "int64",
    **{f"{measure}_{stat}": "float64" for measure in ("seconds", "output", "input")
       for stat in ("min", "median", "p90", "max")},
}

_HEX = re.compile(r"[a-f0-9]{32}")
#: Whether the source of a mutation of each kind (by its code) is an input of its
#: destination: not that of a transfer (a copy) nor of a delete.
_IS_INPUT = np.ones(max(int(kind) for kind in MutationKind) + 1, bool)
_IS_INPUT[[int(MutationKind.TRANSFER), int(MutationKind.DELETE)]] = False
#: Every task, as an index.
ALL = slice(None)


def group_name(key: str) -> str:
    """The task group of ``key`` (a key as a string), named as Dask's scheduler names it
    (``distributed.utils.key_split_group``): a tuple key's name, ``"data"`` for a
    32-digit hex key, an object's class, else the key's prefix."""
    if key.startswith("("):
        return key.split(",", 1)[0].strip("()\"'")
    if len(key) == 32 and _HEX.match(key):
        return "data"
    if key.startswith("<"):
        return key.strip("<>").split()[0].split(".")[-1]
    return key_split(key)


def key_groups(store: PAGStore, group_of: Callable[[str], str] = group_name) -> np.ndarray:
    """The task group of every key of ``store``, by key code."""
    groups = np.empty(len(store.keys), object)
    groups[:] = [group_of(key) for key in store.keys.values]
    return groups


class KeyGroups:
    """:func:`key_groups` of graphs that grow, each key's group found once.

    Parameters
    ----------
    group_of : callable
        The task group of a key.
    """

    def __init__(self, group_of: Callable[[str], str] = group_name) -> None:
        self.group_of = group_of
        self._known: weakref.WeakKeyDictionary[PAGStore, np.ndarray] = (
            weakref.WeakKeyDictionary())

    def __call__(self, store: PAGStore) -> np.ndarray:
        """The task group of every key of ``store``, by key code: found on the store it is
        a copy of, if it is one, so that each copy does not find them again."""
        length = len(store.keys.values)
        store = store.origin or store
        known = self._known.get(store)
        keys = store.keys.values
        if known is None or len(known) < len(keys):
            done = 0 if known is None else len(known)
            fresh = np.empty(len(keys) - done, object)
            fresh[:] = [self.group_of(key) for key in keys[done:]]
            known = fresh if known is None else np.concatenate([known, fresh])
            self._known[store] = known
        return known[:length]


class GroupCodes:
    """Each key's task group (:func:`group_name`) as a code, found once per key on the
    store a copy was made of, like :class:`KeyGroups`."""

    def __init__(self) -> None:
        self._known: weakref.WeakKeyDictionary[PAGStore, tuple[np.ndarray, dict[str, int]]] = (
            weakref.WeakKeyDictionary())

    def __call__(self, store: PAGStore) -> tuple[np.ndarray, np.ndarray]:
        """The group code of every key of ``store``, by key code, and the groups' names."""
        length = len(store.keys.values)
        store = store.origin or store
        codes, index = self._known.get(store, (np.zeros(0, np.int64), {}))
        keys = store.keys.values
        if len(codes) < len(keys):
            names = [group_name(key) for key in keys[len(codes):]]
            fresh = [index.setdefault(name, len(index)) for name in names]
            codes = np.concatenate([codes, np.array(fresh, np.int64)])
            self._known[store] = (codes, index)
        names = np.empty(len(index), object)
        names[:] = list(index)
        return codes[:length], names


_group_codes = GroupCodes()


@dataclass
class Tasks:
    """The tasks of a run (states computed on a worker thread), with their groups,
    seconds and bytes, and each group's medians.

    Attributes
    ----------
    state : ndarray
        Each task's state.
    group : ndarray
        Each task's group, an index into ``names``.
    names, prefixes : ndarray of object
        Each group's name and prefix.
    seconds, output, input : ndarray of float64
        Each task's compute seconds, output bytes and bytes of its inputs.
    size : ndarray
        Each group's number of tasks.
    median_seconds, median_output, median_input : ndarray of float64
        Each group's medians.
    """

    state: np.ndarray
    group: np.ndarray
    names: np.ndarray
    prefixes: np.ndarray
    seconds: np.ndarray
    output: np.ndarray
    input: np.ndarray
    size: np.ndarray
    median_seconds: np.ndarray
    median_output: np.ndarray
    median_input: np.ndarray

    def positions(self, states: np.ndarray) -> np.ndarray:
        """The task of each of ``states`` (its index here), -1 for a state that is none."""
        task_of = np.full(int(max(self.state.max(initial=-1), states.max(initial=-1))) + 1,
                          -1, np.int64)
        task_of[self.state] = np.arange(len(self.state))
        return task_of[states]

    def slowdown(self, at: np.ndarray | slice = ALL) -> np.ndarray:
        """Each task's seconds over its group's median (NaN in a group too small to say),
        of the tasks ``at`` (all by default)."""
        group = self.group[at]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = self.seconds[at] / self.median_seconds[group]
        return np.where(self.size[group] >= LEAST_TASKS, ratio, np.nan)

    def bytes_ratio(self, at: np.ndarray | slice = ALL) -> np.ndarray:
        """The larger of each task's input and output bytes over its group's medians, of
        the tasks ``at``."""
        group = self.group[at]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = [np.where(median > 0, values / median, np.nan)
                      for values, median in ((self.output[at], self.median_output[group]),
                                             (self.input[at], self.median_input[group]))]
        return np.fmax(*ratios)

    def stragglers(self, floor: float = FLOOR, at: np.ndarray | slice = ALL) -> np.ndarray:
        """What each of the tasks ``at`` is (:func:`straggler_kinds`)."""
        return straggler_kinds(self.slowdown(at), self.median_seconds[self.group[at]],
                               self.bytes_ratio(at), floor)


def straggler_kinds(slowdown: np.ndarray, median: np.ndarray, bytes_ratio: np.ndarray,
                    floor: float = FLOOR) -> np.ndarray:
    """What each task is, of its ``slowdown`` and ``bytes_ratio`` against its group's
    ``median`` seconds: ``"skew"`` or ``"slow"`` for a straggler, else ``""``."""
    with np.errstate(invalid="ignore"):  # a group whose median is 0 s
        straggler = (slowdown > SLOWER) & ((slowdown - 1) * median >= floor)
    return np.where(straggler, np.where(bytes_ratio > SLOWER, "skew", "slow"), "").astype(
        object)


def tasks(store: PAGStore, groups: np.ndarray | None = None) -> Tasks:
    """The tasks of ``store``: of every group, or of the group codes ``groups`` only
    (the other groups then have no tasks and NaN medians)."""
    import pandas as pd

    key_group, names = _group_codes(store)
    ids = np.flatnonzero((store.column("state_thread") != NO_THREAD)
                         & (store.column("state_worker") != NO_CODE))
    keys = store.column("state_key", ids)
    group = key_group[keys]
    if groups is not None:
        wanted = np.zeros(len(names), bool)
        wanted[groups] = True
        keep = wanted[group]
        ids, keys, group = ids[keep], keys[keep], group[keep]
    chosen = np.zeros(store.n_states, bool)
    chosen[ids] = True
    kind, dst = store.column("mutation_kind"), store.column("mutation_dst")
    into = np.flatnonzero(chosen[dst] & _IS_INPUT[kind])
    state_size = store.column("state_size")
    inputs = np.bincount(dst[into], minlength=store.n_states,
                         weights=state_size[store.column("mutation_src", into)])
    seconds = np.maximum(store.column("state_time", ids) - store.column("state_start", ids),
                         0.0)
    output, input_ = state_size[ids].astype(np.float64), inputs[ids]
    frame = pd.DataFrame({"group": group, "seconds": seconds, "output": output,
                          "input": input_})
    medians = frame.groupby("group").median().reindex(range(len(names)))
    first = np.full(len(names), -1, np.int64)  # a task of each group: its prefix
    first[group[::-1]] = np.arange(len(group))[::-1]
    present = first >= 0
    prefixes = np.empty(len(names), object)
    prefixes[present] = store.labels.decode(
        store.column("key_label", keys[first[present]])).to_numpy(object)
    return Tasks(ids, group, names, prefixes, seconds, output, input_,
                 np.bincount(group, minlength=len(names)), medians["seconds"].to_numpy(),
                 medians["output"].to_numpy(), medians["input"].to_numpy())


def group_stats(store: PAGStore, floor: float = FLOOR) -> pd.DataFrame:
    """Of each task group of ``store``, how its tasks' seconds and bytes spread.

    Returns
    -------
    DataFrame
        :data:`GROUP_COLUMNS`: the ``group``, its ``prefix``, its number of
        ``tasks`` and of ``stragglers`` (over ``floor``), and the minimum,
        median, 90th percentile and maximum of its tasks' compute ``seconds``,
        ``output`` bytes and ``input`` bytes; most seconds in all first.
    """
    import pandas as pd

    found = tasks(store)
    if not len(found.state):  # a segment of releases and copies only
        return no_groups()
    frame = pd.DataFrame({"group": found.group, "seconds": found.seconds,
                          "output": found.output, "input": found.input})
    by = frame.groupby("group")
    quantiles = by.quantile([0.0, 0.5, 0.9, 1.0]).unstack()
    table = pd.DataFrame({
        "group": found.names, "prefix": found.prefixes, "tasks": found.size,
        "stragglers": np.bincount(found.group[found.stragglers(floor) != ""],
                                  minlength=len(found.names)),
    })
    for measure in ("seconds", "output", "input"):
        for q, stat in ((0.0, "min"), (0.5, "median"), (0.9, "p90"), (1.0, "max")):
            table[f"{measure}_{stat}"] = quantiles[(measure, q)].reindex(
                range(len(found.names))).to_numpy()
    order = np.argsort(-by["seconds"].sum().reindex(range(len(found.names))).to_numpy(),
                       kind="stable")
    order = order[found.size[order] > 0]
    return table.iloc[order].reset_index(drop=True).astype(GROUP_COLUMNS)


def no_groups() -> pd.DataFrame:
    """The table of :func:`group_stats` of a run without tasks."""
    import pandas as pd

    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in GROUP_COLUMNS.items()})


def flag_steps(store: PAGStore, steps: pd.DataFrame, floor: float = FLOOR) -> pd.DataFrame:
    """``steps`` with :data:`FLAG_COLUMNS`: of the task each step made (its ``dst``),
    its ``group``, the group's ``median`` seconds, its ``slowdown`` and ``bytes_ratio``
    against the group's medians, and what it is (``straggler``: ``"skew"``, ``"slow"``
    or ``""``, over ``floor``).  A step that made no task has no group, NaN figures and
    ``""``."""
    dst = steps["dst"].to_numpy(np.int64)
    key_group, _ = _group_codes(store)
    found = tasks(store, key_group[store.column("state_key", dst)])
    task = found.positions(dst)
    made = task >= 0
    at = task[made]
    group = np.full(len(steps), "", object)
    group[made] = found.names[found.group[at]]
    columns = {"group": group}
    median, slowdown = found.median_seconds[found.group[at]], found.slowdown(at)
    bytes_ratio = found.bytes_ratio(at)
    for name, values in (("median", median), ("slowdown", slowdown),
                         ("bytes_ratio", bytes_ratio)):
        column = np.full(len(steps), np.nan)
        column[made] = values
        columns[name] = column
    straggler = np.full(len(steps), "", object)
    straggler[made] = straggler_kinds(slowdown, median, bytes_ratio, floor)
    columns["straggler"] = straggler
    return steps.assign(**columns).astype({"group": "str", "straggler": "str"})


def describe_straggler(row: Any) -> str:
    """One line of a row of :meth:`~crux_dask.path.CriticalPath.stragglers`: its key,
    how much slower than its group it was, the share of the path it holds, and whether
    its bytes explain it."""
    why = (f"its bytes {row.bytes_ratio:.1f}x its group's median: skew"
           if row.straggler == "skew" else "with its group's bytes: slow")
    return (f"{row.key}: {row.slowdown:.1f}x its group's median seconds, "
            f"{row.share:.0%} of the path, {why}")
