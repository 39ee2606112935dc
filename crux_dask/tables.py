"""A run's tables as Arrow, and a run read back from them.

Each table is built straight from the store's columns (strings stay
dictionary-encoded), and read back without going through pandas.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from crux_dask.growable import Strings
from crux_dask.model import MOMENTS, ROOT, CauseKind, MutationKind
from crux_dask.rebuild import store_from_columns
from crux_dask.store import NO_THREAD, PAGStore

__all__ = [
    "causes_table",
    "moments_table",
    "mutations_table",
    "schemas",
    "states_table",
    "store_from_arrow",
    "tasks_table",
    "to_pandas",
    "unique",
]


def schemas() -> dict[str, Any]:
    import pyarrow as pa

    text = pa.dictionary(pa.int32(), pa.string())
    return {
        "states": pa.schema([
            ("state_id", pa.int64()), ("key", text), ("label", text), ("size", pa.int64()),
            ("time", pa.float64()), ("origin", text), ("location", text),
            ("worker", text), ("thread", pa.int64()),
        ]),
        "mutations": pa.schema([
            ("mutation_id", pa.int64()), ("src", pa.int64()), ("dst", pa.int64()),
            ("kind", text), ("cost", pa.float64()), ("busy", pa.float64()),
            ("start", pa.float64()), ("stop", pa.float64()), ("key", text), ("worker", text),
            ("thread", pa.int64()),
        ]),
        "tasks": pa.schema([
            ("key", pa.string()), ("prefix", text), ("state_id", pa.int64()),
            ("dependencies", pa.list_(pa.string())), ("worker", text), ("thread", pa.int64()),
            ("compute_start", pa.float64()), ("compute_stop", pa.float64()),
            ("compute_cpu", pa.float64()), ("compute_cpu_wait", pa.float64()),
            ("nbytes", pa.int64()), ("final_state", text),
        ]),
        "transitions": pa.schema([
            ("key", pa.string()), ("start", text), ("finish", text), ("time", pa.float64()),
            ("location", text), ("stimulus_id", pa.string()),
        ]),
        "load": pa.schema([
            ("process", text), ("time", pa.float64()), ("cpu", pa.float64()),
            ("lag", pa.float64()), ("busy", pa.float64()), ("threads", pa.float64()),
            ("cores", pa.float64()), ("gil", pa.float64()), ("cpu_time", pa.float64()),
            ("measured", pa.float64()),
        ]),
        "functions": pa.schema([
            ("group", pa.string()), ("prefix", text), ("module", text),
            ("qualname", pa.string()), ("file", text), ("line", pa.int64()),
            ("user", pa.bool_()),
        ]),
        "groups": pa.schema([
            ("group", pa.string()), ("prefix", text), ("tasks", pa.int64()),
            ("stragglers", pa.int64()),
            *((f"{measure}_{stat}", pa.float64()) for measure in ("seconds", "output", "input")
              for stat in ("min", "median", "p90", "max")),
        ]),
        "causes": pa.schema([
            ("cause_id", pa.int64()), ("src", pa.int64()), ("dst", pa.int64()),
            ("kind", text),
        ]),
        "moments": pa.schema([
            ("state_id", pa.int64()), ("requested", pa.float64()),
            ("received", pa.float64()), ("runnable", pa.float64()),
            ("priority", pa.float64()), ("io", pa.float64()),
            ("first_requested", pa.float64()), ("announced", pa.float64()),
            ("cpu", pa.float64()), ("cpu_wait", pa.float64()),
            ("submitted", pa.float64()),
        ]),
        "scopes": pa.schema([
            ("kind", text), ("id", pa.string()), ("name", pa.string()),
            ("parent", pa.string()), ("start", pa.float64()), ("stop", pa.float64()),
            ("groups", pa.list_(pa.string())),
        ]),
        "wcp": pa.schema([
            ("step", pa.int64()), ("via", text), ("mutation_id", pa.int64()),
            ("cause_id", pa.int64()), ("kind", text), ("category", text),
            ("key", pa.string()), ("label", text), ("source", text), ("destination", text),
            ("size", pa.int64()), ("start", pa.float64()), ("stop", pa.float64()),
            ("cost", pa.float64()), ("busy", pa.float64()), ("io", pa.float64()),
            ("client", pa.float64()), ("report", pa.float64()), ("scheduler", pa.float64()),
            ("rescheduled", pa.float64()), ("dispatch", pa.float64()),
            ("worker", pa.float64()), ("scheduling", pa.float64()),
            ("queued", pa.float64()), ("wait", pa.float64()),
        ]),
    }


def _dictionary(codes: np.ndarray, values: list[str] | Any) -> Any:
    """An Arrow dictionary array from codes into ``values`` (-1 is null).

    ``values`` may repeat a string (the key table does, for recomputed data):
    the dictionary written is made unique first.  ``values`` may also be the
    result of :func:`_unique` of them, to encode a large table only once.
    """
    import pyarrow as pa

    distinct = values if isinstance(values, pa.DictionaryArray) else unique(values)
    remap = distinct.indices.to_numpy(zero_copy_only=False).astype("int32")
    codes = np.asarray(codes)
    missing = codes < 0
    indices = remap[np.where(missing, 0, codes)] if len(remap) else np.zeros(len(codes),
                                                                              "int32")
    return pa.DictionaryArray.from_arrays(pa.array(indices, mask=missing, type=pa.int32()),
                                          distinct.dictionary)


def unique(values: list[str] | Strings) -> Any:
    import pyarrow as pa

    return pa.array(_listed(values), type=pa.string()).dictionary_encode()


def _listed(values: list[str] | Strings) -> list[str]:
    """A table's strings as a list: Arrow reads a list at C speed, anything else by item."""
    return values.tolist() if isinstance(values, Strings) else values


