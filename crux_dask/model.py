"""The data model: data states (vertices) and data mutations (edges).

A *data state* is a piece of data at a place at a time; a *data mutation* turns
states into new states.  The column lists here are the contract of every table
the project produces (live snapshots, Parquet exports, the JSON API).
"""

from __future__ import annotations

import enum

__all__ = [
    "BARRIER_LABEL",
    "CAUSE_COLUMNS",
    "CLIENT",
    "MOMENT_COLUMNS",
    "MUTATION_COLUMNS",
    "RECEIVED_LABEL",
    "ROOT",
    "SHARDS_LABEL",
    "STATE_COLUMNS",
    "CauseKind",
    "MutationKind",
    "disk_location",
    "file_location",
    "location_class",
    "memory_location",
    "received_key",
    "shard_key",
]


class MutationKind(enum.IntEnum):
    """The six data mutations of the Crux model.

    The integer values are stable: they are what the columnar store and the
    wire format hold.
    """

    TRANSFER = 0  #: the same data moved to another location
    CONVERT = 1  #: one input turned into new data
    APPEND = 2  #: new data from nothing (a source task, a file appearing)
    SPLIT = 3  #: one input fanned out to several sibling outputs
    MERGE = 4  #: several inputs combined into one output
    DELETE = 5  #: data released; the target is a zero-size tombstone

    @classmethod
    def parse(cls, value: str | int | MutationKind) -> MutationKind:
        """Return the kind named by ``value`` (case-insensitive name or number).

        Raises
        ------
        ValueError
            If ``value`` names no kind.
        """
        if isinstance(value, MutationKind):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        names = ", ".join(k.name for k in cls)
        raise ValueError(f"unknown mutation kind {value!r}; expected one of {names}")


#: Columns of the data-state table, with their pandas dtypes.
STATE_COLUMNS: dict[str, str] = {
    "state_id": "int64",
    "run_id": "str",
    "key": "str",
    "label": "str",
    "size": "int64",
    "time": "float64",
    "origin": "str",
    "location": "str",
    "worker": "str",
    "thread": "Int64",
}

#: Columns of the data-mutation table, with their pandas dtypes.
MUTATION_COLUMNS: dict[str, str] = {
    "mutation_id": "int64",
    "run_id": "str",
    "src": "int64",
    "dst": "int64",
    "kind": "str",
    "cost": "float64",
    "busy": "float64",
    "start": "float64",
    "stop": "float64",
    "key": "str",
    "worker": "str",
    "thread": "Int64",
}

class CauseKind(enum.IntEnum):
    """Why a step started when it did, besides its data: a resource another task freed.

    A *cause* links the state of the task that freed the resource to the
    state of the task that then started.  Causes live in a table of their own,
    beside the data mutations.
    """

    THREAD = 0  #: the task started on the executor thread the other task's completion freed
    SLOT = 1  #: the scheduler released the task from its queue when the other one finished


#: Columns of the cause table, with their pandas dtypes.
CAUSE_COLUMNS: dict[str, str] = {
    "cause_id": "int64",
    "run_id": "str",
    "src": "int64",
    "dst": "int64",
    "kind": "str",
}

#: Moments of the operations that made states, where recorded (NaN elsewhere):
#: ``requested`` (a task sent to its worker, a fetch asked for by the receiving
#: worker, data gathered by a client: its task seen finished by the scheduler),
#: ``received`` (the worker got the task), ``runnable`` (all the
#: task's inputs were in its worker's memory), a task's ``priority`` in Dask
#: as one number (lower runs first), the seconds of a task's run it spent on
#: files (``io``: off the CPU after it opened its first file), when the
#: scheduler first sent a task it took back and sent again
#: (``first_requested``: a task that raised ``Reschedule``, a P2P shuffle's
#: output pinned to its worker, a task whose worker was lost), when the
#: scheduler learnt that the task finished (``announced``: its transition to
#: memory ran), the seconds the task's thread spent on a CPU (``cpu``) and waited
#: for one (``cpu_wait``), and when the task's graph reached the scheduler
#: (``submitted``, always last).
MOMENT_COLUMNS: dict[str, str] = {
    "state_id": "int64",
    "run_id": "str",
    "requested": "float64",
    "received": "float64",
    "runnable": "float64",
    "priority": "float64",
    "io": "float64",
    "first_requested": "float64",
    "announced": "float64",
    "cpu": "float64",
    "cpu_wait": "float64",
    "submitted": "float64",
}
#: The per-state values of :data:`MOMENT_COLUMNS`, in order.
MOMENTS = tuple(MOMENT_COLUMNS)[2:]

ROOT = "root"
CLIENT = "client"


def memory_location(worker: str) -> str:
    """Location of data held in a worker's memory."""
    return f"memory@{worker}"


def disk_location(worker: str) -> str:
    """Location of data a worker spilled to its local disk."""
    return f"disk@{worker}"


def file_location(host: str, path: str) -> str:
    """Location of a file on a host's file system."""
    return f"file@{host}:{path}"


def file_path(location: str) -> str:
    """The path of a file's location (:func:`file_location`)."""
    return location.partition(":")[2]


#: Names of directories that hold a dataset one file per part (``out.parquet/part.0.parquet``).
DATASET_SUFFIXES = (".parquet", ".zarr", ".n5", ".orc", ".avro", ".csv", ".json")


def file_label(path: str) -> str:
    """What a file is called in the graph: its dataset's name, else its own.

    A file under a directory named like a dataset (:data:`DATASET_SUFFIXES`:
    ``out.parquet/part.0.parquet``, ``x.zarr/x/0.0``) is labelled by the
    nearest such directory; any other file by its name.
    """
    parts = path.rstrip("/").split("/")
    dataset = _dataset(parts)
    return parts[dataset] if dataset else parts[-1] or path


def file_group(path: str) -> str:
    """Where a file's states are shown together: its dataset's directory, else its own.

    ``/d/out.parquet/part.0.parquet`` → ``/d/out.parquet``; ``/d/in/0.csv`` → ``/d/in/``.
    """
    parts = path.rstrip("/").split("/")
    dataset = _dataset(parts)
    return "/".join(parts[:dataset + 1]) if dataset else "/".join(parts[:-1]) + "/"


def _dataset(parts: list[str]) -> int:
    """Index of the nearest directory of ``parts`` named like a dataset; 0 if none."""
    for i in range(len(parts) - 2, 0, -1):
        if parts[i].endswith(DATASET_SUFFIXES):
            return i
    return 0


#: The label of the shards of a P2P shuffle: what a transfer task split its
#: input partition into, one per destination worker.
SHARDS_LABEL = "p2p-shards"
#: The label (task prefix) distributed gives the barrier of every P2P shuffle.
BARRIER_LABEL = "shuffle-barrier"
#: The label of what a worker received of a P2P shuffle (:func:`received_key`).
RECEIVED_LABEL = "p2p-received"


def received_key(barrier_key: str, location: str) -> str:
    """The key of what a worker received of a P2P shuffle: every shard that arrived at
    ``location`` (its memory), merged once for the output tasks that read them."""
    return f"{barrier_key}->received@{location}"


def shard_key(transfer_key: str, destination: str) -> str:
    """The key of the shard the P2P transfer task ``transfer_key`` made for ``destination``.

    ``destination`` is the location the shard is sent to: a worker's memory,
    or its disk where the shuffle keeps what it receives on disk.
    """
    return f"{transfer_key}->{destination}"


def location_class(location: str) -> str:
    """The class of a location: ``memory``, ``disk``, ``file``, ``client`` or ``root``."""
    head, sep, _ = location.partition("@")
    return head if sep else location
