"""Task groups, their statistics, and the stragglers of a path.

Known answers: a graph built here with chosen seconds and bytes; a delayed
group where one task sleeps five times longer than its siblings with the same
bytes (slow, not skew); a frame where one key holds half the rows (skew);
equal partitions, where no task may be flagged.  How well the what-if at the
group's median predicts a re-run without the hot key is measured by
``benchmarks/stragglers.py``, over interleaved runs.  Dask's task
stream is the independent witness of each task's seconds.
"""

from __future__ import annotations

import time

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from distributed.utils import key_split_group
from test_causes import add_task_stream, task_stream

import crux_dask
from crux_dask.dashboard.data import static_source
from crux_dask.dashboard.prefixes import PrefixTable
from crux_dask.graph.builder import PAGBuilder
from crux_dask.groups import (
    FLAG_COLUMNS,
    FLOOR,
    GROUP_COLUMNS,
    LEAST_TASKS,
    SLOWER,
    group_name,
    group_stats,
    tasks,
)


def test_a_group_is_named_as_the_scheduler_names_it():
    keys = ["('x-2', 1)", "(\"y-ab12\", 0, 3)", "ae05086432ca935f6eba409a8ecd4896",
            "<module.submodule.myclass object at 0xdaf372", "x", "x-1", "inc-0-3",
            "finalize-5f1a6e2fd6c53ef3f0e7d0cf0d1b4b6d"]
    x = da.ones((20, 20), chunks=5)
    frame = dd.from_pandas(pd.DataFrame({"a": range(10)}), npartitions=2)
    for graph in ((x @ x.T).sum().__dask_graph__(),
                  frame.a.sum().__dask_graph__(),
                  dask.delayed(sum)([dask.delayed(abs)(i) for i in range(3)]).__dask_graph__()):
        keys += [str(key) for key in graph]
    assert len(keys) > 40
    assert [group_name(key) for key in keys] == [key_split_group(key) for key in keys]


def _graph(seconds: list[float], sizes: list[int], label: str = "work") -> PAGBuilder:
    """A run of one group: one task per entry, one after another on one thread."""
    builder = PAGBuilder(run_id="made")
    builder.apply(("root", 0.0, "graph"))
    start = 1.0
    for i, (s, n) in enumerate(zip(seconds, sizes)):
        builder.apply(("compute", f"('{label}-ab', {i})", "tcp://w:1", 0, start, start + s, n,
                       (), 0))
        start += s
    return builder


def test_the_statistics_and_flags_of_a_group_built_with_known_seconds_and_bytes():
    seconds = [1.0, 1.0, 1.2, 0.8, 3.0, 2.5, 1.0]
    sizes = [100, 100, 100, 100, 100, 900, 100]
    store = _graph(seconds, sizes).pag().store()
    (row,) = group_stats(store).itertuples(index=False)
    assert (row.group, row.prefix, row.tasks) == ("work-ab", "work", len(seconds))
    assert row.seconds_median == pytest.approx(np.median(seconds))
    assert row.seconds_p90 == pytest.approx(np.quantile(seconds, 0.9))
    assert (row.seconds_min, row.seconds_max) == pytest.approx((0.8, 3.0))
    assert (row.output_median, row.output_max, row.input_max) == (100, 900, 0)
    found = tasks(store)
    # 3.0 s is 3x the median of 1.0 s with the bytes of the others; 2.5 s holds 9x them.
    assert found.stragglers().tolist() == ["", "", "", "", "slow", "skew", ""]
    assert found.slowdown()[4] == pytest.approx(3.0) and found.bytes_ratio()[5] == 9.0
    assert row.stragglers == 2
    # A floor of 1.8 s over the median leaves the task 2 s over it, one of 2.1 s neither.
    assert found.stragglers(floor=1.8).tolist() == ["", "", "", "", "slow", "", ""]
    assert (found.stragglers(floor=2.1) == "").all()


def test_a_group_too_small_or_too_even_has_no_straggler():
    few = _graph([1.0, 5.0], [1, 1]).pag().store()  # fewer than LEAST_TASKS tasks
    assert LEAST_TASKS > 2 and np.isnan(tasks(few).slowdown()).all()
    # Twice the median, but less than the floor over it: the jitter of short tasks.
    short = _graph([0.001] * 5 + [SLOWER * 0.001 + FLOOR / 2], [1] * 6).pag().store()
    assert (tasks(short).stragglers() == "").all()


