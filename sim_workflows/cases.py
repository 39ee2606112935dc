"""The five HPC workflow patterns of the Crux thesis, as Dask graphs with known answers.

Every case is built from :mod:`~crux_dask.sim_workflows.atoms` and one
:class:`SimConfig` (the thesis's common configuration file) and returns a
:class:`Case`: the graph, the keys its critical path must pass through, and
the seconds of work configured along that path.  File I/O is modelled with
``dask.annotate(crux=...)``: a task writing a file produces a
``file@host:path`` state, a task reading one is a ``TRANSFER`` from it, and a
task removing a temporary file is a ``DELETE`` of it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import yaml

from crux_dask.sim_workflows import atoms

__all__ = ["CASES", "Case", "SimConfig", "build_case"]

KERNELS: dict[str, Callable[..., bytes]] = {
    "wait": atoms.wait,
    "compute": atoms.compute,
    "compute_nogil": atoms.compute_nogil,
}


@dataclasses.dataclass
class SimConfig:
    """Parameters shared by every case (seconds are multiplied by ``scale``).

    Attributes
    ----------
    ranks : int
        MPI ranks of a simulation (per split in ``splits``).
    splits : int
        Data splits in ``splits``.
    slowest_factor : float
        How many times longer the slowest rank takes.
    seed : int
        Picks which rank is the slowest.
    scale : float
        Multiplies every duration.
    kernel : str
        How a step spends its time: ``wait`` (sleep, exact on a busy machine),
        ``compute`` (CPU, holding the GIL) or ``compute_nogil`` (CPU, releasing it).
    stage_in, preprocess, rank, postprocess, viz, simulation : float
        Seconds of each step.
    checkpoint_write, checkpoint_transfer, restart_setup : float
        ``checkpoint``: writing the checkpoint, moving it to the next run, and
        the preparation that runs beside the move.
    second_source_delay : float
        ``sources``: when the second data source becomes available.
    temp_runs : int
        ``tempfiles``: chained runs, each leaving a temporary file for the next.
    data_bytes, rank_bytes, file_bytes : int
        Sizes of stage outputs, of each rank's output, and of files written.
    sync_files : bool
        Whether each file written is synced to disk, so that writing it is
        real I/O.  A sync can stall for up to a second on a busy disk, time that
        is not part of the work configured: a check of the path against that
        work turns it off.
    scratch : str
        Directory for the files; a new temporary directory by default.
    """

    ranks: int = 8
    splits: int = 3
    slowest_factor: float = 3.0
    seed: int = 0
    scale: float = 1.0
    kernel: str = "wait"
    stage_in: float = 0.1
    preprocess: float = 0.2
    rank: float = 0.2
    postprocess: float = 0.1
    viz: float = 0.05
    simulation: float = 0.3
    checkpoint_write: float = 0.1
    checkpoint_transfer: float = 0.6
    restart_setup: float = 0.2
    second_source_delay: float = 1.0
    temp_runs: int = 3
    data_bytes: int = 1_000_000
    rank_bytes: int = 100_000
    file_bytes: int = 2_000_000
    sync_files: bool = True
    scratch: str = ""

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SimConfig:
        """A configuration from a mapping (kebab- or snake-case keys).

        Raises
        ------
        ValueError
            For an unknown key or a value of the wrong type.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for raw_key, value in values.items():
            key = str(raw_key).replace("-", "_")
            if key not in fields:
                raise ValueError(f"unknown simulation setting {raw_key!r}; known: "
                                 f"{', '.join(sorted(fields))}")
            kind = type(fields[key].default)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
                raise ValueError(f"simulation setting {raw_key!r} must be a {kind.__name__}, "
                                 f"got {value!r}")
            kwargs[key] = value
        config = cls(**kwargs)
        if config.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {config.kernel!r}; expected one of "
                             f"{', '.join(KERNELS)}")
        if config.ranks < 1 or config.splits < 1 or config.temp_runs < 1:
            raise ValueError("ranks, splits and temp-runs must be at least 1")
        return config

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> SimConfig:
        with open(path) as f:
            return cls.from_dict(yaml.safe_load(f) or {})

    def seconds(self, name: str) -> float:
        return getattr(self, name) * self.scale

    def slowest_rank(self, ranks: int | None = None) -> int:
        return random.Random(self.seed).randrange(ranks or self.ranks)


