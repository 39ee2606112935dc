"""The path of one computation or span, on a real cluster, against Dask's own records."""

from __future__ import annotations

import time

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import crux_dask
from crux_dask import PAGBuilder
from crux_dask.groups import key_groups
from crux_dask.scopes import Scope, members, scope_path, scopes_frame


def warm(i: int) -> int:
    return i


def load(i: int) -> int:
    time.sleep(0.04)
    return i


def combine(*parts: int) -> int:
    time.sleep(0.04)
    return sum(parts)


def fit(part: int, i: int) -> int:
    time.sleep(0.04)
    return part + i


def computations_seen_by_dask(dask_scheduler) -> list[tuple[float, float, int]]:
    return [(c.start, c.stop, sum(sum(tg.states.values()) for tg in c.groups))
            for c in dask_scheduler.computations if c.groups]


def heard_finished(dask_scheduler, key: str) -> float:
    """When the scheduler heard that ``key``'s task finished, in its clock."""
    return [at for _, start, finish, *_, at in dask_scheduler.story(key)
            if (start, finish) == ("processing", "memory")][-1]


def check_spans_its_computation(client: Client, path, index: int) -> None:
    """The path runs from the computation's submission, as Dask saw it, to the end
    of its last task, which the scheduler heard of just after.  (Dask's own stop
    is in distributed's estimate of the scheduler's clock, which a heartbeat on a
    loaded machine puts tens of milliseconds off; the scheduler's moment is not.)"""
    start, _, _ = client.run_on_scheduler(computations_seen_by_dask)[index]
    heard = client.run_on_scheduler(heard_finished, key=path.to_frame()["key"].iloc[-1])
    assert heard - 0.1 <= start + path.length <= heard + 0.005


