"""The wire format of event batches: versioned, validated msgpack.

Two versions, both decoded; :func:`encode_batch` writes rows for a few events
and columns for many:

* **3**: the events in columns
  (:class:`~crux_dask.columns.EventColumns`), ``{"v": 3, "source": str,
  "seq": int, "strings": [str, ...], "columns": {name: bytes, ...},
  "others": [[position, event], ...]}``.  Each column is the little-endian
  bytes of one array (dtypes in :data:`~crux_dask.wire.WIRE_DTYPES`); string columns index
  ``strings``; a column of moments that none of the batch's events recorded
  (NaN throughout) is sent empty.  A computation's ``priority``, which only
  the scheduler records, is not sent (it reads as not recorded); a queued
  task, which only the scheduler knows, travels whole.  Events
  that are not plain computations, transfers or releases travel whole in
  ``others``.  The receiver reads the columns without
  creating an object per event, and looks each distinct string up once.
* **1**, rows: ``{"v": 1, "source": str, "seq": int, "events": [...]}`` whose
  events are arrays ``[kind, field, ...]`` with the fields of
  :data:`crux_dask.events.EVENT_KINDS`: the simplest form to write by hand.

:func:`decode_batch` checks everything before returning anything, so a bad
batch is rejected whole with one :class:`BatchError` and whatever was recorded
before is untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from crux_dask.columns import COLUMNS_FROM, EventColumns
from crux_dask.encoding import EVENT_MOMENTS
from crux_dask.validation import BatchError, check_event, common_event, is_int
from crux_dask.wire import MAX_BATCH_EVENTS, WIRE_DTYPES, checked_columns

__all__ = [
    "MAX_BATCH_BYTES",
    "VERSION",
    "Batch",
    "BatchError",
    "BatchHead",
    "decode_batch",
    "encode_batch",
    "read_head",
]

VERSION = 3
#: Versions :func:`decode_batch` reads.
VERSIONS = (1, 3)
#: The fields of a batch of each version.
_FIELDS = {1: {"v", "source", "seq", "events"},
           3: {"v", "source", "seq", "strings", "columns", "others"}}
#: Largest encoded batch accepted, in bytes.
MAX_BATCH_BYTES = 16 * 2**20
_MAX_STRING = 2**16


@dataclass(frozen=True, slots=True)
class Batch:
    """A decoded batch: its events as rows (version 1) or in columns (version 2).

    Attributes
    ----------
    source : str
        Who sent it (a worker address).
    seq : int
        The sender's sequence number of the batch.
    rows : list of tuple or None
        The events of a version 1 batch.
    columns : EventColumns or None
        The events of a version 2 batch.
    """

    source: str
    seq: int
    rows: list[tuple] | None = None
    columns: EventColumns | None = None

    def __len__(self) -> int:
        return len(self.rows if self.rows is not None else self.columns)

    @property
    def events(self) -> list[tuple]:
        """The events as tuples, for :meth:`crux_dask.graph.builder.PAGBuilder.apply`."""
        return self.rows if self.rows is not None else self.columns.events()


def encode_batch(events: Iterable[Sequence[Any]], source: str = "", seq: int = 0,
                 columns: bool | None = None) -> bytes:
    """Pack events into one batch.

    Parameters
    ----------
    events : iterable of tuple
    source : str
        Who sends it.
    seq : int
        The sender's sequence number of the batch.
    columns : bool, optional
        Columns (version 3) or rows (version 1).  By default, columns from
        :data:`COLUMNS_FROM` events on: below that, putting events in columns
        and reading them back costs more than it saves.
    """
    if not isinstance(events, list):
        events = list(events)
    if columns is None:
        columns = len(events) >= COLUMNS_FROM
    if not columns:  # msgpack packs a tuple as it packs a list
        return msgpack.packb({"v": 1, "source": source, "seq": seq, "events": events},
                             use_bin_type=True)
    encoded = EventColumns.from_events(events)
    queued = np.flatnonzero(encoded.released_by >= 0).tolist()
    if queued:  # the scheduler's knowledge, not among the wire's columns: whole
        marked = list(events)
        for i in queued:
            marked[i] = ()
        encoded = EventColumns.from_events(marked)
        encoded.others.update((i, events[i]) for i in queued)
    if len(encoded.strings) >= 2**31:
        raise BatchError("too many distinct strings for one batch")
    return msgpack.packb({
        "v": VERSION, "source": source, "seq": seq, "strings": encoded.strings,
        "columns": {name: _column_bytes(getattr(encoded, name), name, dtype)
                    for name, dtype in WIRE_DTYPES.items()},
        "others": [[i, list(event)] for i, event in encoded.others.items()],
    }, use_bin_type=True)


def _column_bytes(values: np.ndarray, name: str, dtype: str) -> bytes:
    """A column's bytes on the wire; none for moments not recorded in the whole batch."""
    if name in EVENT_MOMENTS and np.isnan(values).all():
        return b""
    return np.ascontiguousarray(values, dtype).tobytes()


