"""The simulator: atoms do what they are told; every case has its known critical path."""

from __future__ import annotations

import gc
import os
import threading
import time

import psutil
import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import poll_for

from crux_dask.sim_workflows import CASES, SimConfig, atoms, build_case, replay, run_case


@pytest.fixture
def client():
    # The cluster runs in this process: a full garbage collection of the whole test
    # session's heap holds the GIL for up to a second, which the tasks waiting on
    # their sleeps then wait for too, and the path measures it.  It is not the
    # case's work: no collection while a case runs.
    gc.disable()
    try:
        with LocalCluster(n_workers=2, threads_per_worker=24, processes=False,
                          dashboard_address=":0") as cluster, Client(cluster) as c:
            yield c
    finally:
        gc.enable()


def is_subsequence(wanted: list[str], keys: list[str]) -> bool:
    it = iter(keys)
    return all(k in it for k in wanted)


def busy_work(path, keys) -> float:
    """Seconds of computation and I/O of ``keys`` along a critical path.

    The path may also pass through tasks that held a thread one of them
    waited for: their work is the contention's, not the case's.
    """
    steps = path.steps
    mine = steps["key"].isin(keys) & steps["category"].isin(["compute", "io"])
    return float(steps["busy"][mine].sum())


@pytest.mark.parametrize("name", list(CASES))
def test_case_has_its_known_critical_path(name, client, tmp_path):
    # Small files, not synced: their real I/O time is not part of the configured work.
    config = SimConfig(scratch=str(tmp_path), scale=0.5, file_bytes=10_000, sync_files=False)
    result = run_case(name, config, client=client)
    keys = result.path.states["key"].tolist()
    assert is_subsequence(result.case.critical, keys), (result.case.critical, keys)
    kinds = set(result.pag.mutations["kind"])
    assert result.case.kinds <= kinds
    # The work configured on the path is what the path measured, within 10%.
    assert busy_work(result.path, result.case.critical) == pytest.approx(
        result.case.critical_seconds, rel=0.10)
    assert result.path.length >= 0.95 * result.case.critical_seconds


def test_mpi_jobs_split_and_merge(client, tmp_path):
    result = run_case("generic", SimConfig(scratch=str(tmp_path), scale=0.2), client=client)
    m = result.pag.mutations
    ranks = m[m["key"].str.match(r"rank-\d+$")]
    made = ranks[ranks["kind"] != "DELETE"]
    assert set(made["kind"]) == {"SPLIT"} and len(made) == SimConfig().ranks
    released = ranks[ranks["kind"] == "DELETE"]  # once gathered
    assert sorted(released["src"]) == sorted(made["dst"])
    gather = m[(m["key"] == "gather") & (m["kind"] != "DELETE")]
    assert set(gather["kind"]) == {"MERGE"} and len(gather) == SimConfig().ranks
    files = result.pag.states[result.pag.states["location"].str.startswith("file@")]
    assert {"input.dat", "viz.png"} <= set(files["label"])


def test_temporary_files_are_deleted(client, tmp_path):
    result = run_case("tempfiles", SimConfig(scratch=str(tmp_path), scale=0.2), client=client)
    st = result.pag.states.set_index("state_id")
    m = result.pag.mutations
    deletes = m[m["kind"] == "DELETE"]
    removed = set(deletes["dst"].map(st["location"]))
    assert {f"file@{os.uname().nodename}:{tmp_path / f'tmp-{i}.dat'}"
            for i in range(3)} <= removed
    assert not list(tmp_path.glob("tmp-*.dat"))  # and really gone


@pytest.mark.parametrize("seed", [0, 1, 2, 5])
def test_moving_the_slowest_rank_moves_the_critical_path(seed, client, tmp_path):
    # Long enough that a scheduling hiccup of this small machine cannot reorder ranks.
    config = SimConfig(scratch=str(tmp_path), scale=0.6, seed=seed)
    slowest = f"rank-{config.slowest_rank():03d}"
    result = run_case("generic", config, client=client)
    keys = result.path.states["key"].tolist()
    assert slowest in keys
    assert not [k for k in keys if k.startswith("rank-") and k != slowest]


