"""crux_dask: workflow critical paths of Dask workflows.

The core (this package's own modules) imports neither ``distributed`` nor
``bokeh``; what talks to a cluster lives in :mod:`crux_dask.plugins` and is
reached lazily through the functions below.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Public names and the module each lives in, imported when first used, so
#: that a worker importing what it sends never loads the builder or pandas.
_EXPORTS = {
    "PAG": "crux_dask.pag",
    "BatchError": "crux_dask.validation",
    "decode_batch": "crux_dask.codec",
    "encode_batch": "crux_dask.codec",
    "CriticalPath": "crux_dask.wcp",
    "MutationKind": "crux_dask.model",
    "PAGBuilder": "crux_dask.graph.builder",
    "PAGStore": "crux_dask.store",
    "ProvenanceError": "crux_dask.provenance",
    "read_parquet": "crux_dask.provenance",
    "read_load": "crux_dask.provenance",
    "read_groups": "crux_dask.provenance",
    "read_functions": "crux_dask.provenance",
    "stage_loads": "crux_dask.load",
    "crux_report": "crux_dask.dashboard.report",
    "attach": "crux_dask.plugins.api",
    "get_pag": "crux_dask.plugins.api",
    "get_wcp": "crux_dask.plugins.api",
    "get_computations": "crux_dask.plugins.api",
    "get_stats": "crux_dask.plugins.api",
    "get_load": "crux_dask.plugins.api",
    "get_functions": "crux_dask.plugins.api",
    "flush": "crux_dask.plugins.api",
    "export_parquet": "crux_dask.plugins.api",
}
_RENAMED = {"read_parquet": "read_dataset"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'crux_dask' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
