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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crux_dask.pag import PAG

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


def tasks_frame(pag: PAG, run_id: str | None = None) -> pd.DataFrame:
    """One row per task computed in a run: where, when, from what, and how it ended."""
    store = pag.store(run_id)
    states = store.states_frame()
    mutations = store.mutations_frame()
    # A task's state is the one computed on an executor thread, whatever the kind of
    # its mutations (an annotation may make a task a TRANSFER or a DELETE).
    made = states[states["thread"].notna()]
    key_of = states["key"].to_numpy(dtype=object)
    computed = mutations[mutations["dst"].isin(made["state_id"])]
    inputs = computed[states["location"].to_numpy()[computed["src"].to_numpy()] != "root"]
    dependencies = inputs.groupby("dst")["src"].agg(lambda s: sorted(key_of[s.to_numpy()]))
    deleted = set(mutations.loc[mutations["kind"] == "DELETE", "src"].tolist())
    start = store.column("state_start")
    final = np.where(made["origin"] == "erred", "erred",
                     np.where(made["state_id"].isin(deleted), "released", "memory"))
    return pd.DataFrame({
        "key": made["key"].to_numpy(dtype=object),
        "prefix": made["label"].to_numpy(dtype=object),
        "state_id": made["state_id"].to_numpy(),
        "dependencies": [dependencies.get(s, []) for s in made["state_id"].tolist()],
        "worker": made["worker"].to_numpy(dtype=object),
        "thread": made["thread"].astype("int64").to_numpy(),
        "compute_start": start[made["state_id"].to_numpy()],
        "compute_stop": made["time"].to_numpy(),
        "nbytes": made["size"].to_numpy(),
        "final_state": final,
    })


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
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    existing = _read_metadata(root) if (root / METADATA).exists() else {
        "schema_version": SCHEMA_VERSION, "runs": {}}
    schemas = _schemas()
    for index, run_id in enumerate(pag.run_ids):
        store = pag.store(run_id)
        frames = {
            "states": store.states_frame(),
            "mutations": store.mutations_frame(),
            "tasks": tasks_frame(pag, run_id),
            "transitions": (transitions if transitions is not None
                            and index == len(pag.run_ids) - 1
                            else pd.DataFrame(columns=schemas["transitions"].names)),
            "wcp": pag.wcp(run_id=run_id).to_frame(),
        }
        incoming = root / f".incoming-{uuid.uuid4().hex}"
        incoming.mkdir()
        try:
            for table, frame in frames.items():
                schema = schemas[table]
                arrow = pa.Table.from_pandas(frame[schema.names], schema=schema,
                                             preserve_index=False)
                pq.write_table(arrow, incoming / f"{table}.parquet", compression="zstd")
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


def read_table(path: str | os.PathLike, table: str, run_id: str) -> pd.DataFrame:
    """One table of one run, checked against the schema."""
    import pyarrow.parquet as pq

    file = Path(path) / f"{table}.parquet" / f"run_id={run_id}" / "part-0.parquet"
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
    frame = arrow.select(expected.names).to_pandas()
    for column in frame.columns:
        if isinstance(frame[column].dtype, pd.CategoricalDtype):
            frame[column] = frame[column].astype("str")
    frame.insert(1, "run_id", pd.Series([run_id] * len(frame), dtype="str"))
    return frame


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
    states = [read_table(root, "states", r) for r in runs]
    mutations = [read_table(root, "mutations", r) for r in runs]
    states_frame = pd.concat(states, ignore_index=True)
    mutations_frame = pd.concat(mutations, ignore_index=True)
    states_frame["thread"] = states_frame["thread"].astype("Int64")
    mutations_frame["thread"] = mutations_frame["thread"].astype("Int64")
    try:
        return PAG.from_frames(states_frame, mutations_frame)
    except ValueError as error:
        raise ProvenanceError(f"{root}: inconsistent tables ({error})") from None