def decode_batch(data: bytes, max_bytes: int = MAX_BATCH_BYTES) -> Batch:
    """Unpack and validate a batch.

    Raises
    ------
    BatchError
        If the batch is too large, not msgpack, of another version, or any of
        its events is malformed (unknown kind, missing or extra fields, wrong
        types, non-finite or reversed times, columns of the wrong length or
        pointing outside the strings).
    """
    _check_size(data, max_bytes)
    try:
        message = msgpack.unpackb(data, raw=False, **_limits(max_bytes))
    except Exception as error:  # msgpack raises several unrelated types
        raise BatchError(f"batch is not valid msgpack: {error}") from None
    if not isinstance(message, dict):
        raise BatchError(f"a batch must be a map, not {type(message).__name__}")
    version = _check_version(message.get("v"))
    fields = _FIELDS[version]
    if set(message) != fields:
        raise BatchError(f"a version {version} batch has the fields {', '.join(sorted(fields))};"
                         f" got {sorted(map(str, message))}")
    source, seq = _check_sender(message["source"], message["seq"])
    if version == 1:
        return Batch(source, seq, rows=_rows(message["events"]))
    return Batch(source, seq, columns=checked_columns(message["strings"], message["columns"],
                                               message["others"]))


@dataclass(frozen=True, slots=True)
class BatchHead:
    """What :func:`read_head` reads of a batch: its sender, version and size.

    Attributes
    ----------
    source : str
    seq : int
    version : int
    events : int
        How many events the batch holds.
    """

    source: str
    seq: int
    version: int
    events: int


def read_head(data: bytes, max_bytes: int = MAX_BATCH_BYTES) -> BatchHead:
    """The head of a batch, read without its events: a few microseconds, where
    :func:`decode_batch` takes about one per event.

    For a process that passes batches on to be decoded elsewhere: what it
    reads is checked as :func:`decode_batch` checks it, and the events are
    counted (the rows of version 1, the ``kind`` column of version 3), not
    checked.  A batch this accepts may still be rejected by
    :func:`decode_batch`; one it rejects always is.

    Raises
    ------
    BatchError
        If the batch is too large, not a msgpack map, of another version,
        from a sender that is not a string, numbered by anything but an
        integer, or with no events where its version has them.
    """
    _check_size(data, max_bytes)
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1),
                                **_limits(max_bytes))
    unpacker.feed(data)
    head: dict[str, Any] = {}
    events = None
    try:
        fields = unpacker.read_map_header()
        for field in range(min(fields, len(_FIELDS[VERSION]) + 1)):
            name = unpacker.unpack()
            if name == "events":  # counted, and read only if fields follow (workers
                try:                  # write it last)
                    events = unpacker.read_array_header()
                except ValueError:
                    raise BatchError("batch field 'events' must be an array") from None
                if field == fields - 1:
                    break
                for _ in range(events):
                    unpacker.skip()
            elif name in ("v", "source", "seq", "columns"):
                head[name] = unpacker.unpack()
            else:
                unpacker.skip()
    except BatchError:
        raise
    except Exception as error:  # msgpack raises several unrelated types
        raise BatchError(f"batch is not valid msgpack, or not a map: {error}") from None
    version = _check_version(head.get("v"))
    source, seq = _check_sender(head.get("source"), head.get("seq"))
    if version != 1:
        kind = head.get("columns", {}).get("kind") if isinstance(head.get("columns"),
                                                                dict) else None
        events = len(kind) if isinstance(kind, bytes) else None
    if events is None:
        raise BatchError(f"a version {version} batch has the fields "
                         f"{', '.join(sorted(_FIELDS[version]))}")
    return BatchHead(source, seq, version, events)



def _limits(max_bytes: int) -> dict[str, Any]:
    """msgpack's bounds for reading a batch of at most ``max_bytes``."""
    return {"strict_map_key": True, "max_str_len": _MAX_STRING, "max_bin_len": max_bytes,
            "max_array_len": MAX_BATCH_EVENTS, "max_map_len": 32, "max_ext_len": 0}


def _check_size(data: Any, max_bytes: int) -> None:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BatchError(f"a batch must be bytes, not {type(data).__name__}")
    if len(data) > max_bytes:
        raise BatchError(f"batch of {len(data)} bytes exceeds the limit of {max_bytes}")


def _check_version(version: Any) -> int:
    if version not in VERSIONS or isinstance(version, bool):
        raise BatchError(f"unsupported batch version {version!r} (this reads "
                         f"{' and '.join(map(str, VERSIONS))})")
    return version


def _check_sender(source: Any, seq: Any) -> tuple[str, int]:
    if not isinstance(source, str):
        raise BatchError("batch field 'source' must be a string")
    if not is_int(seq):
        raise BatchError("batch field 'seq' must be an integer")
    return source, seq


def _rows(events: Any) -> list[tuple]:
    if not isinstance(events, list):
        raise BatchError("batch field 'events' must be an array")
    checked = []
    for index, event in enumerate(events):
        fast = common_event(event)
        checked.append(fast if fast is not None else check_event(index, event))
    return checked