def sleep_then(i: int, seconds: float) -> bytes:
    time.sleep(seconds)
    return bytes(1000) + bytes([i])


@pytest.fixture(scope="module")
def two_threads():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        client.run_on_scheduler(add_task_stream)
        yield client


def test_a_task_that_sleeps_longer_with_its_siblings_bytes_is_slow_not_skew(two_threads):
    client = two_threads
    # Four tasks on two threads: the other thread's three end before the long one.
    parts = [dask.delayed(sleep_then)(i, 0.75 if i == 2 else 0.15, dask_key_name=("nap", i))
             for i in range(4)]
    dask.delayed(len)(parts, dask_key_name="count").compute()
    path = crux_dask.get_wcp(client)
    steps = path.to_frame()
    assert set(FLAG_COLUMNS) <= set(steps.columns)
    (flagged,) = path.stragglers().itertuples(index=False)
    assert (flagged.key, flagged.group, flagged.straggler) == ("('nap', 2)", "nap", "slow")
    assert flagged.bytes_ratio == pytest.approx(1.0, abs=0.01)
    # Dask's task stream: the task's run over the median of its siblings'.
    runs = {str(r["key"]): s["stop"] - s["start"]
            for r in client.run_on_scheduler(task_stream) for s in r["startstops"]
            if s["action"] == "compute" and str(r["key"]).startswith("('nap'")}
    stream = runs["('nap', 2)"] / np.median(list(runs.values()))
    assert flagged.slowdown == pytest.approx(stream, rel=0.1) and flagged.slowdown > 4
    assert flagged.share == pytest.approx(flagged.cost / path.length)
    by_prefix = path.by_prefix().set_index("prefix")
    assert by_prefix.loc["nap", "stragglers"] == 1
    table = PrefixTable(static_source(crux_dask.get_pag(client)))  # the dashboard's
    table.update()
    shown = dict(zip(table.source.data["prefix"], table.source.data["stragglers"]))
    assert shown == by_prefix["stragglers"].to_dict() and shown["nap"] == 1
    assert "('nap', 2): " in path.summary() and "slow" in path.summary()
    # The advice for a slow task names it and where it ran.
    advice = crux_dask.get_pag(client).suggest()
    why = advice.loc[advice["change"].str.startswith("look at the worker"), "why"]
    assert len(why) == 1 and "('nap', 2)" in why.iloc[0] and flagged.destination in why.iloc[0]


def test_equal_partitions_have_no_straggler_in_twenty_runs(two_threads):
    client = two_threads
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"k": rng.integers(0, 100, 400_000), "x": rng.random(400_000)})
    before = crux_dask.get_pag(client).store().n_states
    for run in range(20):
        source = dd.from_pandas(frame.assign(x=frame.x + run), npartitions=8)
        source.groupby("k").x.mean(split_out=2).compute()
        x = da.random.random((2000, 2000), chunks=500) + run
        (x @ x.T).sum().compute()
    store = crux_dask.get_pag(client).store()
    found = tasks(store)
    new = found.state >= before
    assert new.sum() >= 20 * 8 * 2  # every run's tasks, in groups of at least four
    flagged = new & (found.stragglers() != "")
    assert not flagged.any(), [
        (store.keys.values[store.state_key[s]], found.seconds[t], found.median_seconds[g])
        for t, s, g in zip(np.flatnonzero(flagged), found.state[flagged],
                           found.group[flagged])]


def part(i: int, hot: bool, rows: int = 20_000) -> pd.DataFrame:
    """Partition ``i``: keys 1-999 spread evenly; with ``hot``, as many rows again of
    key 0."""
    rng = np.random.default_rng(i)
    keys = rng.integers(1, 1000, rows)
    if hot:
        keys = np.concatenate([keys, np.zeros(rows, np.int64)])
        rng.shuffle(keys)
    return pd.DataFrame({"k": keys, "x": rng.random(len(keys))})


def walk(part: pd.DataFrame, most: int | None = None) -> pd.DataFrame:
    """Work in proportion to a partition's rows, at most ``most`` of them, 30 us a row,
    that waits rather than computes: two CPU-bound workers on this machine's two cores
    slow each other down by up to three times.  At 15 us a row, a hiccup of 0.1 s in
    the recorded run (which the prediction keeps) was 15 % of the run predicted."""
    time.sleep(3e-5 * min(len(part), most or len(part)))
    return part.head(1).assign(x=part["x"].sum())