@dataclasses.dataclass
class Case:
    """A workflow ready to run, and what its critical path must be.

    Attributes
    ----------
    name : str
    result : dask.delayed.Delayed
        Compute it to run the workflow.
    critical : list of str
        Keys the observed critical path must pass through, in order.
    critical_seconds : float
        Configured seconds of work along the critical path.
    kinds : set of str
        Mutation kinds the graph must contain.
    """

    name: str
    result: Any
    critical: list[str]
    critical_seconds: float
    kinds: set[str]


class _Builder:
    """Small helpers shared by the cases."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.kernel = KERNELS[config.kernel]
        self.host = socket.gethostname()
        self.scratch = Path(config.scratch or tempfile.mkdtemp(prefix="crux-sim-"))

    def step(self, key: str, seconds: float, *inputs: Any, nbytes: int | None = None) -> Any:
        nbytes = self.config.data_bytes if nbytes is None else nbytes
        return dask.delayed(self.kernel, pure=False)(
            seconds, *inputs, nbytes=nbytes, dask_key_name=key)

    def location(self, name: str) -> str:
        return f"file@{self.host}:{self.scratch / name}"

    def write(self, key: str, name: str, seconds: float, *inputs: Any,
              mutation: str = "APPEND") -> Any:
        """A task that writes file ``name`` (and takes ``seconds``): a file state."""
        with dask.annotate(crux={"mutation": mutation, "label": name,
                                 "location": self.location(name)}):
            return dask.delayed(_write, pure=False)(
                str(self.scratch / name), self.config.file_bytes, seconds, self.kernel,
                self.config.sync_files, *inputs, dask_key_name=key)

    def read(self, key: str, written: Any, seconds: float, *inputs: Any) -> Any:
        """A task that reads the file ``written`` produced: a TRANSFER into memory."""
        with dask.annotate(crux={"mutation": "TRANSFER"}):
            return dask.delayed(_read, pure=False)(
                written, seconds, self.kernel, self.config.data_bytes, *inputs,
                dask_key_name=key)

    def remove(self, key: str, written: Any, name: str, *inputs: Any) -> Any:
        """A task that deletes the file ``written`` produced: a DELETE of it."""
        with dask.annotate(crux={"mutation": "DELETE", "label": name,
                                 "location": self.location(name)}):
            return dask.delayed(_remove, pure=False)(written, *inputs, dask_key_name=key)

    def mpi(self, prefix: str, data: Any, ranks: int, slowest: int) -> tuple[Any, str]:
        """An MPI job: ``ranks`` tasks split from ``data``, gathered into one (MERGE)."""
        config = self.config
        outputs = []
        for r in range(ranks):
            seconds = config.seconds("rank") * (config.slowest_factor if r == slowest else 1)
            outputs.append(self.step(f"{prefix}rank-{r:03d}", seconds, data,
                                     nbytes=config.rank_bytes))
        return dask.delayed(_gather, pure=False)(
            *outputs, dask_key_name=f"{prefix}gather"), f"{prefix}rank-{slowest:03d}"


def _write(path: str, nbytes: int, seconds: float, kernel: Callable, sync: bool,
           *inputs: Any) -> str:
    kernel(seconds)
    return atoms.write_file(path, nbytes, sync=sync)


def _read(path: str, seconds: float, kernel: Callable, nbytes: int, *inputs: Any) -> bytes:
    atoms.read_file(path)
    return kernel(seconds, nbytes=nbytes)


def _remove(path: str, *inputs: Any) -> str:
    os.remove(path)
    return path


def _gather(*parts: Any) -> int:
    """Bytes gathered from the parts (sizes already summed count as they are)."""
    return sum(p if isinstance(p, int) else len(p) for p in parts)


def generic(config: SimConfig) -> Case:
    """Stage-in → preprocess → MPI (one slowest rank) → postprocess → visualisation."""
    b = _Builder(config)
    data = b.write("input-data", "input.dat", 0.0)
    staged = b.read("stage-in", data, config.seconds("stage_in"))
    prepared = b.step("preprocess", config.seconds("preprocess"), staged)
    gathered, slowest = b.mpi("", prepared, config.ranks, config.slowest_rank())
    post = b.step("postprocess", config.seconds("postprocess"), gathered)
    viz = b.write("viz", "viz.png", config.seconds("viz"), post, mutation="CONVERT")
    critical = ["input-data", "stage-in", "preprocess", slowest, "gather", "postprocess", "viz"]
    seconds = sum(config.seconds(s) for s in ("stage_in", "preprocess", "postprocess", "viz"))
    seconds += config.seconds("rank") * config.slowest_factor
    return Case("generic", viz, critical, seconds,
                {"APPEND", "TRANSFER", "CONVERT", "SPLIT", "MERGE"})


#: How much longer the split holding the slowest rank takes to preprocess than the others.
SLOW_SPLIT_FACTOR = 1.5


def splits(config: SimConfig) -> Case:
    """Several data splits, each processed by its own MPI job, then combined.

    The split that holds the slowest rank also preprocesses longest
    (:data:`SLOW_SPLIT_FACTOR`): with equal preprocessing, which split ended
    last was a race of microseconds, and the thread another split freed
    could as rightly lead the path to the slowest rank as its own input.
    """
    b = _Builder(config)
    data = b.write("input-data", "input.dat", 0.0)
    staged = b.read("stage-in", data, config.seconds("stage_in"))
    slow_split = config.seed % config.splits
    gathers, slowest = [], ""
    for s in range(config.splits):
        factor = SLOW_SPLIT_FACTOR if s == slow_split else 1.0
        part = b.step(f"split-{s}", config.seconds("preprocess") * factor, staged)
        rank = config.slowest_rank() if s == slow_split else -1
        gathered, name = b.mpi(f"split-{s}-", part, config.ranks, rank)
        gathers.append(gathered)
        slowest = name if s == slow_split else slowest
    combined = dask.delayed(_gather, pure=False)(*gathers, dask_key_name="combine")
    post = b.step("postprocess", config.seconds("postprocess"), combined)
    critical = ["stage-in", f"split-{slow_split}", slowest, f"split-{slow_split}-gather",
                "combine", "postprocess"]
    seconds = config.seconds("stage_in") + config.seconds("postprocess")
    seconds += config.seconds("preprocess") * SLOW_SPLIT_FACTOR
    seconds += config.seconds("rank") * config.slowest_factor
    return Case("splits", post, critical, seconds,
                {"APPEND", "TRANSFER", "CONVERT", "SPLIT", "MERGE"})


def checkpoint(config: SimConfig) -> Case:
    """Two simulation runs; the second restarts from a checkpoint the first wrote."""
    b = _Builder(config)
    data = b.write("input-data", "input.dat", 0.0)
    staged = b.read("stage-in", data, config.seconds("stage_in"))
    first = b.step("simulation-1", config.seconds("simulation"), staged)
    written = b.write("checkpoint-write", "checkpoint.h5", config.seconds("checkpoint_write"),
                      first, mutation="TRANSFER")
    restored = b.read("checkpoint-read", written, config.seconds("checkpoint_transfer"))
    setup = b.step("restart-setup", config.seconds("restart_setup"), first)
    second = b.step("simulation-2", config.seconds("simulation"), restored, setup)
    post = b.step("postprocess", config.seconds("postprocess"), second)
    critical = ["stage-in", "simulation-1", "checkpoint-write", "checkpoint-read",
                "simulation-2", "postprocess"]
    seconds = sum(config.seconds(s) for s in (
        "stage_in", "simulation", "checkpoint_write", "checkpoint_transfer", "simulation",
        "postprocess"))
    return Case("checkpoint", post, critical, seconds,
                {"APPEND", "TRANSFER", "CONVERT", "MERGE"})


def sources(config: SimConfig) -> Case:
    """A second data source arrives mid-workflow and is merged with the first's results."""
    b = _Builder(config)
    first = b.read("stage-in-a", b.write("source-a", "source-a.dat", 0.0),
                   config.seconds("stage_in"))
    prepared = b.step("preprocess", config.seconds("preprocess"), first)
    stage_one = b.step("stage-1", config.seconds("simulation"), prepared)
    arrival = b.write("source-b", "source-b.dat", config.seconds("second_source_delay"))
    second = b.read("stage-in-b", arrival, config.seconds("stage_in"))
    merged = b.step("merge", config.seconds("preprocess"), stage_one, second)
    post = b.step("postprocess", config.seconds("postprocess"), merged)
    critical = ["source-b", "stage-in-b", "merge", "postprocess"]
    seconds = sum(config.seconds(s) for s in (
        "second_source_delay", "stage_in", "preprocess", "postprocess"))
    return Case("sources", post, critical, seconds,
                {"APPEND", "TRANSFER", "CONVERT", "MERGE"})


