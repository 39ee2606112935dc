"""The Parquet provenance dataset: export, import, and its checks.

Layout of a dataset directory (several runs, one partition each)::

    metadata.json                          schema version, and per run: Dask and
                                           Python versions, cluster shape, config
    states.parquet/run_id=<id>/part-0.parquet
    mutations.parquet/run_id=<id>/...
    causes.parquet/run_id=<id>/...         causes besides data (a freed thread or slot)
    moments.parquet/run_id=<id>/...        when operations were requested, received,
                                           runnable; tasks' priorities
    scopes.parquet/run_id=<id>/...         the computations and spans of the run
    tasks.parquet/run_id=<id>/...          one row per computed task
    transitions.parquet/run_id=<id>/...    scheduler transitions (when recorded)
    wcp.parquet/run_id=<id>/...            the observed critical path's steps
    functions.parquet/run_id=<id>/...      the function each task group runs
    groups.parquet/run_id=<id>/...         how each task group's seconds and bytes spread

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
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from crux_dask.pag import PAG
from crux_dask.scopes import Scope
from crux_dask.tables import (
    causes_table,
    moments_table,
    mutations_table,
    schemas,
    states_table,
    store_from_arrow,
    tasks_table,
    to_pandas,
    unique,
)

__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "ProvenanceError",
    "read_dataset",
    "read_functions",
    "read_groups",
    "read_load",
    "read_scopes",
    "read_table",
    "tasks_frame",
    "write_dataset",
]

SCHEMA_VERSION = 10
#: Versions :func:`read_dataset` reads: version 1 had no causes or moments,
#: version 2 no computations and spans, version 3 no task priorities, version
#: 4 no seconds on files nor times of submission, version 5 no first sending
#: of tasks sent again, version 6 no moment the scheduler learnt a task finished
#: nor stages of a path's scheduling nor load, version 7 no CPU seconds of tasks
#: nor their waits for a core, version 8 no CPU seconds of each process in the load,
#: version 9 no moment its system monitor measured each sample.
SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
#: Columns an earlier schema version did not write, as ``(table, column)``:
#: they read as not recorded.
LATER_COLUMNS = frozenset({("moments", "priority"), ("moments", "io"), ("wcp", "io"),
                           ("moments", "submitted"), ("wcp", "client"),
                           ("moments", "first_requested"), ("wcp", "rescheduled"),
                           ("moments", "announced"), ("wcp", "report"), ("wcp", "scheduler"),
                           ("wcp", "dispatch"), ("wcp", "worker"), ("moments", "cpu"),
                           ("moments", "cpu_wait"), ("tasks", "compute_cpu"),
                           ("tasks", "compute_cpu_wait"), ("load", "cpu_time"),
                           ("load", "measured")})
TABLES = ("states", "mutations", "causes", "moments", "scopes", "tasks", "transitions", "wcp",
          "load", "functions", "groups")
METADATA = "metadata.json"


class ProvenanceError(ValueError):
    """A provenance dataset that cannot be read; the message names the file."""


def tasks_frame(pag: PAG, run_id: str | None = None) -> pd.DataFrame:
    """:func:`tasks_table` of one run (the latest by default) as pandas."""
    return to_pandas(tasks_table(pag.store(run_id)))


def write_dataset(path: str | os.PathLike, pag: PAG, metadata: dict[str, Any] | None = None,
                  transitions: pd.DataFrame | None = None,
                  scopes: Sequence[Scope] = (), load: pd.DataFrame | None = None,
                  functions: pd.DataFrame | None = None) -> Path:
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
    scopes : sequence of Scope, optional
        The computations and spans of the last run (:mod:`crux_dask.scopes`).
    load : DataFrame, optional
        The load sampled during the last run (:data:`~crux_dask.load.LOAD_COLUMNS`).
    functions : DataFrame, optional
        The function of each task group of the last run
        (:data:`~crux_dask.functions.FUNCTION_COLUMNS`).

    Returns
    -------
    Path
        The dataset directory.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    existing = _read_metadata(root) if (root / METADATA).exists() else {
        "schema_version": SCHEMA_VERSION, "runs": {}}
    existing["schema_version"] = SCHEMA_VERSION  # runs of version 1 read as before
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
                                                         transitions if last else None,
                                                         scopes if last else (),
                                                         load if last else None,
                                                         functions if last else None)]
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


def _run_tables(pag: PAG, run_id: str, transitions: pd.DataFrame | None,
                scopes: Sequence[Scope], load: pd.DataFrame | None,
                functions: pd.DataFrame | None) -> Iterator[tuple[str, Any]]:
    """The tables of one run, as Arrow, one at a time."""
    import pyarrow as pa

    from crux_dask.functions import function_frame
    from crux_dask.groups import group_stats

    tables = schemas()
    store = pag.store(run_id)
    keys = unique(store.keys.values)
    yield "states", states_table(store, keys)
    yield "mutations", mutations_table(store, keys)
    yield "causes", causes_table(store)
    yield "moments", moments_table(store)
    yield "tasks", tasks_table(store)
    yield "scopes", pa.table({
        "kind": pa.array([s.kind for s in scopes], pa.string()).dictionary_encode(),
        "id": [s.id for s in scopes], "name": [s.name for s in scopes],
        "parent": pa.array([s.parent for s in scopes], pa.string()),
        "start": pa.array([s.start for s in scopes], pa.float64()),
        "stop": pa.array([s.stop for s in scopes], pa.float64()),
        "groups": pa.array([sorted(s.groups) for s in scopes], pa.list_(pa.string())),
    }, schema=tables["scopes"])
    if transitions is None:
        transitions = pd.DataFrame(columns=tables["transitions"].names)
    if load is None:
        load = pd.DataFrame(columns=tables["load"].names)
    for name, frame in (("transitions", transitions), ("load", load),
                        ("functions", function_frame(functions)),
                        ("groups", group_stats(store)),
                        ("wcp", pag.wcp(run_id=run_id).to_frame())):
        yield name, pa.Table.from_pandas(frame[tables[name].names], schema=tables[name],
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
    if version not in SCHEMA_VERSIONS:
        raise ProvenanceError(f"{file}: schema version {version!r} is not supported "
                              f"(this is version {SCHEMA_VERSION})")
    return metadata


def _arrow_table(path: Path, table: str, run_id: str) -> Any:
    """One table of one run as Arrow, checked against the schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = _table_file(path, table, run_id)
    if not file.is_file():
        raise ProvenanceError(f"{file}: missing")
    expected = schemas()[table]
    try:
        arrow = pq.read_table(file)
    except Exception as error:  # pyarrow raises several types for damaged files
        raise ProvenanceError(f"{file}: not a readable Parquet file ({error})") from None
    missing = [name for name in expected.names if name not in arrow.schema.names]
    later = [name for name in missing if (table, name) in LATER_COLUMNS]
    if len(later) < len(missing):
        raise ProvenanceError(f"{file}: not a crux_dask {table} table (lacks "
                              f"{[name for name in missing if name not in later]})")
    for name in later:  # written by an earlier version: not recorded
        field = expected.field(name)
        arrow = arrow.append_column(field, pa.nulls(len(arrow), field.type))
    return arrow.select(expected.names)


