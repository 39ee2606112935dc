"""The columns of a batch on the wire: their dtypes, and the checks of a batch that
arrives in them (every index in range, every number plausible), before anything of it
is used."""

from __future__ import annotations

from typing import Any

import numpy as np

from crux_dask.columns import (
    COLUMNS,
    COMPUTE,
    DELETE,
    NONE,
    OTHER,
    STRING_COLUMNS,
    TRANSFER,
    EventColumns,
)
from crux_dask.encoding import EVENT_MOMENTS
from crux_dask.validation import BatchError, check_event, is_int

__all__ = ["MAX_BATCH_EVENTS", "WIRE_DTYPES", "checked_columns"]

#: The dtype of each column a batch sends (:data:`~crux_dask.columns.COLUMNS`).
WIRE_DTYPES = {name: dtype for name, dtype in COLUMNS.items() if dtype is not None}
#: Largest number of events in one batch.
MAX_BATCH_EVENTS = 1_000_000
_STRING_COLUMNS = tuple(name for name in STRING_COLUMNS if name in WIRE_DTYPES)
_KIND_NAMES = {COMPUTE: "compute", TRANSFER: "transfer", DELETE: "delete", OTHER: "other"}


def checked_columns(strings: Any, columns: Any, others: Any) -> EventColumns:
    """Events in columns, checked: every index in range, every number plausible.

    Parameters
    ----------
    strings, columns, others : Any
        The fields of a version 3 batch, as unpacked.

    Raises
    ------
    BatchError
        At the first problem found: the checks run in a fixed order.
    """
    if not isinstance(strings, list) or not set(map(type, strings)) <= {str}:
        raise BatchError("batch field 'strings' must be an array of strings")
    arrays = _column_arrays(columns)
    kinds = _Kinds(arrays["kind"])
    _check_string_columns(arrays, kinds, len(strings))
    _check_number_columns(arrays, kinds)
    return EventColumns(strings, others=_whole_events(others, kinds), **arrays)


def _column_arrays(columns: Any) -> dict[str, np.ndarray]:
    """The columns as arrays, each one value per event (``inputs`` aside).

    Moments the batch did not send, the priority and who released a queued
    task read as not recorded.
    """
    if not isinstance(columns, dict) or set(columns) != set(WIRE_DTYPES):
        raise BatchError(f"batch field 'columns' must map {', '.join(WIRE_DTYPES)} to bytes")
    arrays = {}
    for name, dtype in WIRE_DTYPES.items():
        raw = columns[name]
        size = np.dtype(dtype).itemsize
        if not isinstance(raw, bytes) or len(raw) % size:
            raise BatchError(f"column {name!r} must be bytes of {dtype} values")
        # A native, writable copy: int8 kinds, float64 times, int64 for the rest.
        arrays[name] = np.frombuffer(raw, dtype).astype(
            np.int8 if name == "kind" else np.float64 if dtype[1] == "f" else np.int64)
    n = len(arrays["kind"])
    for name in EVENT_MOMENTS:
        if not len(arrays[name]):  # none recorded in the whole batch
            arrays[name] = np.full(n, np.nan)
    for name in ("priority", "announced", "cpu", "cpu_wait"):
        arrays[name] = np.full(n, np.nan)
    arrays["released_by"], arrays["released_on"] = np.full((2, n), NONE, np.int64)
    for name, values in arrays.items():
        if name != "inputs" and len(values) != n:
            raise BatchError(f"column {name!r} has {len(values)} values for {n} events")
    if n > MAX_BATCH_EVENTS:
        raise BatchError(f"batch of {n} events exceeds the limit of {MAX_BATCH_EVENTS}")
    return arrays


class _Kinds:
    """The kind of each event of a batch in columns, for the checks of its columns.

    ``compute``, ``transfer``, ``delete`` and ``plain`` (not ``OTHER``) say
    which events are of each kind.
    """

    __slots__ = ("compute", "delete", "kind", "plain", "transfer")

    def __init__(self, kind: np.ndarray) -> None:
        self.kind = kind
        self.compute, self.transfer, self.delete = (
            kind == COMPUTE, kind == TRANSFER, kind == DELETE)
        self.plain = kind != OTHER

    def require(self, wrong: np.ndarray, column: str, problem: str) -> None:
        """Raise :class:`BatchError` for the first event ``wrong`` marks, if any."""
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            name = _KIND_NAMES.get(int(self.kind[i]), "unknown")
            raise BatchError(f"event {i} ({name}) column {column!r}: {problem}")