def tempfiles(config: SimConfig) -> Case:
    """Chained runs passing temporary files, each removed once read (DroughtHPC)."""
    b = _Builder(config)
    staged = b.read("stage-in", b.write("input-data", "input.dat", 0.0),
                    config.seconds("stage_in"))
    previous_file, previous_name, critical = None, "", ["stage-in"]
    run = staged
    cleanups = []
    for i in range(config.temp_runs):
        inputs = [run] if previous_file is None else [
            b.read(f"read-tmp-{i - 1}", previous_file, 0.0, run)]
        if previous_file is not None:
            critical.append(f"read-tmp-{i - 1}")
            cleanups.append(b.remove(f"remove-tmp-{i - 1}", previous_file, previous_name,
                                     inputs[0]))
        run = b.step(f"run-{i}", config.seconds("simulation"), *inputs)
        critical.append(f"run-{i}")
        previous_name = f"tmp-{i}.dat"
        previous_file = b.write(f"write-tmp-{i}", previous_name, 0.0, run,
                                mutation="TRANSFER")
    cleanups.append(b.remove(f"remove-tmp-{config.temp_runs - 1}", previous_file,
                             previous_name))
    done = dask.delayed(_gather, pure=False)(run, *[dask.delayed(len)(c) for c in cleanups],
                                             dask_key_name="done")
    seconds = config.seconds("stage_in") + config.temp_runs * config.seconds("simulation")
    return Case("tempfiles", done, critical, seconds,
                {"APPEND", "TRANSFER", "CONVERT", "DELETE", "MERGE"})


CASES: dict[str, tuple[Callable[[SimConfig], Case], str]] = {
    "generic": (generic, "stage-in, preprocess, an MPI job with one slow rank, "
                         "postprocess, visualisation"),
    "splits": (splits, "several data splits, each with its own MPI job, combined"),
    "checkpoint": (checkpoint, "two simulation runs restarting from a checkpoint file"),
    "sources": (sources, "a second data source arriving mid-workflow, merged in"),
    "tempfiles": (tempfiles, "chained runs passing temporary files that are then deleted"),
}


def build_case(name: str, config: SimConfig | None = None) -> Case:
    """The case called ``name`` with ``config`` (defaults otherwise).

    Raises
    ------
    ValueError
        If no case has that name.
    """
    if name not in CASES:
        raise ValueError(f"unknown case {name!r}; cases: {', '.join(CASES)}")
    return CASES[name][0](config or SimConfig())