def _table_file(path: Path, table: str, run_id: str) -> Path:
    return path / f"{table}.parquet" / f"run_id={run_id}" / "part-0.parquet"


def read_table(path: str | os.PathLike, table: str, run_id: str) -> pd.DataFrame:
    """One table of one run as pandas, checked against the schema."""
    frame = to_pandas(_arrow_table(Path(path), table, run_id))
    frame.insert(1, "run_id", pd.Series([run_id] * len(frame), dtype="str"))
    return frame


def read_load(path: str | os.PathLike, run_id: str | None = None) -> pd.DataFrame:
    """The load sampled during one run (the latest by default), as
    :func:`crux_dask.get_load` gives it: empty for a dataset written before version 7."""
    from crux_dask.load import LOAD_COLUMNS, load_frame

    root = Path(path)
    run_id = list(_read_metadata(root)["runs"])[-1] if run_id is None else run_id
    if not _table_file(root, "load", run_id).is_file():
        return load_frame(None)
    return to_pandas(_arrow_table(root, "load", run_id)).astype(LOAD_COLUMNS)


def read_functions(path: str | os.PathLike, run_id: str | None = None) -> pd.DataFrame:
    """The function each task group of one run (the latest by default) runs, as
    :func:`crux_dask.get_functions` gives it: empty for a dataset written without it."""
    from crux_dask.functions import FUNCTION_COLUMNS, function_frame

    root = Path(path)
    run_id = list(_read_metadata(root)["runs"])[-1] if run_id is None else run_id
    if not _table_file(root, "functions", run_id).is_file():
        return function_frame(None)
    return to_pandas(_arrow_table(root, "functions", run_id)).astype(FUNCTION_COLUMNS)


def read_groups(path: str | os.PathLike, run_id: str | None = None) -> pd.DataFrame:
    """The statistics of every task group of one run (the latest by default), as
    :func:`crux_dask.groups.group_stats` gives them: empty for a dataset written without
    them."""
    from crux_dask.groups import GROUP_COLUMNS, no_groups

    root = Path(path)
    run_id = list(_read_metadata(root)["runs"])[-1] if run_id is None else run_id
    if not _table_file(root, "groups", run_id).is_file():
        return no_groups()
    return to_pandas(_arrow_table(root, "groups", run_id)).astype(GROUP_COLUMNS)


def read_scopes(path: str | os.PathLike, run_id: str) -> list[Scope]:
    """The computations and spans of one run, oldest first (none before version 3)."""
    root = Path(path)
    if not _table_file(root, "scopes", run_id).is_file():
        return []
    frame = to_pandas(_arrow_table(root, "scopes", run_id))
    return [Scope(str(row.kind), row.id, row.name, float(row.start), float(row.stop),
                  frozenset(row.groups), row.parent if isinstance(row.parent, str) else None)
            for row in frame.itertuples(index=False)]


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
        # Runs written before causes and moments were recorded have neither.
        causes, moments = (_arrow_table(root, name, run) if _table_file(root, name, run)
                           .is_file() else None for name in ("causes", "moments"))
        try:
            stores.append(store_from_arrow(run, states, mutations, causes, moments))
        except ValueError as error:
            raise ProvenanceError(f"{root}: run {run} has inconsistent tables "
                                  f"({error})") from None
    return PAG(stores)
