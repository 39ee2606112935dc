"""The wire format: round trips, and every kind of malformed batch rejected whole."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crux_dask import BatchError, PAGBuilder, decode_batch, encode_batch
from crux_dask.codec import COLUMNS_FROM, MAX_BATCH_BYTES, VERSION, read_head
from crux_dask.events import parse

texts = st.text(max_size=20)
times = st.floats(0, 2e9, allow_nan=False)
sizes = st.integers(0, 2**40)


@st.composite
def events(draw):
    kind = draw(st.sampled_from(["compute", "transfer", "delete", "root"]))
    if kind == "root":
        return ("root", draw(times), draw(texts))
    if kind == "delete":
        return ("delete", draw(texts), draw(texts), draw(times))
    start = draw(times)
    stop = start + draw(st.floats(0, 100))
    if kind == "transfer":
        transfer = ("transfer", draw(texts), draw(texts), draw(texts), start, stop,
                    draw(st.none() | sizes))
        return transfer + draw(st.sampled_from([(), (None,), (start - 0.5,)]))
    return ("compute", draw(texts), draw(texts), draw(st.none() | st.integers(0, 2**62)),
            start, stop, draw(sizes), tuple(draw(st.lists(texts, max_size=4))),
            draw(st.integers(-1, 100)), draw(st.none() | texts), draw(st.none() | texts),
            draw(st.sampled_from([None, "MERGE", "append"])), draw(st.none() | texts),
            draw(st.none() | texts), draw(st.none() | st.lists(texts, max_size=2).map(tuple)),
            *draw(st.sampled_from([(), (start - 0.1, start - 0.05, start, None, None),
                                   (None, None, None, "other", "w")])))


@settings(max_examples=300)
@given(st.lists(events(), max_size=20), texts, st.integers(0, 2**32))
def test_round_trip(batch, source, seq):
    for columns in (True, False):
        decoded = decode_batch(encode_batch(batch, source, seq, columns=columns))
        assert (decoded.source, decoded.seq) == (source, seq)
        assert decoded.events == [parse(event) for event in batch]
        assert (decoded.columns is not None) == columns


@settings(max_examples=200)
@given(st.lists(events(), max_size=20), st.randoms(use_true_random=False))
def test_columns_taken_in_any_order_and_cut_into_rows_hold_the_same_events(batch, rng):
    from crux_dask.columns import EventColumns
    from crux_dask.events import event_time

    columns = EventColumns.from_events(batch)
    order = list(range(len(batch)))
    rng.shuffle(order)
    taken = columns.take(np.array(order, np.int64))
    assert [parse(e) for e in taken.events()] == [parse(batch[i]) for i in order]
    assert taken.times().tolist() == [event_time(batch[i]) for i in order]
    cut = rng.randint(0, len(batch))
    assert [parse(e) for e in columns.rows(0, cut).events()
            + columns.rows(cut, len(batch)).events()] == [parse(event) for event in batch]


def test_a_few_events_travel_as_rows_and_many_in_columns():
    events = [("delete", f"k{i}", "memory@w", float(i)) for i in range(COLUMNS_FROM)]
    assert msgpack.unpackb(encode_batch(events[:-1]))["v"] == 1
    assert msgpack.unpackb(encode_batch(events))["v"] == VERSION
    builder = PAGBuilder()
    builder.root(0.0)
    for event in events:
        builder.compute(event[1], "w", 1, 0.0, 0.5, 8, ())
    assert builder.apply_batch(encode_batch(events)) == COLUMNS_FROM
    assert builder.store.n_mutations == 2 * COLUMNS_FROM  # appended, then released
    assert builder.n_live == 0


def test_plain_events_travel_in_columns_and_the_rest_whole():
    plain = [("compute", "y", "w", 3, 1.0, 2.0, 8, ("x",), -1, "inc", None, None, None, None,
              None), ("transfer", "y", "memory@w", "memory@v", 2.0, 3.0, None),
             ("delete", "y", "memory@w", 4.0)]
    odd = [("root", 0.5, "graph"),
           ("compute", "z", "w", None, 1.0, 2.0, 8, (), -1, None, None, "MERGE", None, None,
            None)]
    message = msgpack.unpackb(encode_batch(odd[:1] + plain + odd[1:], columns=True))
    assert message["v"] == VERSION
    assert {"y", "w", "memory@w", "memory@v", "x", "inc"} <= set(message["strings"])
    assert len(message["strings"]) == len(set(message["strings"]))
    assert list(message["columns"]["kind"]) == [3, 0, 1, 2, 3]
    assert [i for i, _ in message["others"]] == [0, 4]


def good_event():
    return ["transfer", "x", "memory@a", "memory@b", 1.0, 2.0, 10]


def packed(message) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def batch_of(*events, **fields) -> bytes:
    message = {"v": 1, "source": "w", "seq": 0, "events": list(events)}
    message.update(fields)
    return packed(message)


MALFORMED = {
    "not bytes": ("a string", "must be bytes"),
    "random bytes": (b"\xc1\xff\x00garbage", "not valid msgpack"),
    "truncated": (batch_of(good_event())[:-3], "not valid msgpack"),
    "not a map": (packed([1, 2, 3]), "must be a map"),
    "missing field": (packed({"v": 1, "source": "w", "events": []}), "has the fields"),
    "extra field": (batch_of(extra=1), "has the fields"),
    "wrong version": (batch_of(v=2), "unsupported batch version 2"),
    "boolean version": (batch_of(v=True), "unsupported batch version True"),
    "source not a string": (batch_of(source=3), "'source' must be a string"),
    "seq not an integer": (batch_of(seq="x"), "'seq' must be an integer"),
    "events not an array": (batch_of(events={"a": 1}), "'events' must be an array"),
    "event not an array": (batch_of("transfer"), "event 0: must be a non-empty array"),
    "empty event": (batch_of([]), "event 0: must be a non-empty array"),
    "unknown kind": (batch_of(["explode", 1]), "unknown kind 'explode'"),
    "missing fields": (batch_of(["delete", "x", "memory@a"]), "expected 3 fields"),
    "too many fields": (batch_of(["delete", "x", "memory@a", 1.0, 2]), "expected 3 fields"),
    "wrong key type": (batch_of(["delete", 5, "memory@a", 1.0]), "field 'key'"),
    "time not a number": (batch_of(["delete", "x", "memory@a", "noon"]), "expected a number"),
    "boolean time": (batch_of(["delete", "x", "memory@a", True]), "expected a number"),
    "infinite time": (batch_of(["delete", "x", "memory@a", math.inf]), "finite"),
    "nan time": (batch_of(["delete", "x", "memory@a", math.nan]), "finite"),
    "negative size": (batch_of(["transfer", "x", "a", "b", 1.0, 2.0, -1]), "non-negative"),
    "stop before start": (batch_of(["transfer", "x", "a", "b", 2.0, 1.0, 1]), "stop is before"),
    "inputs not strings": (
        batch_of(["compute", "y", "w", 1, 0.0, 1.0, 8, [1, 2], -1, None, None, None, None,
                  None, None]),
        "field 'inputs'"),
    "unknown mutation kind": (
        batch_of(["compute", "y", "w", 1, 0.0, 1.0, 8, [], -1, None, None, "TELEPORT", None,
                  None, None]),
        "unknown mutation kind"),
    "binary key": (batch_of(["delete", b"\x00" * 10, "a", 1.0]), "field 'key': expected a string"),
    "oversize": (b"\x90" * (MAX_BATCH_BYTES + 1), "exceeds the limit"),
    "huge array header": (b"\xdd\xff\xff\xff\xff", "not valid msgpack"),
}


def columns_of(*events, **changes) -> bytes:
    """A batch in columns of ``events`` with some of its parts replaced."""
    message = msgpack.unpackb(encode_batch(events, columns=True))
    for name, value in changes.items():
        if name in message["columns"]:
            message["columns"][name] = value
        else:
            message[name] = value
    return packed(message)


COMPUTE = ("compute", "y", "w", 3, 1.0, 2.0, 8, ("x",), -1, "inc", None, None, None, None, None)
TRANSFER = ("transfer", "x", "memory@a", "memory@b", 1.0, 2.0, 10)
DELETE = ("delete", "x", "memory@a", 3.0)


def i4(*values: int) -> bytes:
    return np.array(values, "<i4").tobytes()


def f8(*values: float) -> bytes:
    return np.array(values, "<f8").tobytes()


MALFORMED |= {
    "moment not a number": (batch_of([*COMPUTE, "soon"]), "field 'sent': expected a number"),
    "infinite moment": (batch_of([*TRANSFER, math.inf]), "field 'requested'.*finite"),
    "released by no key": (batch_of([*COMPUTE, None, None, None, 7, "w"]),
                           "field 'released_by': expected a string"),
    "columns: infinite moment": (columns_of(COMPUTE, runnable=f8(math.inf)),
                                 "'runnable': expected a finite time"),
    "columns: a release with a moment": (columns_of(DELETE, requested=f8(1.0)),
                                         "'requested': only a computation"),
    "columns: a transfer received": (columns_of(TRANSFER, received=f8(1.0)),
                                     "'received': only a computation"),
    "columns: missing columns": (columns_of(TRANSFER, columns={}), "'columns' must map"),
    "rows field in columns": (columns_of(TRANSFER, events=[]),
                              f"version {VERSION} batch has the fields"),
    "columns: strings not strings": (columns_of(TRANSFER, strings=[1, 2, 3]),
                               "'strings' must be an array of strings"),
    "columns: column not bytes": (columns_of(TRANSFER, key=[0]), "column 'key' must be bytes"),
    "columns: ragged column": (columns_of(TRANSFER, key=b"\x00\x00\x00"), "column 'key' must be"),
    "columns: short column": (columns_of(TRANSFER, DELETE, start=f8(1.0)),
                        "column 'start' has 1 values for 2 events"),
    "columns: unknown kind": (columns_of(TRANSFER, kind=b"\x07"), "kind.*expected 0 to 3"),
    "columns: string out of range": (columns_of(TRANSFER, key=i4(99)),
                               "column 'key': expected an index of a string"),
    "columns: negative index": (columns_of(TRANSFER, location=i4(-5)), "column 'location'"),
    "columns: input out of range": (columns_of(COMPUTE, inputs=i4(1000)),
                              "event 0 \\(compute\\) column 'inputs'"),
    "columns: inputs miscounted": (columns_of(COMPUTE, inputs=i4(0, 0)), "input_count says 1"),
    "columns: nan time": (columns_of(DELETE, start=f8(math.nan), stop=f8(math.nan)),
                    "expected finite times"),
    "columns: reversed times": (columns_of(TRANSFER, stop=f8(0.5)), "stop is before start"),
    "columns: negative size": (columns_of(COMPUTE, nbytes=np.array([-8], "<i8").tobytes()),
                         "column 'nbytes'"),
    "columns: release with a source": (columns_of(DELETE, source=i4(0)), "only a transfer has"),
    "columns: other without its event": (columns_of(DELETE, kind=b"\x03"),
                                   "exactly the events of kind 3"),
    "columns: bad other": (columns_of(("root", 1.0, "g"), others=[[0, ["root", "noon", "g"]]]),
                     "event 0 \\(root\\) field 'time'"),
    "columns: others twice": (columns_of(("root", 1.0, "g"),
                                   others=[[0, ["root", 1.0, "g"]], [0, ["root", 1.0, "g"]]]),
                        "\\[position, event\\] pairs"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_batches_are_rejected_and_change_nothing(name):
    data, message = MALFORMED[name]
    builder = PAGBuilder()
    builder.root(0.0)
    builder.compute("x", "a", 1, 0.0, 1.0, 8, ())
    before = (builder.store.n_states, builder.store.n_mutations)
    with pytest.raises(BatchError, match=message):
        builder.apply_batch(data)
    assert (builder.store.n_states, builder.store.n_mutations) == before


@settings(max_examples=200)
@given(st.lists(events(), max_size=20), texts, st.integers(0, 2**32), st.booleans())
def test_the_head_of_a_batch_says_what_decoding_it_finds(batch, source, seq, columns):
    data = encode_batch(batch, source, seq, columns=columns)
    head, decoded = read_head(data), decode_batch(data)
    assert (head.source, head.seq, head.events) == (decoded.source, decoded.seq, len(decoded))
    assert (head.version != 1) == (decoded.columns is not None)


def test_a_head_read_in_any_order_of_the_fields():
    events = [list(TRANSFER), list(DELETE)]
    data = packed({"events": events, "seq": 7, "v": 1, "source": "w"})
    assert (read_head(data).events, read_head(data).seq) == (2, 7) == (
        len(decode_batch(data)), decode_batch(data).seq)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_batch_with_a_malformed_head_is_refused_by_both_readings(name):
    """What the head reader refuses the decoder refuses too; what it lets through (a
    malformed event) it counts as the decoder would."""
    data, _ = MALFORMED[name]
    try:
        head = read_head(data)
    except BatchError:
        with pytest.raises(BatchError):
            decode_batch(data)
        return
    with pytest.raises(BatchError):
        decode_batch(data)
    if name != "truncated":  # else only its start unpacks
        message = msgpack.unpackb(data)
        assert head.events == (len(message["events"]) if head.version == 1
                               else len(message["columns"]["kind"]))


def test_a_bad_event_anywhere_rejects_the_whole_batch():
    builder = PAGBuilder()
    builder.root(0.0)
    builder.compute("x", "a", 1, 0.0, 1.0, 8, ())
    data = batch_of(good_event(), ["delete", "x", "memory@a", "bad time"])
    with pytest.raises(BatchError, match="event 1"):
        builder.apply_batch(data)
    assert builder.store.n_states == 2


def test_a_valid_batch_applies_every_event():
    builder = PAGBuilder()
    builder.root(0.0)
    builder.compute("x", "a", 1, 0.0, 1.0, 8, ())
    assert builder.apply_batch(batch_of(good_event())) == 1
    assert builder.store.n_states == 3


def test_moments_none_of_the_batch_recorded_cost_no_bytes():
    plain = [("transfer", f"k{i}", "memory@a", "memory@b", 1.0, 2.0, 10)
             for i in range(COLUMNS_FROM)]
    message = msgpack.unpackb(encode_batch(plain))
    assert {message["columns"][m] for m in ("requested", "received", "runnable")} == {b""}
    decoded = decode_batch(encode_batch(plain))
    assert decoded.events == [parse(e) for e in plain]
    asked = [(*event, 0.5) for event in plain]
    message = msgpack.unpackb(encode_batch(asked))
    assert len(message["columns"]["requested"]) == 8 * len(asked)
    assert decode_batch(encode_batch(asked)).events == [parse(e) for e in asked]
