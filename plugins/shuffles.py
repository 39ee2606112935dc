"""The shards of distributed's P2P shuffles, seen from a worker.

A P2P shuffle (dataframe shuffles, merges, ``set_index``, array rechunks)
moves its data outside the worker's normal transfers: each transfer task
splits its input partition into one shard per destination worker and hands
them to the shuffle run's comm buffer, which sends them in the background.
:class:`ShardRecorder` watches each run this worker adds partitions to and
records, with the exact bytes distributed counts itself (the serialized
table, or the arrays' ``nbytes``):

* in the transfer task's thread, when its partition was split and into
  which shards, ``[split time, [[destination worker, bytes], ...]]``, kept by
  task until the task is done and then reported with it;
* on the event loop, each message the comm buffer sent: the shards in it
  moved from this worker's memory to the destination (its memory, or its
  disk where the shuffle writes what it receives to disk), from the send's
  start until the destination had taken them (the answer).

The run's own objects are wrapped on the instance, never its class: a shuffle
this plugin did not watch runs as before, and teardown unwraps the runs still
active.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from distributed.worker import thread_state

from crux_dask.model import disk_location, memory_location, shard_key
from crux_dask.plugins.protocol import key_string

__all__ = ["ShardRecorder", "shard_bytes"]

logger = logging.getLogger(__name__)


def shard_bytes(payload: Any) -> int:
    """The bytes of a shard's data as distributed counts them.

    Serialized tables (bytes) by length, arrays by ``nbytes``; the partition
    and chunk indices around them (ints and tuples of ints) count nothing.
    """
    if isinstance(payload, (bytes, bytearray)):
        return len(payload)
    nbytes = getattr(payload, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(payload, (tuple, list)):
        return sum(map(shard_bytes, payload))
    return 0


class ShardRecorder:
    """Record the shards of the P2P shuffles a worker takes part in.

    Parameters
    ----------
    worker : distributed.Worker
        The worker; its ``shuffle`` plugin is watched, if it has one.
    record : callable
        Takes one event tuple (``transfer``, ``delete``) for the scheduler.
    now : callable
        Now, in the scheduler's clock.

    Attributes
    ----------
    by_task : dict
        Task key -> ``[split time, [[destination, bytes], ...]]``: the shards a
        transfer task made (destinations are locations), until the task is done.
    errors : int
        Failures of the recorder's own wrappers (the shuffle goes on).
    """

    def __init__(self, worker: Any, record: Callable[[tuple], None],
                 now: Callable[[], float]) -> None:
        self.worker = worker
        self.record = record
        self.now = now
        self.by_task: dict[Any, list[list]] = {}
        self.errors = 0
        self._runs: weakref.WeakSet = weakref.WeakSet()
        self._plugin: Any = None

    def start(self) -> None:
        """Watch the runs the worker's shuffle plugin hands to transfer tasks."""
        plugin = getattr(self.worker, "plugins", {}).get("shuffle")
        original = getattr(plugin, "get_or_create_shuffle", None)
        if original is None:
            return

        def get_or_create_shuffle(shuffle_id: Any) -> Any:
            run = original(shuffle_id)
            if run not in self._runs:
                self._watch(run)
            return run

        plugin.get_or_create_shuffle = get_or_create_shuffle
        self._plugin = plugin

    def stop(self) -> None:
        """Unwrap the shuffle plugin and the runs still alive."""
        if self._plugin is not None:
            vars(self._plugin).pop("get_or_create_shuffle", None)
            self._plugin = None
        for run in list(self._runs):
            vars(run).pop("_shard_partition", None)
            buffer = getattr(run, "_comm_buffer", None)
            if buffer is not None and hasattr(buffer.send, "__wrapped__"):
                buffer.send = buffer.send.__wrapped__
        self._runs = weakref.WeakSet()
        self.by_task.clear()

    def _watch(self, run: Any) -> None:
        try:
            split, buffer = run._shard_partition, run._comm_buffer
            send = buffer.send
        except AttributeError:  # a distributed whose runs look otherwise: leave it be
            self.errors += 1
            self._runs.add(run)
            return
        keys: dict[Any, list] = {}  # input partition -> [transfer task key, destinations left]
        local = self.worker.address
        memory = memory_location(local)
        place = disk_location if _writes_to_disk(run) else memory_location

        def _shard_partition(data: Any, partition_id: Any, **kwargs: Any) -> Any:
            out = split(data, partition_id, **kwargs)
            try:
                key = thread_state.key
                self.by_task[key] = [self.now(), [[place(dest), shard_bytes(shard)]
                                                  for dest, shard in out.items()]]
                keys[partition_id] = [key_string(key), len(out)]
            except Exception:
                self.errors += 1
            return out

        async def sent(address: str, shards: list) -> Any:
            start = self.now()
            response = await send(address, shards)
            try:
                if isinstance(response, dict) and response.get("status") == "OK":
                    self._sent(keys, memory, place(address), shards, start)
            except Exception:
                self.errors += 1
            return response

        sent.__wrapped__ = send  # type: ignore[attr-defined]
        run._shard_partition = _shard_partition
        buffer.send = sent
        self._runs.add(run)

    def _sent(self, keys: dict, memory: str, destination: str, shards: list,
              start: float) -> None:
        """The shards of one message reached ``destination``: each moved there, and left here.

        Not before ``start``: the worker's estimate of the scheduler's clock may
        have moved meanwhile (it is renewed at each heartbeat).
        """
        stop = max(start, self.now())
        for shard in shards:
            entry = keys.get(shard[0])
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] <= 0:
                del keys[shard[0]]
            if destination == memory:
                continue  # it stays in this worker's memory
            name = shard_key(entry[0], destination)
            self.record(("transfer", name, memory, destination, start, stop,
                         shard_bytes(shard)))
            self.record(("delete", name, memory, stop))

    def forget(self, key: Any) -> None:
        """The task ``key`` will not be reported done: drop its shards."""
        self.by_task.pop(key, None)


def _writes_to_disk(run: Any) -> bool:
    """Whether a shuffle run keeps the shards it receives on disk (distributed's default)."""
    try:
        from distributed.shuffle._disk import DiskShardsBuffer
    except ImportError:
        return False
    return isinstance(getattr(run, "_disk_buffer", None), DiskShardsBuffer)
