"""The graph's string tables read as lists do, and leave the garbage collector nothing to walk."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crux_dask.growable as growable_module
from crux_dask.growable import Strings
from crux_dask.store import PAGStore


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 8 strings, so that a few dozen strings cross several."""
    monkeypatch.setattr(growable_module, "STRINGS_CHUNK", 8)
    monkeypatch.setattr(growable_module, "_SHIFT", 3)
    monkeypatch.setattr(growable_module, "_MASK", 7)


growths = st.lists(st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=20)),
                   max_size=30)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # set once, kept
@given(growths=growths, data=st.data())
def test_reads_as_the_list_it_was_given(small_chunks, growths, data):
    strings, oracle = Strings(), []
    for growth in growths:
        if isinstance(growth, list):
            strings += growth
            oracle += growth
        else:
            strings.append(growth)
            oracle.append(growth)
    assert len(strings) == len(oracle)
    assert list(strings) == oracle and strings == oracle
    assert [strings[i] for i in range(-len(oracle), len(oracle))] == oracle + oracle
    assert np.asarray(strings).tolist() == oracle
    for _ in range(5):
        start = data.draw(st.integers(-40, 40))
        stop = data.draw(st.integers(-40, 40))
        step = data.draw(st.sampled_from([None, 1, 2, 3, -1]))
        assert strings[start:stop:step] == oracle[start:stop:step]
    with pytest.raises(IndexError):
        strings[len(oracle)]


def test_a_read_from_a_thread_sees_what_there_was_when_it_began(small_chunks):
    strings = Strings([f"k{i}" for i in range(20)])
    n = len(strings)
    state = strings._state  # what a reader in another thread holds while it reads
    strings += [f"k{i}" for i in range(20, 100)]  # chunks made meanwhile
    chunks, frozen, newest = state
    assert growable_module._gather(chunks, frozen, newest, 0, n) == [f"k{i}" for i in range(20)]


def test_a_million_keys_are_no_long_list_for_the_collector():
    store = PAGStore("run")
    for i in range(1_000_000):
        store.key_code(f"('x', {i})", "x")
    held = gc.get_referents(store.keys.values._state)
    assert max(len(o) for o in held if isinstance(o, list)) < growable_module.STRINGS_CHUNK
    assert not any(gc.is_tracked(chunk) for chunk in store.keys.values._state[0])
    assert store.keys.values[999_999] == "('x', 999999)"
    copy = store.copy()
    assert copy.keys.values == store.keys.values
    assert PAGStore.from_pieces(store.to_pieces()).keys.values[123_456] == "('x', 123456)"


def test_taking_strings_by_index_gives_what_indexing_one_at_a_time_gives():
    from crux_dask.growable import STRINGS_CHUNK

    strings = Strings(f"s{i}" for i in range(3 * STRINGS_CHUNK + 5))  # chunks and newest
    indices = np.array([0, STRINGS_CHUNK + 1, 3 * STRINGS_CHUNK + 4, 2, 3 * STRINGS_CHUNK, 1])
    assert strings.take(indices).tolist() == [strings[i] for i in indices.tolist()]
    assert strings.take(np.array([], dtype=int)).tolist() == []