def shuffled(hot: bool) -> dd.DataFrame:
    """Eight partitions made on the workers, shuffled by key into four."""
    return dd.from_map(part, range(8), hot=hot).shuffle("k", npartitions=4,
                                                        shuffle_method="tasks")


def walked(hot: bool, most: int | None = None) -> dd.DataFrame:
    """:func:`shuffled`, each partition walked."""
    frame = shuffled(hot)
    return frame.map_partitions(walk, most, meta=frame._meta)


def test_the_partition_of_a_hot_key_is_skew_and_its_median_what_if_predicts_it_gone():
    # More threads than walks on each worker: the walks run at once wherever the
    # scheduler puts their partitions (on two threads a worker, a third walk placed on
    # one waited for a thread, in one run of two without the hot key).
    with LocalCluster(n_workers=2, threads_per_worker=4, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        walked(hot=False).compute()  # warm, as the runs it is compared with are
        # The rows of the partitions walked: the group's median walks as many as the
        # middle two.
        typical = int(np.median(shuffled(hot=True).map_partitions(len).compute()))
        crux_dask.attach(client)
        walked(hot=True).compute()
        pag = crux_dask.get_pag(client)
        predicted = pag.what_if(stragglers="median", load=crux_dask.get_load(client))
        # The same run, the hot partition walked for as long as the others, three times:
        # what a prediction at the group's median says (the hot rows are still read and
        # shuffled; compared with a run without them, that was 5-20 % of the run).
        without = []
        for _ in range(3):
            walked(hot=True, most=typical).compute()
            without.append(crux_dask.get_wcp(client, computation=-1).length)
    path = pag.wcp()
    flagged = path.stragglers()
    skew = flagged[flagged["straggler"] == "skew"]
    assert len(skew) and skew["group"].str.startswith("walk").any(), flagged.to_string()
    top = skew[skew["group"].str.startswith("walk")].iloc[0]
    # The hot partition holds key 0's rows (half of all) and a quarter of the rest: five
    # times the rows of the others, and it sleeps five times as long.
    assert 4 < top["bytes_ratio"] < 6 and 4 < top["slowdown"] < 6 and top["share"] > 0.3
    stats = group_stats(pag.store()).set_index("group")
    assert list(stats.reset_index().columns) == list(GROUP_COLUMNS)
    assert stats.loc[top["group"], "stragglers"] == 1
    assert predicted.changes == {"stragglers": "median"}
    # At the median, the hot partition's excess (its seconds over its group's median)
    # leaves the path, or most of it; and the run predicted is the run whose hot
    # partition is walked no longer than the others.
    step = path.to_frame().set_index("step").loc[top["step"]]
    excess = step["median"] * (step["slowdown"] - 1)
    assert predicted.saved > 0.5 * excess, (predicted.saved, excess)
    assert predicted.makespan == pytest.approx(np.median(without), rel=0.15), (
        predicted.summary(), without)
    suggested = pag.suggest()
    replayed = suggested[suggested["change"].str.endswith("at their group's median")]
    assert len(replayed) == 1 and replayed["saved"].iloc[0] == pytest.approx(
        pag.what_if(stragglers="median").saved)
    assert suggested["change"].str.startswith("repartition, or salt").any()


def test_the_flags_and_statistics_survive_the_export(two_threads, tmp_path):
    client = two_threads
    parts = [dask.delayed(sleep_then)(i, 0.4 if i == 2 else 0.05, dask_key_name=("doze", i))
             for i in range(6)]
    dask.delayed(len)(parts, dask_key_name="tally").compute()
    live = crux_dask.get_pag(client)
    crux_dask.export_parquet(client, tmp_path / "run")
    read = crux_dask.read_parquet(tmp_path / "run")
    columns = ["key", *FLAG_COLUMNS]
    pd.testing.assert_frame_equal(read.wcp().to_frame()[columns],
                                  live.wcp().to_frame()[columns])
    assert (read.wcp().to_frame()["straggler"] != "").any()
    pd.testing.assert_frame_equal(group_stats(read.store()), group_stats(live.store()))
    pd.testing.assert_frame_equal(crux_dask.read_groups(tmp_path / "run"),
                                  group_stats(live.store()))