def _threads(thread: np.ndarray) -> Any:
    import pyarrow as pa

    return pa.array(thread, mask=thread == NO_THREAD, type=pa.int64())


def states_table(store: PAGStore, keys: Any = None) -> Any:
    """The data-state table of a store as Arrow, straight from its columns.

    ``keys`` is the store's key table once made unique (:func:`_unique`), when
    the caller encodes several tables.
    """
    import pyarrow as pa

    key = store.column("state_key")
    labels = store.labels.values
    return pa.Table.from_arrays([
        pa.array(np.arange(store.n_states), type=pa.int64()),
        _dictionary(key, store.keys.values if keys is None else keys),
        _dictionary(store.column("key_label")[key], labels),
        pa.array(store.column("state_size"), type=pa.int64()),
        pa.array(store.column("state_time"), type=pa.float64()),
        _dictionary(store.column("key_origin")[key], labels),
        _dictionary(store.column("state_location"), store.locations.values),
        _dictionary(store.column("state_worker"), store.workers.values),
        _threads(store.column("state_thread")),
    ], schema=schemas()["states"])


def mutations_table(store: PAGStore, keys: Any = None) -> Any:
    """The data-mutation table of a store as Arrow, straight from its columns."""
    import pyarrow as pa

    src = store.column("mutation_src").astype("int64")
    dst = store.column("mutation_dst").astype("int64")
    time = store.column("state_time")
    kinds = [k.name for k in MutationKind]
    return pa.Table.from_arrays([
        pa.array(np.arange(store.n_mutations), type=pa.int64()),
        pa.array(src), pa.array(dst),
        _dictionary(store.column("mutation_kind").astype("int32"), kinds),
        pa.array(time[dst] - time[src], type=pa.float64()),
        pa.array(store.column("mutation_busy"), type=pa.float64()),
        pa.array(store.column("state_start")[dst], type=pa.float64()),
        pa.array(time[dst], type=pa.float64()),
        _dictionary(store.column("state_key")[dst], store.keys.values if keys is None else keys),
        _dictionary(store.column("state_worker")[dst], store.workers.values),
        _threads(store.column("state_thread")[dst]),
    ], schema=schemas()["mutations"])


def causes_table(store: PAGStore) -> Any:
    """The cause table of a store as Arrow."""
    import pyarrow as pa

    return pa.Table.from_arrays([
        pa.array(np.arange(store.n_causes), type=pa.int64()),
        pa.array(store.column("cause_src").astype("int64")),
        pa.array(store.column("cause_dst").astype("int64")),
        _dictionary(store.column("cause_kind").astype("int32"), [k.name for k in CauseKind]),
    ], schema=schemas()["causes"])


def moments_table(store: PAGStore) -> Any:
    """The moments of a store's states that have any, as Arrow."""
    import pyarrow as pa

    return pa.Table.from_pandas(store.moments_frame().drop(columns="run_id"),
                                schema=schemas()["moments"], preserve_index=False)


