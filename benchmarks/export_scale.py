"""Parquet provenance at scale: export and read back a million states.

Builds the synthetic workflow of ``core_scale.py`` (about 1,000,000 states and
1,900,000 mutations), exports it with :func:`crux_dask.provenance.write_dataset`,
reads it back with :func:`crux_dask.read_parquet`, checks the critical path
survived, and prints the times and the bytes on disk per state.

Usage: ``python benchmarks/export_scale.py [--states N]``
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from core_scale import build

import crux_dask
from crux_dask.provenance import write_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=1_000_000)
    args = parser.parse_args()
    builder, *_ = build(int(args.states / 2.2))
    pag = builder.pag()
    store = builder.store
    print(f"graph: {store.n_states:,} states, {store.n_mutations:,} mutations")
    directory = pathlib.Path(tempfile.mkdtemp(prefix="crux-export-"))
    try:
        started = time.perf_counter()
        write_dataset(directory / "runs", pag)
        exported = time.perf_counter() - started
        started = time.perf_counter()
        back = crux_dask.read_parquet(directory / "runs")
        read = time.perf_counter() - started
        size = sum(f.stat().st_size for f in (directory / "runs").rglob("*") if f.is_file())
        same = back.wcp().states["state_id"].tolist() == pag.wcp().states["state_id"].tolist()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"export: {exported:.2f} s   [target <= 3 s]")
    print(f"read:   {read:.2f} s   [target <= 2 s]")
    print(f"on disk: {size / store.n_states:.1f} bytes per state ({size / 2**20:.1f} MiB); "
          f"critical path identical after the round trip: {same}")


if __name__ == "__main__":
    main()
