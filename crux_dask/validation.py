"""What a well-formed event is: the checks of an event that arrives as a row.

A worker's batch (:mod:`crux_dask.codec`) and an application's HTTP write carry
events as arrays ``[kind, field, ...]`` with the fields of
:data:`crux_dask.events.EVENT_KINDS`; each is checked here, field by field,
and refused with a :class:`BatchError` that says what is wrong.
"""

from __future__ import annotations

import math
from typing import Any

from crux_dask.events import EVENT_KINDS, REQUIRED, TYPES, Delete, Transfer
from crux_dask.model import MutationKind

__all__ = ["BatchError", "check_event", "common_event", "is_int"]


class BatchError(ValueError):
    """A batch of events that cannot be applied; the message says why."""


def common_event(event: Any) -> tuple | None:
    """The event, if it is a well-formed transfer or release: what workers send most.

    Exact type tests only; anything else (ints for times, an odd event) goes
    through :func:`check_event`, which accepts more and explains refusals.
    ``x - x == 0.0`` is false for infinities and NaN.
    """
    if type(event) is not list:
        return None
    if len(event) == 4 and event[0] == "delete":
        e = Delete._make(event)
        if (type(e.key) is str and type(e.location) is str and type(e.time) is float
                and e.time - e.time == 0.0):
            return e
    elif 7 <= len(event) <= 8 and event[0] == "transfer":
        e = Transfer(*event)
        if (type(e.key) is str and type(e.source) is str and type(e.destination) is str
                and type(e.start) is float and type(e.stop) is float
                and e.start - e.start == 0.0 and e.stop - e.stop == 0.0 and e.stop >= e.start
                and (e.nbytes is None or (type(e.nbytes) is int and e.nbytes >= 0))
                and (e.requested is None or (type(e.requested) is float
                                             and e.requested - e.requested == 0.0))):
            return e
    return None


def check_event(index: int, event: Any) -> tuple:
    """Event ``index`` of a batch, checked field by field, as its record."""
    if not isinstance(event, list) or not event:
        raise BatchError(f"event {index}: must be a non-empty array")
    kind = event[0]
    fields = EVENT_KINDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise BatchError(f"event {index}: unknown kind {kind!r}; expected one of "
                         f"{', '.join(EVENT_KINDS)}")
    if not REQUIRED[kind] < len(event) <= len(fields) + 1:
        counts = (f"{REQUIRED[kind]} to {len(fields)}" if REQUIRED[kind] < len(fields)
                  else str(len(fields)))
        raise BatchError(f"event {index} ({kind}): expected {counts} fields "
                         f"({', '.join(fields)}), got {len(event) - 1}")
    values = dict(zip(fields, event[1:]))
    for name, value in values.items():
        if value is None and (kind, name) in _OPTIONAL:
            continue
        problem = _FIELD_CHECKS[name](value)
        if problem:
            raise BatchError(f"event {index} ({kind}) field {name!r}: {problem}, "
                             f"got {value!r:.80}")
    if "start" in values and values["stop"] < values["start"]:
        raise BatchError(f"event {index} ({kind}): stop is before start")
    if kind == "compute":
        values["inputs"] = tuple(values["inputs"])
        if values["reads"] is not None:
            values["reads"] = tuple(values["reads"])
    return TYPES[kind](kind, *values.values())


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer, and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _string(value: Any) -> str | None:
    return None if isinstance(value, str) else "expected a string"


def _optional_string(value: Any) -> str | None:
    return None if value is None or isinstance(value, str) else "expected a string or nil"


def _time(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected a number"
    return None if math.isfinite(value) else "expected a finite number"


def _seconds(value: Any) -> str | None:
    problem = _time(value)
    return problem if problem is not None or value >= 0 else "expected seconds, at least 0"


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "expected true or false"


def _size(value: Any) -> str | None:
    return None if is_int(value) and value >= 0 else "expected a non-negative integer"


def _thread(value: Any) -> str | None:
    return None if value is None or is_int(value) else "expected an integer or nil"


def _root(value: Any) -> str | None:
    return None if is_int(value) and value >= -1 else "expected a state id or -1"


def _inputs(value: Any) -> str | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return None
    return "expected an array of strings"


def _kind(value: Any) -> str | None:
    if value is None:
        return None
    try:
        MutationKind.parse(value)
    except ValueError as error:
        return str(error)
    return None


#: Fields that may be nil, by event kind.
_OPTIONAL = {("compute", "location"), ("compute", "origin"), ("compute", "reads"),
             ("transfer", "nbytes"), ("transfer", "requested"),
             *(("compute", name) for name in ("sent", "received", "runnable", "released_by",
                                              "released_on", "priority", "io",
                                              "first_requested", "announced", "cpu", "cpu_wait")),
             ("file", "requested"), ("file", "received")}

_FIELD_CHECKS = {
    "key": _string, "worker": _string, "source": _string, "destination": _string,
    "location": _string, "thread": _thread, "start": _time, "stop": _time, "time": _time,
    "nbytes": _size, "inputs": _inputs, "root": _root, "label": _optional_string,
    "group": _optional_string, "mutation": _kind, "origin": _optional_string, "reads": _inputs,
    "sent": _time, "received": _time, "runnable": _time, "requested": _time,
    "released_by": _string, "released_on": _string, "priority": _time, "io": _time,
    "first_requested": _time, "announced": _time, "cpu": _seconds, "cpu_wait": _seconds,
    "written": _flag,
}
