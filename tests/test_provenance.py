"""The Parquet provenance dataset: round trips, other readers, the offline commands."""

from __future__ import annotations

import asyncio
import json
import time

import dask
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from distributed.utils_test import async_poll_for, gen_cluster

import crux_dask
from crux_dask.cli import main
from crux_dask.load import stage_loads
from crux_dask.path import PARTS
from crux_dask.provenance import TABLES, ProvenanceError, read_dataset, write_dataset


def sleepy(x, seconds):
    time.sleep(seconds)
    return x + 1


def combine(*xs):
    return sum(xs)


def workflow(slow_step: str | None = None):
    """Four loads, a transform each, and a combine.

    ``slow_step`` takes 0.6 s, the others 0.01 s: a margin no stall of a loaded
    machine closes.
    """
    loads = [dask.delayed(sleepy)(i, 0.6 if f"load-{i}" == slow_step else 0.01,
                                  dask_key_name=f"load-{i}") for i in range(4)]
    steps = [dask.delayed(sleepy)(x, 0.02, dask_key_name=f"step-{i}")
             for i, x in enumerate(loads)]
    return dask.delayed(combine)(*steps, dask_key_name="combine")


@gen_cluster(client=True)
async def test_round_trip_of_a_real_run(c, s, a, b, tmp_path):
    await crux_dask.attach(c)
    assert await c.compute(workflow()) == sum(i + 2 for i in range(4))
    while s.tasks or a.data or b.data:  # let every release happen, and be recorded
        await asyncio.sleep(0.01)
    live = await crux_dask.get_pag(c)
    live_path = await crux_dask.get_wcp(c)
    sampled = s.plugins["crux"].load.log  # a sample of each process before the export
    await async_poll_for(lambda: len(set(sampled.frame()["process"])) == 3, timeout=10)
    dataset = await crux_dask.export_parquet(c, tmp_path / "runs")

    offline = crux_dask.read_parquet(dataset)
    pd.testing.assert_frame_equal(offline.states, live.states)
    pd.testing.assert_frame_equal(offline.mutations, live.mutations)
    pd.testing.assert_frame_equal(offline.wcp().states, live_path.states)
    assert offline.wcp().length == pytest.approx(live_path.length)
    # Stage by stage, and with the load each ran under.
    steps, live_steps = offline.wcp().to_frame(), live_path.to_frame()
    pd.testing.assert_frame_equal(steps[list(PARTS)], live_steps[list(PARTS)])
    load = crux_dask.read_load(dataset)
    assert set(load["process"]) == {"scheduler", a.address, b.address}
    pd.testing.assert_frame_equal(stage_loads(steps, load), stage_loads(live_steps, load))

    metadata = json.loads((dataset / "metadata.json").read_text())
    (run,) = metadata["runs"].values()
    assert run["workers"] == 2 and run["dask"] == dask.__version__
    assert run["states"] == len(live.states)
    tasks = pd.read_parquet(dataset / "tasks.parquet")
    assert set(tasks["key"]) == {f"load-{i}" for i in range(4)} | {
        f"step-{i}" for i in range(4)} | {"combine"}
    combined = tasks[tasks["key"] == "combine"].iloc[0]
    assert sorted(combined["dependencies"]) == [f"step-{i}" for i in range(4)]
    transitions = pd.read_parquet(dataset / "transitions.parquet")
    finished = transitions[(transitions["key"] == "combine")
                           & (transitions["finish"] == "memory")]
    assert len(finished) == 1
    wcp = pd.read_parquet(dataset / "wcp.parquet")
    assert len(wcp) == len(live_path)


def make_dataset(tmp_path, *slow_steps):
    """Datasets of real runs, one per slow step (None: no slow step)."""
    from distributed import Client, LocalCluster

    path = tmp_path / "runs"
    for slow in slow_steps:
        with LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            crux_dask.attach(client)
            client.compute(workflow(slow)).result()
            crux_dask.export_parquet(client, path)
    return path


def test_other_readers_reproduce_the_critical_path(tmp_path):
    import duckdb
    import polars as pl

    path = make_dataset(tmp_path, None)
    pag = read_dataset(path)
    expected = pag.wcp()

    states = pl.read_parquet(path / "states.parquet" / "**" / "*.parquet", hive_partitioning=True)
    assert states.height == len(pag.states)

    con = duckdb.connect()
    glob = str(path / "{}.parquet" / "*" / "*.parquet")
    kinds = dict(con.execute(
        f"select kind, count(*) from read_parquet('{glob.format('mutations')}', "
        "hive_partitioning = true) group by kind").fetchall())
    assert kinds == pag.mutations["kind"].value_counts().to_dict()
    length = con.execute(
        f"select sum(m.cost) from read_parquet('{glob.format('wcp')}') w "
        f"join read_parquet('{glob.format('mutations')}') m using (mutation_id)").fetchone()[0]
    assert length == pytest.approx(expected.length)


def test_a_second_run_is_appended_without_rewriting_the_first(tmp_path):
    path = make_dataset(tmp_path, None)
    first = {f: f.stat().st_mtime_ns for f in path.rglob("*.parquet") if f.is_file()}
    (first_run,) = read_dataset(path).run_ids
    path = make_dataset(tmp_path, "load-2")
    pag = read_dataset(path)
    assert len(pag.run_ids) == 2 and pag.run_ids[0] == first_run
    assert all(f.stat().st_mtime_ns == mtime for f, mtime in first.items())
    assert set(pd.read_parquet(path / "states.parquet")["run_id"]) == set(pag.run_ids)