def test_the_slowest_rank_is_on_the_path_with_worker_processes(tmp_path):
    # Each worker process converts its clock with its own estimate of the
    # scheduler's: the path must not depend on which estimate is better.
    config = SimConfig(scratch=str(tmp_path), scale=0.6, seed=5)
    slowest = f"rank-{config.slowest_rank():03d}"
    with LocalCluster(n_workers=2, threads_per_worker=24, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        result = run_case("generic", config, client=c)
    keys = result.path.states["key"].tolist()
    assert [k for k in keys if k.startswith("rank-")] == [slowest]
    assert keys[-1] == result.case.critical[-1]


def test_checkpoint_transfer_becomes_critical_only_when_slow(client, tmp_path):
    fast = SimConfig(scratch=str(tmp_path), scale=0.5, checkpoint_transfer=0.05,
                     restart_setup=0.6)
    keys = run_case("checkpoint", fast, client=client).path.states["key"].tolist()
    assert "restart-setup" in keys and "checkpoint-read" not in keys


def test_replay_reproduces_a_recorded_run(tmp_path):
    # Long enough (about 3.5 s) that a hiccup of this small machine is well inside the
    # tolerance: a second's stall of a run of one second failed it.
    config = SimConfig(scratch=str(tmp_path / "scratch"), scale=3.0)
    recorded = run_case("generic", config, workers=2, out=tmp_path / "runs")
    fidelity = replay(recorded.dataset)
    assert fidelity.makespan_ratio == pytest.approx(1.0, abs=0.15)
    assert fidelity.wcp_steps_matched >= 0.8
    assert "makespan ratio" in fidelity.summary()


def test_configuration_from_yaml_and_bad_settings(tmp_path):
    file = tmp_path / "sim.yaml"
    file.write_text("ranks: 4\nslowest-factor: 2\nkernel: compute_nogil\n")
    config = SimConfig.from_yaml(file)
    assert (config.ranks, config.slowest_factor, config.kernel) == (4, 2.0, "compute_nogil")
    with pytest.raises(ValueError, match="unknown simulation setting 'rank-count'"):
        SimConfig.from_dict({"rank-count": 3})
    with pytest.raises(ValueError, match="must be a int"):
        SimConfig.from_dict({"ranks": "many"})
    with pytest.raises(ValueError, match="unknown kernel"):
        SimConfig.from_dict({"kernel": "gpu"})
    with pytest.raises(ValueError, match="unknown case"):
        build_case("nope")


@pytest.mark.parametrize("atom", [atoms.compute, atoms.compute_nogil, atoms.wait])
def test_time_atoms_take_the_time_they_were_given(atom):
    started = time.perf_counter()
    out = atom(0.2, nbytes=1000)
    assert time.perf_counter() - started == pytest.approx(0.2, rel=0.10)
    assert len(out) == 1000


def test_compute_nogil_lets_other_threads_run():
    counter = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counter[0] += 1

    thread = threading.Thread(target=count)
    thread.start()
    atoms.compute_nogil(0.2)
    alone = counter[0]
    atoms.compute(0.2)
    stop.set()
    thread.join()
    assert alone > 0 and counter[0] > alone


def test_io_atoms_write_and_read_exact_bytes(tmp_path):
    path = tmp_path / "sub" / "data.bin"
    atoms.write_file(path, 3_000_123, block_size=65_536)
    assert path.stat().st_size == 3_000_123
    assert atoms.read_file(path, block_size=4096) == 3_000_123


def test_memory_atom_holds_the_memory():
    process = psutil.Process()
    before = process.memory_info().rss
    peak = [0]
    thread = threading.Thread(target=lambda: peak.__setitem__(0, atoms.hold_memory(
        200_000_000, 0.5)))
    thread.start()
    samples = []

    def holding() -> bool:  # the atom holds its memory, or is done (and the check fails)
        samples.append(process.memory_info().rss)
        return samples[-1] - before >= 0.9 * 200_000_000 or not thread.is_alive()

    poll_for(holding, timeout=10, period=0.01)
    during = samples[-1]
    thread.join()
    assert peak[0] == 200_000_000
    assert during - before >= 0.9 * 200_000_000
