"""What both ends of the wire agree on: the plugins' name, the RPC handlers, what a
worker reports of a task, key strings.

Workers import this module, never the scheduler side: it needs nothing but the
standard library.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CORES_METRIC", "CPU_TIME_METRIC", "EVENTS_HANDLER", "FILES", "FILES_HANDLER", "FOLLOW",
           "PLUGIN_NAME", "REPORTED", "REPORT_FIELDS", "SHARDS", "TASKS", "TIMES",
           "key_string"]

#: The name both plugins register under, on the scheduler and on every worker.
PLUGIN_NAME = "crux"
#: The worker metric (``Worker.metrics``, sent with each heartbeat) of the cores of
#: the worker's host, as Dask counts them: what its busy threads compete for.
CORES_METRIC = "crux-cores"
#: The worker's metric of the CPU seconds its process has used (all its threads).
CPU_TIME_METRIC = "crux-cpu-time"
#: The scheduler RPC handler that receives the workers' event batches.
EVENTS_HANDLER = "crux_events"
#: The scheduler RPC handler's argument that carries, with a batch, the tasks the
#: worker finished: msgpack of an array of arrays, one per task, of
#: :data:`REPORT_FIELDS`.
TASKS = "tasks"
#: What a worker reports of each task it finished, in this order: the key, the
#: thread it ran in, its ``compute`` start and stop (in the scheduler's clock),
#: the bytes it made, its inputs' keys, its prefix, its ``crux`` annotation (or
#: None), its priority on the worker (the scheduler's, then the worker's own
#: generation; or None), when it reached the worker and when all its inputs were
#: there (or None), the shards a P2P transfer task split its data into
#: (``[split time, [[destination, bytes], ...]]``, or None), and the seconds its
#: thread spent on a CPU and waited for one while it ran (or None).  Keys are as Dask
#: names them (msgpack gives a tuple back as an array): the receiver makes
#: their strings, not the worker.
REPORT_FIELDS = ("key", "thread", "start", "stop", "nbytes", "inputs", "prefix", "annotation",
                 "priority", "received", "runnable", "shards", "cpu", "cpu_wait")
#: Where a worker marks, in a task's ``metadata``, that it reports the task when
#: it finishes: distributed sends the metadata to the scheduler with the task's
#: completion, which tells the scheduler to record only what it alone knows.
REPORTED = "crux-reported"
#: A task that opened files is not reported: the scheduler records it whole, in
#: the order tasks finish across workers, which a file read after it was written
#: elsewhere must keep.  Its worker leaves in its ``metadata``, the same way,
#: the task's moments, the shift from distributed's clock estimate to its own (see
#: :mod:`crux_dask.plugins.clock`) and its CPU seconds and wait for a core
#: (``[received, runnable, shift, cpu, cpu_wait]``) here,
TIMES = "crux"
#: the files it opened (``[io seconds or None, host, [[path, written, size],
#: ...]]``; for a task that opened many, whose sizes are taken after its
#: completion is sent, the list is :data:`FOLLOW`: the worker sends it later,
#: through :data:`FILES_HANDLER`) here,
FILES = "crux-files"
#: and the shards it made, as in a report, here.
SHARDS = "crux-shards"
#: The files of a task's ``FILES`` metadata that the worker sends after it.
FOLLOW = "follow"
#: The scheduler RPC handler that receives those files:
#: ``files=[[key string, [[path, written, size], ...]], ...]``.
FILES_HANDLER = "crux_files"


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