def _check_string_columns(arrays: dict[str, np.ndarray], kinds: _Kinds, n_strings: int
                          ) -> None:
    """Check the kinds, the inputs' count and every index of a string."""
    kind, is_c, is_t, plain = kinds.kind, kinds.compute, kinds.transfer, kinds.plain
    require = kinds.require
    require((kind < COMPUTE) | (kind > OTHER), "kind", "expected 0 to 3")
    count = arrays["input_count"]
    require((count < 0) | (count > 0) & ~is_c, "input_count",
            "a computation's inputs are a count of at least 0, others have none")
    if len(arrays["inputs"]) != int(count.sum()):
        raise BatchError(f"column 'inputs' has {len(arrays['inputs'])} values, "
                         f"input_count says {int(count.sum())}")
    for name in _STRING_COLUMNS:
        values = arrays[name]
        if name == "inputs":
            out = (values < 0) | (values >= n_strings)
            if out.any():
                event = int(np.searchsorted(np.cumsum(count), np.flatnonzero(out)[0], "right"))
                raise BatchError(f"event {event} (compute) column 'inputs': "
                                 "expected indices of strings")
            continue
        require((values < NONE) | (values >= n_strings), name, "expected an index of a string")
    require(plain & ((arrays["key"] < 0) | (arrays["location"] < 0)), "key",
            "expected a key and a location")
    require(is_t & (arrays["source"] < 0) | ~is_t & plain & (arrays["source"] >= 0),
            "source", "only a transfer has a source")
    for name in ("label", "group", "origin", "root"):
        require(plain & ~is_c & (arrays[name] != NONE), name, "only a computation has one")


def _check_number_columns(arrays: dict[str, np.ndarray], kinds: _Kinds) -> None:
    """Check the times, sizes, threads, roots and moments."""
    is_c, is_t, is_d, plain = kinds.compute, kinds.transfer, kinds.delete, kinds.plain
    require = kinds.require
    start, stop = arrays["start"], arrays["stop"]
    require(plain & ~(np.isfinite(start) & np.isfinite(stop)), "start",
            "expected finite times")
    require(plain & (stop < start), "stop", "stop is before start")
    require(is_d & (stop != start), "stop", "a release has one time")
    nbytes, thread, root = arrays["nbytes"], arrays["thread"], arrays["root"]
    require(is_c & (nbytes < 0) | is_t & (nbytes < NONE) | is_d & (nbytes != 0), "nbytes",
            "expected a non-negative size (-1: unknown, for a transfer)")
    require(plain & (thread < NONE) | plain & ~is_c & (thread != NONE), "thread",
            "expected a thread of a computation, or -1")
    require(is_c & (root < NONE), "root", "expected a state id or -1")
    for name in ("requested", "received", "runnable"):  # NaN: not recorded
        values = arrays[name]
        require(np.isinf(values), name, "expected a finite time or NaN")
        require(~np.isnan(values) & (~plain | is_d | ~is_c & (name != "requested")), name,
                "only a computation has it (and a transfer its request)")


def _whole_events(others: Any, kinds: _Kinds) -> dict[int, tuple]:
    """The events kept whole, checked, by position: exactly those of kind ``OTHER``."""
    if not isinstance(others, list):
        raise BatchError("batch field 'others' must be an array")
    n = len(kinds.kind)
    whole: dict[int, tuple] = {}
    for entry in others:
        if (not isinstance(entry, list) or len(entry) != 2 or not is_int(entry[0])
                or not 0 <= entry[0] < n or entry[0] in whole):
            raise BatchError("batch field 'others' must hold [position, event] pairs")
        whole[entry[0]] = check_event(entry[0], entry[1])
    if sorted(whole) != np.flatnonzero(~kinds.plain).tolist():
        raise BatchError("batch field 'others' must hold exactly the events of kind 3")
    return whole
