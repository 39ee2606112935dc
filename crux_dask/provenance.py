"""The Parquet provenance dataset: export, import, and its checks.

Layout of a dataset directory (several runs, one partition each)::

    metadata.json                          schema version, and per run: Dask and
                                           Python versions, cluster shape, config
    states.parquet/run_id=<id>/part-0.parquet
    mutations.parquet/run_id=<id>/...
    tasks.parquet/run_id=<id>/...          one row per computed task
    transitions.parquet/run_id=<id>/...    scheduler transitions (when recorded)
    wcp.parquet/run_id=<id>/...            the observed critical path's steps

Each table is a hive-partitioned dataset that pandas, pyarrow, DuckDB and
Polars read as one table with a ``run_id`` column.  A run is written under a
temporary name and renamed into place, and becomes part of the dataset only
when ``metadata.json`` (replaced atomically) lists it: a crash never leaves a
half-written run that readers would see.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crux_dask.model import ROOT, MutationKind
from crux_dask.pag import PAG
from crux_dask.rebuild import store_from_columns
from crux_dask.store import NO_THREAD, PAGStore

__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "ProvenanceError",
    "read_dataset",
    "read_table",
    "tasks_frame",
    "write_dataset",
]

SCHEMA_VERSION = 1
TABLES = ("states", "mutations", "tasks", "transitions", "wcp")
METADATA = "metadata.json"


class ProvenanceError(ValueError):
    """A provenance dataset that cannot be read; the message names the file."""


def _schemas() -> dict[str, Any]:
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
            ("nbytes", pa.int64()), ("final_state", text),
        ]),
        "transitions": pa.schema([
            ("key", pa.string()), ("start", text), ("finish", text), ("time", pa.float64()),
            ("location", text), ("stimulus_id", pa.string()),
        ]),
        "wcp": pa.schema([
            ("step", pa.int64()), ("mutation_id", pa.int64()), ("kind", text),
            ("category", text), ("key", pa.string()), ("label", text), ("source", text),
            ("destination", text), ("size", pa.int64()), ("start", pa.float64()),
            ("stop", pa.float64()), ("cost", pa.float64()), ("busy", pa.float64()),
            ("wait", pa.float64()),
        ]),
    }


def _dictionary(codes: np.ndarray, values: list[str] | Any) -> Any:
    """An Arrow dictionary array from codes into ``values`` (-1 is null).

    ``values`` may repeat a string (the key table does, for recomputed data):
    the dictionary written is made unique first.  ``values`` may also be the
    result of :func:`_unique` of them, to encode a large table only once.
    """
    import pyarrow as pa

    unique = values if isinstance(values, pa.DictionaryArray) else _unique(values)
    remap = unique.indices.to_numpy(zero_copy_only=False).astype("int32")
    codes = np.asarray(codes)
    missing = codes < 0
    indices = remap[np.where(missing, 0, codes)] if len(remap) else np.zeros(len(codes),
                                                                              "int32")
    return pa.DictionaryArray.from_arrays(pa.array(indices, mask=missing, type=pa.int32()),
                                          unique.dictionary)


def _unique(values: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(values, type=pa.string()).dictionary_encode()


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
    ], schema=_schemas()["states"])


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
    ], schema=_schemas()["mutations"])


def tasks_table(store: PAGStore) -> Any:
    """One row per task computed in a run: where, when, from what, and how it ended.

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
    key_strings = pa.array(store.keys.values, type=pa.string())
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
        pa.array(store.column("state_size")[made], type=pa.int64()),
        _dictionary(final, ["erred", "released", "memory"]),
    ], schema=_schemas()["tasks"])


def tasks_frame(pag: PAG, run_id: str | None = None) -> pd.DataFrame:
    """:func:`tasks_table` of one run (the latest by default) as pandas."""
    return _to_pandas(tasks_table(pag.store(run_id)))


def _to_pandas(table: Any) -> pd.DataFrame:
    frame = table.to_pandas()
    for column in frame.columns:
        if isinstance(frame[column].dtype, pd.CategoricalDtype):
            frame[column] = frame[column].astype("str")
    return frame


