"""What both ends of the wire agree on: the plugins' name, the RPC handler, key strings.

Workers import this module, never the scheduler side: it needs nothing but the
standard library.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EVENTS_HANDLER", "FILES", "FILES_HANDLER", "FOLLOW", "MOMENTS", "PLUGIN_NAME",
           "SHARDS", "key_string"]

#: The name both plugins register under, on the scheduler and on every worker.
PLUGIN_NAME = "crux"
#: The scheduler RPC handler that receives the workers' event batches.
EVENTS_HANDLER = "crux_events"
#: Where a worker leaves a task's moments in the task's ``metadata``:
#: ``[received, runnable]``.  distributed sends the metadata to the scheduler
#: with the task's completion, so the moments cost no message of their own.
MOMENTS = "crux"
#: Where a worker leaves, the same way, the files a task opened:
#: ``[io seconds or None, host, [[path, written, size], ...]]``; for a task that
#: opened many, whose sizes are taken after its completion is sent, the list is
#: :data:`FOLLOW`: the worker sends it later, through :data:`FILES_HANDLER`.
FILES = "crux-files"
#: The files of a task's ``FILES`` metadata that the worker sends after it.
FOLLOW = "follow"
#: The scheduler RPC handler that receives those files:
#: ``files=[[key string, [[path, written, size], ...]], ...]``.
FILES_HANDLER = "crux_files"
#: Where a worker leaves, the same way, when a P2P transfer task split its input
#: partition and into which shards: ``[time, [[destination worker, bytes], ...]]``.
SHARDS = "crux-shards"


def key_string(key: Any) -> str:
    """The ``str(key)`` form the graph stores Dask keys in.

    Parameters
    ----------
    key : str, bytes, int, float or tuple
        A Dask key.

    Returns
    -------
    str
        ``key`` itself if it is a string, else ``str(key)``.
    """
    return key if isinstance(key, str) else str(key)
