"""Run a case, or a replay of a recorded run, on a LocalCluster with Crux attached."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster, progress

import crux_dask
from crux_dask.compare import run_summary
from crux_dask.pag import PAG
from crux_dask.provenance import read_dataset, tasks_frame
from crux_dask.sim_workflows import atoms
from crux_dask.sim_workflows.cases import Case, SimConfig, build_case
from crux_dask.wcp import CriticalPath

__all__ = ["Fidelity", "SimResult", "replay", "replay_graph", "run_case"]


@dataclasses.dataclass
class SimResult:
    """What a simulated run produced."""

    case: Case
    path: CriticalPath
    pag: PAG
    makespan: float
    dataset: Path | None


def _cluster(workers: int, threads: int) -> LocalCluster:
    return LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True,
                        dashboard_address=":0")


def run_case(name: str, config: SimConfig | None = None, workers: int = 2,
             threads: int | None = None, out: str | os.PathLike | None = None,
             show_progress: bool = False, client: Client | None = None) -> SimResult:
    """Run case ``name`` and return its critical path and graph.

    Parameters
    ----------
    name : str
        A key of :data:`~crux_dask.sim_workflows.cases.CASES`.
    config : SimConfig, optional
    workers, threads : int
        Worker processes and threads per worker of the LocalCluster (threads
        default to one per rank, so an MPI job never queues for a thread).
    out : path-like, optional
        Export the provenance to this dataset directory.
    show_progress : bool
        Show Dask's progress bar.
    client : Client, optional
        Use this cluster instead of starting one (Crux is attached to it).
    """
    config = config or SimConfig()
    case = build_case(name, config)
    # Enough threads for a whole MPI job on one worker (Dask keeps ranks next to
    # their input): a rank queued behind another would stretch the critical path.
    threads = threads or max(2, config.ranks)
    if client is not None:
        return _run(case, client, out, show_progress)
    with _cluster(workers, threads) as cluster, Client(cluster) as own:
        return _run(case, own, out, show_progress)


def _warm_up() -> None:
    """Import on a worker what the tasks need: import time is nobody's work."""
    atoms.compute(0.0)


def _run(case: Case, client: Client, out: Any, show_progress: bool) -> SimResult:
    crux_dask.attach(client)
    client.run(_warm_up)
    started = time.time()
    future = client.compute(case.result)
    if show_progress:
        progress(future)
    future.result()
    makespan = time.time() - started
    pag = crux_dask.get_pag(client)
    path = pag.wcp()
    dataset = Path(crux_dask.export_parquet(client, out)) if out else None
    return SimResult(case, path, pag, makespan, dataset)


@dataclasses.dataclass
class Fidelity:
    """How closely a replay reproduced the recorded run."""

    makespan_ratio: float
    wcp_length_ratio: float
    wcp_steps_matched: float
    original: CriticalPath
    replayed: CriticalPath

    def summary(self) -> str:
        return (f"makespan ratio (replay / original): {self.makespan_ratio:.3f}\n"
                f"WCP length ratio:                   {self.wcp_length_ratio:.3f}\n"
                f"WCP steps matched:                  {self.wcp_steps_matched:.1%}")


def replay_graph(pag: PAG, run_id: str | None = None) -> tuple[dict, list[str]]:
    """A Dask graph with the recorded run's dependencies, compute times and output sizes.

    Returns the graph and the keys to compute (the tasks nothing depends on).
    """
    tasks = tasks_frame(pag, run_id).drop_duplicates("key", keep="last")
    graph: dict[str, tuple] = {}
    needed: set[str] = set()
    known = set(tasks["key"])
    for row in tasks.itertuples():
        deps = [d for d in row.dependencies if d in known]
        needed.update(deps)
        seconds = max(0.0, row.compute_stop - row.compute_start)
        graph[row.key] = (_replayed, seconds, int(row.nbytes), *deps)
    outputs = [k for k in graph if k not in needed]
    return graph, outputs


def _replayed(seconds: float, nbytes: int, *inputs: Any) -> bytes:
    return atoms.wait(seconds, nbytes=nbytes)


def replay(path: str | os.PathLike, run_id: str | None = None, workers: int | None = None,
           threads: int | None = None) -> Fidelity:
    """Run a recorded run again from its provenance and measure the fidelity.

    The cluster has the recorded shape unless ``workers``/``threads`` say
    otherwise.
    """
    import json

    original = read_dataset(path, run_id)
    run_id = run_id or original.run_ids[-1]
    metadata = json.loads((Path(path) / "metadata.json").read_text())["runs"][run_id]
    workers = workers or int(metadata.get("workers") or 2)
    threads = threads or max(1, int(metadata.get("threads") or workers) // workers)
    graph, outputs = replay_graph(original, run_id)
    with _cluster(workers, threads) as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        client.run(_warm_up)
        client.get(graph, outputs, sync=True)
        replayed = crux_dask.get_pag(client)
    recorded = run_summary(original, run_id)["makespan"]
    makespan = run_summary(replayed, replayed.run_ids[-1])["makespan"]
    original_path = original.wcp(run_id=run_id)
    replayed_path = replayed.wcp()
    steps = _compute_keys(original_path)
    matched = len(steps & _compute_keys(replayed_path)) / len(steps) if steps else 1.0
    return Fidelity(
        makespan_ratio=makespan / recorded if recorded else math.nan,
        wcp_length_ratio=(replayed_path.length / original_path.length
                          if original_path.length else math.nan),
        wcp_steps_matched=matched, original=original_path, replayed=replayed_path)


def _compute_keys(path: CriticalPath) -> set[str]:
    """Keys of the tasks (states computed on a thread) along a critical path."""
    steps = path.to_frame()
    return set(steps.loc[steps["category"] == "compute", "key"])
