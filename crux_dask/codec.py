"""The wire format of event batches: versioned, validated msgpack.

A batch is a msgpack map ``{"v": 1, "source": str, "seq": int, "events": [...]}``
whose events are arrays ``[kind, field, ...]`` with the fields of
:data:`crux_dask.schema.EVENT_KINDS`.  :func:`decode_batch` checks everything
before returning anything, so a bad batch is rejected whole with one
:class:`BatchError` and whatever was recorded before is untouched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from crux_dask.schema import EVENT_KINDS, MutationKind

__all__ = [
    "MAX_BATCH_BYTES",
    "VERSION",
    "Batch",
    "BatchError",
    "decode_batch",
    "encode_batch",
]

VERSION = 1
#: Largest encoded batch accepted, in bytes.
MAX_BATCH_BYTES = 16 * 2**20
#: Largest number of events in one batch.
MAX_BATCH_EVENTS = 1_000_000
_MAX_STRING = 2**16


class BatchError(ValueError):
    """A batch of events that cannot be applied; the message says why."""


@dataclass(frozen=True, slots=True)
class Batch:
    """A decoded batch.

    Attributes
    ----------
    source : str
        Who sent it (a worker address).
    seq : int
        The sender's sequence number of the batch.
    events : list of tuple
        The events, ready for :meth:`crux_dask.builder.PAGBuilder.apply`.
    """

    source: str
    seq: int
    events: list[tuple]


def encode_batch(events: Iterable[Sequence[Any]], source: str = "", seq: int = 0) -> bytes:
    """Pack events into one batch."""
    return msgpack.packb(
        {"v": VERSION, "source": source, "seq": seq, "events": [list(e) for e in events]},
        use_bin_type=True,
    )


def decode_batch(data: bytes, max_bytes: int = MAX_BATCH_BYTES) -> Batch:
    """Unpack and validate a batch.

    Raises
    ------
    BatchError
        If the batch is too large, not msgpack, of another version, or any of
        its events is malformed (unknown kind, missing or extra fields, wrong
        types, non-finite or reversed times).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BatchError(f"a batch must be bytes, not {type(data).__name__}")
    if len(data) > max_bytes:
        raise BatchError(f"batch of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        message = msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True,
            max_str_len=_MAX_STRING, max_bin_len=0, max_array_len=MAX_BATCH_EVENTS,
            max_map_len=16, max_ext_len=0,
        )
    except Exception as error:  # msgpack raises several unrelated types
        raise BatchError(f"batch is not valid msgpack: {error}") from None
    if not isinstance(message, dict):
        raise BatchError(f"a batch must be a map, not {type(message).__name__}")
    if set(message) != {"v", "source", "seq", "events"}:
        fields = sorted(map(str, message))
        raise BatchError(f"a batch has the fields v, source, seq, events; got {fields}")
    if message["v"] != VERSION:
        raise BatchError(f"unsupported batch version {message['v']!r} (this is {VERSION})")
    source, seq, events = message["source"], message["seq"], message["events"]
    if not isinstance(source, str):
        raise BatchError("batch field 'source' must be a string")
    if not _is_int(seq):
        raise BatchError("batch field 'seq' must be an integer")
    if not isinstance(events, list):
        raise BatchError("batch field 'events' must be an array")
    checked = []
    for index, event in enumerate(events):
        fast = _common_event(event)
        checked.append(fast if fast is not None else _check_event(index, event))
    return Batch(source, seq, checked)


def _common_event(event: Any) -> tuple | None:
    """The event, if it is a well-formed transfer or release: what workers send most.

    Exact type tests only; anything else (ints for times, an odd event) goes
    through :func:`_check_event`, which accepts more and explains refusals.
    ``x - x == 0.0`` is false for infinities and NaN.
    """
    if type(event) is not list:
        return None
    if len(event) == 4 and event[0] == "delete":
        _, key, location, time = event
        if (type(key) is str and type(location) is str and type(time) is float
                and time - time == 0.0):
            return tuple(event)
    elif len(event) == 7 and event[0] == "transfer":
        _, key, source, destination, start, stop, nbytes = event
        if (type(key) is str and type(source) is str and type(destination) is str
                and type(start) is float and type(stop) is float
                and start - start == 0.0 and stop - stop == 0.0 and stop >= start
                and (nbytes is None or (type(nbytes) is int and nbytes >= 0))):
            return tuple(event)
    return None


def _check_event(index: int, event: Any) -> tuple:
    if not isinstance(event, list) or not event:
        raise BatchError(f"event {index}: must be a non-empty array")
    kind = event[0]
    fields = EVENT_KINDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise BatchError(f"event {index}: unknown kind {kind!r}; expected one of "
                         f"{', '.join(EVENT_KINDS)}")
    if len(event) != len(fields) + 1:
        raise BatchError(f"event {index} ({kind}): expected {len(fields)} fields "
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
    return (kind, *values.values())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _string(value: Any) -> str | None:
    return None if isinstance(value, str) else "expected a string"


def _optional_string(value: Any) -> str | None:
    return None if value is None or isinstance(value, str) else "expected a string or nil"


def _time(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected a number"
    return None if math.isfinite(value) else "expected a finite number"


def _size(value: Any) -> str | None:
    return None if _is_int(value) and value >= 0 else "expected a non-negative integer"


def _thread(value: Any) -> str | None:
    return None if value is None or _is_int(value) else "expected an integer or nil"


def _root(value: Any) -> str | None:
    return None if _is_int(value) and value >= -1 else "expected a state id or -1"


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
             ("transfer", "nbytes")}

_FIELD_CHECKS = {
    "key": _string, "worker": _string, "source": _string, "destination": _string,
    "location": _string, "thread": _thread, "start": _time, "stop": _time, "time": _time,
    "nbytes": _size, "inputs": _inputs, "root": _root, "label": _optional_string,
    "group": _optional_string, "kind": _kind, "origin": _optional_string, "reads": _inputs,
}