@pytest.fixture(scope="module")
def stages():
    """Two stages in two spans, each one computation; the second reads what the first persisted."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        # Warm up, in a computation of its own.  (A task group of the same name
        # still alive would take the next computation's tasks in: Dask counts
        # tasks by group.)
        client.submit(warm, -1, pure=False).result()
        client.run(warm, 0)  # every worker imports this module before the stages
        with distributed.span("etl"):
            parts = [dask.delayed(load)(i, dask_key_name=f"load-{i}") for i in range(12)]
            total = dask.delayed(combine)(*parts, dask_key_name="load-total")
            persisted = client.persist(total)
            distributed.wait(persisted)
        with distributed.span("train"):
            fits = [dask.delayed(fit)(persisted, i, dask_key_name=f"fit-{i}")
                    for i in range(10)]
            assert sum(dask.compute(*fits)) == sum(66 + i for i in range(10))
        yield client


def test_get_computations_lists_each_computation_and_span_with_its_tasks(stages):
    table = crux_dask.get_computations(stages)
    assert list(table.columns) == ["kind", "id", "name", "parent", "start", "stop",
                                   "makespan", "tasks", "path_length", "top_categories"]
    computations = table[table["kind"] == "computation"].reset_index(drop=True)
    seen = stages.run_on_scheduler(computations_seen_by_dask)
    assert len(computations) == len(seen) == 3  # the warm-up, etl, train
    assert computations["tasks"].tolist() == [tasks for _, _, tasks in seen] == [1, 13, 10]
    assert computations["start"].tolist() == [start for start, _, _ in seen]
    spans = table[table["kind"] == "span"].set_index("name")
    assert spans.loc["etl", "tasks"] == 13 and spans.loc["train", "tasks"] == 10
    assert spans.loc["etl", "top_categories"].startswith("compute")


@pytest.mark.parametrize("how", [{"span": "etl"}, {"computation": 1}])
def test_the_path_of_the_first_stage_holds_only_its_tasks(stages, how):
    path = crux_dask.get_wcp(stages, **how)
    steps = path.to_frame()
    assert steps["in_scope"].all()
    assert {key.split("-")[0] for key in steps["key"]} == {"load"}
    check_spans_its_computation(stages, path, 1)
    # 12 loads on two threads then the total: at least 6 loads and the total in a row.
    assert (steps["category"] == "compute").sum() >= 7
    assert path.breakdown["compute"] >= 0.9 * 7 * 0.04


def test_the_path_of_the_second_stage_marks_what_it_read_from_the_first(stages):
    path = crux_dask.get_wcp(stages, span="train")
    steps = path.to_frame()
    check_spans_its_computation(stages, path, 2)
    assert (steps["key"].iloc[-1]).startswith("fit-")
    prefix = steps["key"].str.split("-").str[0]
    # Its own tasks are in scope; the persisted total, wherever the walk passes
    # through it (moved to the other worker, or the state the first step read), is not.
    assert (steps["in_scope"] == (prefix == "fit")).all()
    assert set(prefix) <= {"fit", "load"}


def test_a_computation_or_span_that_is_not_known_is_a_clear_error(stages):
    with pytest.raises(ValueError, match=r"no span 'nope'.*etl"):
        crux_dask.get_wcp(stages, span="nope")
    with pytest.raises(ValueError, match="no computation 7"):
        crux_dask.get_wcp(stages, computation=7)
    with pytest.raises(ValueError, match="not both"):
        crux_dask.get_wcp(stages, computation=0, span="etl")


def test_states_are_matched_by_group_and_by_time():
    # The same code run twice: the same group names, told apart by time.
    b = PAGBuilder()
    b.root(0.0, "attach")
    for run, offset in enumerate((0.0, 10.0)):
        root = b.root(offset + 0.5)  # each graph reaches the scheduler
        b.compute(f"('x-abc', {run})", "tcp://w:1", 1, offset + 1, offset + 2, 8, (), root)
        b.compute("y-def", "tcp://w:1", 1, offset + 2, offset + 3, 8, (f"('x-abc', {run})",))
    store = b.store
    groups = key_groups(store)
    first = Scope("computation", "1", "first", 0.5, 3.0, frozenset({"x-abc", "y-def"}))
    second = Scope("computation", "2", "second", 10.5, 13.0, frozenset({"x-abc", "y-def"}))
    assert store.column("state_time", members(store, first, groups)).tolist() == [2.0, 3.0]
    assert store.column("state_time", members(store, second, groups)).tolist() == [12.0, 13.0]
    path = scope_path(store, second, groups)
    assert path.length == pytest.approx(2.5) and path.steps["in_scope"].all()
    table = scopes_frame(store, [first, second, Scope("span", "3", "none", 20.0, 21.0,
                                                       frozenset({"z"}))], groups)
    assert table["tasks"].tolist() == [2, 2, 0]
    assert table["path_length"].isna().tolist() == [False, False, True]


def test_the_json_api_serves_computations_and_their_paths(stages):
    import json
    import urllib.error
    import urllib.request

    base = stages.dashboard_link.rsplit("/", 1)[0] + "/crux/api/v1"
    with urllib.request.urlopen(base + "/computations") as response:
        table = json.load(response)["computations"]
    assert [row["kind"] for row in table].count("computation") == 3
    with urllib.request.urlopen(base + "/wcp?span=etl") as response:
        path = json.load(response)
    expected = crux_dask.get_wcp(stages, span="etl")
    assert path["length"] == pytest.approx(expected.length)
    assert [step["key"] for step in path["steps"]] == expected.to_frame()["key"].tolist()
    assert all(step["in_scope"] for step in path["steps"])
    for query, parameter in (("span=nope", "span"), ("computation=x", "computation"),
                             ("computation=9", "computation")):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/wcp?{query}")
        assert refused.value.code == 400
        assert json.load(refused.value)["parameter"] == parameter


def test_computations_and_spans_are_exported_and_reported_offline(stages, tmp_path):
    from click.testing import CliRunner

    from crux_dask.cli import main
    from crux_dask.provenance import read_dataset, read_scopes

    crux_dask.export_parquet(stages, tmp_path / "run")
    pag = read_dataset(tmp_path / "run")
    scopes = read_scopes(tmp_path / "run", pag.run_ids[-1])
    live = crux_dask.get_computations(stages)
    assert [(s.kind, s.name) for s in scopes] == list(zip(live["kind"], live["name"]))
    offline = scopes_frame(pag.store(), scopes, key_groups(pag.store()))
    assert offline["tasks"].tolist() == live["tasks"].tolist()
    assert offline["path_length"].to_numpy() == pytest.approx(live["path_length"].to_numpy())

    done = CliRunner().invoke(main, ["report", str(tmp_path / "run"), "--span", "etl"])
    assert done.exit_code == 0, done.output
    assert "The span 'etl'" in done.output and "fit-" not in done.output
    done = CliRunner().invoke(main, ["report", str(tmp_path / "run")])
    assert "Computations and spans" in done.output and "train" in done.output
    done = CliRunner().invoke(main, ["report", str(tmp_path / "run"), "--span", "nope"])
    assert done.exit_code == 2 and "no span 'nope'" in done.output


def test_a_path_clipped_at_a_time_drops_the_earliest_parts_of_its_first_step():
    b = PAGBuilder()
    root = b.root(10.5)
    b.compute("x", "tcp://w:1", 1, 11.0, 12.0, 8, (), root)
    b.compute("y", "tcp://w:1", 1, 12.0, 13.0, 8, ("x",))
    path = b.pag().wcp()
    assert path.length == 2.5 and path.steps.loc[0, "wait"] == pytest.approx(0.5)
    assert path.clipped(10.0) is path
    for start, wait, busy in ((11.0, 0.0, 1.0), (11.5, 0.0, 0.5)):
        clipped = path.clipped(start)
        assert clipped.length == pytest.approx(13.0 - start)
        assert clipped.steps.loc[0, ["wait", "busy"]].tolist() == pytest.approx([wait, busy])
        assert sum(clipped.breakdown.values()) == pytest.approx(clipped.length)
        assert path.steps.loc[0, "wait"] == pytest.approx(0.5)  # the original is unchanged


def test_the_groups_of_a_copys_keys_are_found_once_on_the_store_it_copies():
    """A page's copy of a growing graph finds no key's group again: it reads them from
    the store it is a copy of, which grew since."""
    from crux_dask.graph.builder import PAGBuilder
    from crux_dask.groups import KeyGroups

    asked: list[str] = []
    groups = KeyGroups(lambda key: asked.append(key) or key.split("-")[0])
    builder = PAGBuilder()
    builder.root(0.0)
    for i in range(3):
        builder.compute(f"a-{i}", "tcp://w:1", 1, i, i + 0.5, 8, ())
    copy = builder.store.copy()
    builder.compute("b-0", "tcp://w:1", 1, 5.0, 5.5, 8, ())
    assert groups(builder.store).tolist()[-4:] == ["a", "a", "a", "b"]
    found = len(asked)
    assert groups(copy).tolist() == groups(builder.store).tolist()[:len(copy.keys.values)]
    assert groups(copy.copy()).tolist() == groups(copy).tolist()
    assert len(asked) == found  # nothing found again for the copies