def tasks_table(store: PAGStore) -> Any:
    """One row per task computed in a run: where, when, from what, how it ended, and
    the CPU seconds its thread spent on it and waited for a core (``compute_cpu``,
    ``compute_cpu_wait``; NaN where not recorded).

    A task's state is the one computed on an executor thread, whatever the
    kind of its mutations (an annotation may make a task a TRANSFER or a DELETE).
    """
    import pyarrow as pa

    thread = store.column("state_thread")
    made = np.flatnonzero(thread != NO_THREAD)
    src = store.column("mutation_src").astype("int64")
    dst = store.column("mutation_dst").astype("int64")
    kind = store.column("mutation_kind")
    location = store.column("state_location")
    root = store.locations.codes.get(ROOT, -2)
    is_task = np.zeros(store.n_states, dtype=bool)
    is_task[made] = True
    inputs = np.flatnonzero(is_task[dst] & (location[src] != root))
    inputs = inputs[np.argsort(dst[inputs], kind="stable")]
    counts = np.bincount(dst[inputs], minlength=store.n_states)[made]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype("int32")
    key = store.column("state_key")
    key_strings = pa.array(store.keys.values.tolist(), type=pa.string())
    dependencies = pa.ListArray.from_arrays(
        pa.array(offsets), key_strings.take(pa.array(key[src[inputs]])))
    deleted = np.zeros(store.n_states, dtype=bool)
    deleted[src[kind == MutationKind.DELETE]] = True
    erred = store.labels.codes.get("erred", -2)
    final = np.where(store.column("key_origin")[key[made]] == erred, 0,
                     np.where(deleted[made], 1, 2))
    return pa.Table.from_arrays([
        key_strings.take(pa.array(key[made])),
        _dictionary(store.column("key_label")[key[made]], store.labels.values),
        pa.array(made, type=pa.int64()),
        dependencies,
        _dictionary(store.column("state_worker")[made], store.workers.values),
        pa.array(thread[made], type=pa.int64()),
        pa.array(store.column("state_start")[made], type=pa.float64()),
        pa.array(store.column("state_time")[made], type=pa.float64()),
        pa.array(store.column("state_cpu")[made], type=pa.float64()),
        pa.array(store.column("state_cpu_wait")[made], type=pa.float64()),
        pa.array(store.column("state_size")[made], type=pa.int64()),
        _dictionary(final, ["erred", "released", "memory"]),
    ], schema=schemas()["tasks"])


def to_pandas(table: Any) -> pd.DataFrame:
    frame = table.to_pandas()
    for column in frame.columns:
        if isinstance(frame[column].dtype, pd.CategoricalDtype):
            frame[column] = frame[column].astype("str")
    return frame


def _codes_and_values(column: Any) -> tuple[np.ndarray, list]:
    """``(codes, values)`` of an Arrow string column (dictionary-encoded or not)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    codes = pc.fill_null(array.indices, -1).to_numpy(zero_copy_only=False)
    return codes.astype("int64"), array.dictionary.to_pylist()


def _numbers(column: Any, dtype: str, missing: int = 0) -> np.ndarray:
    import pyarrow.compute as pc

    return pc.fill_null(column, missing).to_numpy().astype(dtype, copy=False)


def store_from_arrow(run_id: str, states: Any, mutations: Any, causes: Any = None,
                     moments: Any = None) -> PAGStore:
    """A store from one run's Arrow tables (causes and moments may be missing).

    Raises
    ------
    ValueError
        If the tables are not consistent (see :func:`~crux_dask.rebuild.store_from_columns`).
    """
    strings = {name: _codes_and_values(states.column(name))
               for name in ("key", "label", "origin", "location", "worker")}
    return store_from_columns(
        run_id,
        state_id=_numbers(states.column("state_id"), "int64"),
        time=_numbers(states.column("time"), "float64"),
        size=_numbers(states.column("size"), "int64"),
        thread=_numbers(states.column("thread"), "int64", NO_THREAD),
        src=_numbers(mutations.column("src"), "int64"),
        dst=_numbers(mutations.column("dst"), "int64"),
        kind=_codes_and_values(mutations.column("kind")),
        busy=_numbers(mutations.column("busy"), "float64"),
        start=_numbers(mutations.column("start"), "float64"),
        causes=None if causes is None else (
            _numbers(causes.column("src"), "int64"), _numbers(causes.column("dst"), "int64"),
            _codes_and_values(causes.column("kind"))),
        moments=None if moments is None else (
            _numbers(moments.column("state_id"), "int64"),
            {name: moments.column(name).to_numpy().astype("float64")
             for name in MOMENTS
             if name in moments.column_names}),
        **strings,
    )