def write_dataset(path: str | os.PathLike, pag: PAG, metadata: dict[str, Any] | None = None,
                  transitions: pd.DataFrame | None = None) -> Path:
    """Add every run of ``pag`` to the dataset at ``path`` (created if needed).

    Parameters
    ----------
    path : path-like
        The dataset directory.
    pag : PAG
    metadata : dict, optional
        Facts about the run (versions, cluster shape, configuration), stored in
        ``metadata.json`` under the run's id.
    transitions : DataFrame, optional
        Scheduler transitions (``key, start, finish, time, location, stimulus_id``)
        of the last run.

    Returns
    -------
    Path
        The dataset directory.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    existing = _read_metadata(root) if (root / METADATA).exists() else {
        "schema_version": SCHEMA_VERSION, "runs": {}}
    for index, run_id in enumerate(pag.run_ids):
        store = pag.store(run_id)
        last = index == len(pag.run_ids) - 1
        incoming = root / f".incoming-{uuid.uuid4().hex}"
        incoming.mkdir()
        try:
            # pyarrow writes without the GIL: each table is written while the
            # next one is built from the store's columns.
            with ThreadPoolExecutor(max_workers=len(TABLES)) as pool:
                writes = [pool.submit(_write_parquet, table, incoming / f"{name}.parquet")
                          for name, table in _run_tables(pag, run_id,
                                                         transitions if last else None)]
                for write in writes:
                    write.result()
            for table in TABLES:
                target = root / f"{table}.parquet" / f"run_id={run_id}"
                target.mkdir(parents=True, exist_ok=True)
                os.replace(incoming / f"{table}.parquet", target / "part-0.parquet")
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        existing["runs"][run_id] = {**(metadata or {}), "states": store.n_states,
                                    "mutations": store.n_mutations}
        _write_metadata(root, existing)
    return root


def _run_tables(pag: PAG, run_id: str, transitions: pd.DataFrame | None
                ) -> Iterator[tuple[str, Any]]:
    """The tables of one run, as Arrow, one at a time."""
    import pyarrow as pa

    schemas = _schemas()
    store = pag.store(run_id)
    keys = _unique(store.keys.values)
    yield "states", states_table(store, keys)
    yield "mutations", mutations_table(store, keys)
    yield "tasks", tasks_table(store)
    if transitions is None:
        transitions = pd.DataFrame(columns=schemas["transitions"].names)
    for name, frame in (("transitions", transitions),
                        ("wcp", pag.wcp(run_id=run_id).to_frame())):
        yield name, pa.Table.from_pandas(frame[schemas[name].names], schema=schemas[name],
                                         preserve_index=False)


def _write_parquet(table: Any, file: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Dictionary pages for the strings only: numbers are nearly all distinct.
    strings = [f.name for f in table.schema if pa.types.is_dictionary(f.type)]
    pq.write_table(table, file, compression="zstd", use_dictionary=strings,
                   write_statistics=False)


def _write_metadata(root: Path, metadata: dict[str, Any]) -> None:
    temporary = root / f".{METADATA}.{uuid.uuid4().hex}"
    temporary.write_text(json.dumps(metadata, indent=2, default=str))
    os.replace(temporary, root / METADATA)


def _read_metadata(root: Path) -> dict[str, Any]:
    file = root / METADATA
    if not root.is_dir():
        raise ProvenanceError(f"{root}: no such dataset directory")
    if not file.is_file():
        raise ProvenanceError(f"{file}: missing; {root} is not a crux_dask dataset")
    try:
        metadata = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProvenanceError(f"{file}: not valid JSON ({error})") from None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("runs"), dict):
        raise ProvenanceError(f"{file}: not a crux_dask metadata file")
    version = metadata.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ProvenanceError(f"{file}: schema version {version!r} is not supported "
                              f"(this is version {SCHEMA_VERSION})")
    return metadata


def _arrow_table(path: Path, table: str, run_id: str) -> Any:
    """One table of one run as Arrow, checked against the schema."""
    import pyarrow.parquet as pq

    file = path / f"{table}.parquet" / f"run_id={run_id}" / "part-0.parquet"
    if not file.is_file():
        raise ProvenanceError(f"{file}: missing")
    expected = _schemas()[table]
    try:
        arrow = pq.read_table(file)
    except Exception as error:  # pyarrow raises several types for damaged files
        raise ProvenanceError(f"{file}: not a readable Parquet file ({error})") from None
    missing = [name for name in expected.names if name not in arrow.schema.names]
    if missing:
        raise ProvenanceError(f"{file}: not a crux_dask {table} table (lacks {missing})")
    return arrow.select(expected.names)


def read_table(path: str | os.PathLike, table: str, run_id: str) -> pd.DataFrame:
    """One table of one run as pandas, checked against the schema."""
    frame = _to_pandas(_arrow_table(Path(path), table, run_id))
    frame.insert(1, "run_id", pd.Series([run_id] * len(frame), dtype="str"))
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


def _store_from_arrow(run_id: str, states: Any, mutations: Any) -> PAGStore:
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
        **strings,
    )


def read_dataset(path: str | os.PathLike, run_id: str | None = None) -> PAG:
    """The PAG of a dataset's runs (or of one run), as the live API gives it.

    Raises
    ------
    ProvenanceError
        If the directory, a file or the schema version is not what it should be.
    """
    root = Path(path)
    metadata = _read_metadata(root)
    runs = list(metadata["runs"])
    if run_id is not None:
        if run_id not in metadata["runs"]:
            raise ProvenanceError(f"{root}: no run {run_id!r}; runs: {', '.join(runs)}")
        runs = [run_id]
    if not runs:
        raise ProvenanceError(f"{root / METADATA}: the dataset holds no run")
    stores = []
    for run in runs:
        states = _arrow_table(root, "states", run)
        mutations = _arrow_table(root, "mutations", run)
        try:
            stores.append(_store_from_arrow(run, states, mutations))
        except ValueError as error:
            raise ProvenanceError(f"{root}: run {run} has inconsistent tables "
                                  f"({error})") from None
    return PAG(stores)
