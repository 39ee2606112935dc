"""crux_dask: workflow critical paths of Dask workflows.

The core (this package's own modules) imports neither ``distributed`` nor
``bokeh``; what talks to a cluster lives in :mod:`crux_dask.plugins` and is
reached lazily through the functions below.
"""

from __future__ import annotations

from typing import Any

from crux_dask.builder import PAGBuilder
from crux_dask.codec import BatchError, decode_batch, encode_batch
from crux_dask.pag import PAG
from crux_dask.provenance import ProvenanceError
from crux_dask.provenance import read_dataset as read_parquet
from crux_dask.schema import MutationKind
from crux_dask.store import PAGStore
from crux_dask.wcp import CriticalPath

__version__ = "0.1.0"

__all__ = [
    "PAG",
    "BatchError",
    "CriticalPath",
    "MutationKind",
    "PAGBuilder",
    "PAGStore",
    "ProvenanceError",
    "attach",
    "crux_report",
    "decode_batch",
    "encode_batch",
    "export_parquet",
    "flush",
    "get_pag",
    "get_stats",
    "get_wcp",
    "read_parquet",
]

_CLUSTER_API = {"attach", "get_pag", "get_wcp", "get_stats", "flush", "export_parquet"}


def __getattr__(name: str) -> Any:
    if name == "crux_report":
        from crux_dask.dashboard.report import crux_report

        return crux_report
    if name in _CLUSTER_API:
        from crux_dask.plugins import api

        return getattr(api, name)
    raise AttributeError(f"module 'crux_dask' has no attribute {name!r}")