def test_compare_names_the_slowed_step_first(tmp_path):
    path = make_dataset(tmp_path, None, "load-2")
    result = CliRunner().invoke(main, ["compare", str(path)])
    assert result.exit_code == 0, result.output
    steps = result.output.split("varies most")[1].splitlines()[2]
    assert steps.split()[0] == "load-2"


def test_report_and_trace(tmp_path):
    path = make_dataset(tmp_path, None)
    result = CliRunner().invoke(main, ["report", str(path), "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "Workflow critical path" in result.output
    assert "critical path" in (tmp_path / "r.html").read_text()
    # The by-prefix table: each prefix on the path with its seconds, most first.
    expected = read_dataset(path).wcp().by_prefix()
    table = result.output.split("by prefix:\n")[1].splitlines()
    assert table[0].split() == ["prefix", "seconds", "share", "steps", "dominant", "stragglers",
                                "code"]  # the code behind each, from the functions table
    assert [line.split()[0] for line in table[1:1 + len(expected)]] == expected[
        "prefix"].tolist()

    result = CliRunner().invoke(main, ["trace", str(path), "-o", str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.output
    trace = json.loads((tmp_path / "t.json").read_text())
    computes = [e for e in trace["traceEvents"] if e.get("cat") == "compute"]
    assert sorted(e["args"]["key"] for e in computes) == sorted(
        [f"load-{i}" for i in range(4)] + [f"step-{i}" for i in range(4)] + ["combine"])
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in computes)
    wcp = [e for e in trace["traceEvents"] if e.get("cat") == "wcp"]
    assert len(wcp) == len(read_dataset(path).wcp())


def small_dataset(tmp_path):
    from crux_dask import PAGBuilder

    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", "w", 1, 0.0, 1.0, 8, ())
    return write_dataset(tmp_path / "runs", b.pag())


def damage_truncate(path):
    file = next((path / "states.parquet").rglob("*.parquet"))
    file.write_bytes(file.read_bytes()[:100])
    return file.name


def damage_corrupt(path):
    file = next((path / "mutations.parquet").rglob("*.parquet"))
    file.write_bytes(b"PAR1" + b"\x00" * 200 + b"PAR1")
    return file.name


def damage_foreign(path):
    file = next((path / "states.parquet").rglob("*.parquet"))
    pq.write_table(pa.table({"a": [1, 2, 3]}), file)
    return "lacks"


def damage_version(path):
    meta = json.loads((path / "metadata.json").read_text())
    meta["schema_version"] = 99
    (path / "metadata.json").write_text(json.dumps(meta))
    return "schema version 99"


def damage_metadata(path):
    (path / "metadata.json").write_text("{not json")
    return "metadata.json"


def damage_missing(path):
    import shutil

    shutil.rmtree(path)
    return "no such dataset directory"


@pytest.mark.parametrize("damage", [damage_truncate, damage_corrupt, damage_foreign,
                                    damage_version, damage_metadata, damage_missing])
def test_bad_datasets_get_one_clear_message_and_status_2(tmp_path, damage):
    path = small_dataset(tmp_path)
    expected = damage(path)
    with pytest.raises(ProvenanceError, match=expected):
        read_dataset(path)
    for command in (["report", str(path)], ["trace", str(path), "-o", str(tmp_path / "t")],
                    ["compare", str(path)]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2, result.output
        assert expected in result.output and "Traceback" not in result.output


def test_a_failed_export_leaves_the_dataset_as_it_was(tmp_path):
    path = small_dataset(tmp_path)
    before = sorted(p.relative_to(path) for p in path.rglob("*"))
    from crux_dask import PAGBuilder

    b = PAGBuilder()
    b.root(0.0)
    b.compute("y", "w", 1, 0.0, 1.0, 8, ())
    bad_transitions = pd.DataFrame({"key": [object()], "start": ["a"], "finish": ["b"],
                                    "time": ["not a time"], "location": [None],
                                    "stimulus_id": ["s"]})
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, TypeError)):
        write_dataset(path, b.pag(), transitions=bad_transitions)
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before
    assert len(read_dataset(path).run_ids) == 1
    assert TABLES[0] == "states"


def test_a_run_without_scheduler_transitions_exports(tmp_path):
    # Only events from outside Dask (the HTTP API, a replay): no transition was recorded.
    from crux_dask import PAGBuilder
    from crux_dask.plugins.transitions import TransitionLog

    b = PAGBuilder()
    b.root(0.0)
    b.compute("y", "w", 1, 0.0, 1.0, 8, ())
    write_dataset(tmp_path / "runs", b.pag(), transitions=TransitionLog(10).frame())
    assert read_dataset(tmp_path / "runs").states["key"].tolist() == ["root", "y"]


def test_a_run_exported_before_priorities_reads_and_replays_in_start_order(tmp_path):
    """Schema version 3 had no priority among the moments: it reads as not recorded."""
    path = make_dataset(tmp_path, None)
    now = read_dataset(path)
    assert now.moments["priority"].notna().sum() == 9  # four loads, four steps, combine
    for part in (path / "moments.parquet").rglob("*.parquet"):
        pq.write_table(pq.read_table(part).drop_columns(["priority"]), part)
    meta = json.loads((path / "metadata.json").read_text())
    meta["schema_version"] = 3
    (path / "metadata.json").write_text(json.dumps(meta))
    before = read_dataset(path)
    assert before.moments["priority"].isna().all()
    assert before.moments["runnable"].equals(now.moments["runnable"])
    assert before.what_if().replay_error == pytest.approx(now.what_if().replay_error, abs=0.2)
