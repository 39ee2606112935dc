"""P2P shuffles as data states: shards split, sent and merged, checked against distributed."""

from __future__ import annotations

import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster, wait
from distributed.utils_test import async_poll_for

import crux_dask
from crux_dask import PAGBuilder
from crux_dask.codec import decode_batch, encode_batch
from crux_dask.events import TYPES
from crux_dask.graph import feed as feed_module
from crux_dask.graph.shuffles import Shuffles
from crux_dask.model import BARRIER_LABEL, RECEIVED_LABEL, SHARDS_LABEL, received_key, shard_key
from crux_dask.path import CATEGORIES
from crux_dask.plugins.shuffles import ShardRecorder, shard_bytes
from crux_dask.plugins.tasks import Finished, task_events

A, B = "tcp://a:1", "tcp://b:1"
MEM_A, MEM_B = f"memory@{A}", f"memory@{B}"
SHARDS_METRIC = ("p2p", "foreground", "shards", "bytes")
BARRIER = "shuffle-barrier-4b3f04ef116eda78106718102fe7ca5a"


def shuffle_events(late_sends: bool = False, disk: bool = False) -> list[tuple]:
    """Two input partitions on A and B, shuffled to A and B; outputs on both.

    With ``disk`` the shuffle keeps what it receives on disk, as distributed
    does by default: even a worker's shards for itself are sent there.
    """
    def to(worker: str) -> str:
        return f"disk@{worker}" if disk else f"memory@{worker}"

    events = [
        ("root", 0.0),
        ("compute", "x-0", A, 1, 1.0, 2.0, 100),
        ("compute", "x-1", B, 1, 1.0, 2.5, 100),
        ("compute", "t-0", A, 1, 2.0, 3.0, 8, ("x-0",), -1, "shuffle-transfer"),
        ("shard", "t-0", A, to(A), 40, 2.0, 2.8, ("x-0",)),
        ("shard", "t-0", A, to(B), 60, 2.0, 2.8, ("x-0",)),
        ("compute", "t-1", B, 1, 2.5, 3.5, 8, ("x-1",), -1, "shuffle-transfer"),
        ("shard", "t-1", B, to(A), 70, 2.5, 3.2, ("x-1",)),
        ("shard", "t-1", B, to(B), 30, 2.5, 3.2, ("x-1",)),
        ("transfer", "t-0", MEM_A, MEM_B, 3.1, 3.2, 8),
    ]
    sends = [(("t-0", MEM_A, B, 2.9, 3.6, 60)), ("t-1", MEM_B, A, 3.3, 4.0, 70)]
    if disk:
        sends += [("t-0", MEM_A, A, 2.9, 3.0, 40), ("t-1", MEM_B, B, 3.3, 3.4, 30)]
    sent = []
    for key, source, worker, start, stop, size in sends:
        name = shard_key(key, to(worker))
        sent += [("transfer", name, source, to(worker), start, stop, size),
                 ("delete", name, source, stop)]
    barrier = ("compute", BARRIER, B, 1, 3.6, 4.2, 8, ("t-0", "t-1"))
    outputs = [("transfer", BARRIER, MEM_B, MEM_A, 4.2, 4.3, 8),
               ("compute", "out-0", A, 1, 4.5, 5.0, 110, (BARRIER,)),
               ("compute", "out-1", B, 1, 4.4, 5.1, 90, (BARRIER,))]
    if late_sends:  # the scheduler's reports overtake a worker's sends
        return [*events, barrier, *outputs, *sent]
    return [*events, *sent, barrier, *outputs]


def sources_of(store, sid: int) -> set[tuple[str, str]]:
    return {(store.keys.values[store.state_key[src]],
             store.locations.values[store.state_location[src]])
            for src, dst in zip(store.mutation_src, store.mutation_dst) if dst == sid}


@pytest.mark.parametrize(("late_sends", "disk"), [(False, False), (True, False), (False, True)])
def test_shards_are_split_sent_and_merged_by_the_barrier_and_the_outputs(late_sends, disk):
    place = "disk" if disk else "memory"
    b = PAGBuilder()
    b.apply_many(shuffle_events(late_sends, disk))
    assert b.n_parked == 0  # what waited for the sends was applied when they came
    store = b.store
    pag = b.pag()
    states = pag.states
    shards = states[states["label"] == SHARDS_LABEL]
    split = shards.drop_duplicates("key")
    assert sorted(split["size"]) == [30, 40, 60, 70]
    assert (split["origin"] == "shuffle-transfer").all()
    kinds = pag.mutations.set_index("dst")["kind"]
    assert (kinds[split["state_id"]] == "SPLIT").all()
    for key, home in (("t-0", MEM_A), ("t-1", MEM_B)):
        for dest in (A, B):
            name = shard_key(key, f"{place}@{dest}")
            sid = int(split[split["key"] == name]["state_id"].iloc[0])
            assert sources_of(store, sid) == {(f"x-{key[-1]}", home)}

    def state(key: str) -> int:  # the state its computation made
        return int(states[states["key"] == key]["state_id"].iloc[0])

    def arrived(key: str, worker: str) -> tuple[str, str]:
        return shard_key(key, f"{place}@{worker}"), f"{place}@{worker}"

    # The barrier merges its inputs and every shard where it arrived.
    assert sources_of(store, state(BARRIER)) == {
        ("t-0", MEM_B), ("t-1", MEM_B), arrived("t-0", A), arrived("t-0", B),
        arrived("t-1", A), arrived("t-1", B)}
    # Each output the barrier and what its worker received: the shards that arrived
    # there, merged once per worker, made when the last of them arrived.
    for out, worker, memory in (("out-0", A, MEM_A), ("out-1", B, MEM_B)):
        received = received_key(BARRIER, memory)
        assert sources_of(store, state(out)) == {(BARRIER, memory), (received, memory)}
        assert sources_of(store, state(received)) == {arrived("t-0", worker),
                                                      arrived("t-1", worker)}
        row = states.loc[state(received)]
        mutations = pag.mutations
        shards_there = states.loc[mutations[mutations["dst"] == state(received)]["src"]]
        assert row["size"] == shards_there["size"].sum() > 0
        assert row["time"] == shards_there["time"].max()
        assert (mutations[mutations["dst"] == state(received)]["kind"] == "MERGE").all()
        assert (row["label"], row["origin"]) == (RECEIVED_LABEL, BARRIER_LABEL)
    # The last shard to arrive (t-1's, at 4.0) is what the barrier waited for.
    path = pag.wcp(end=state("out-1"))
    assert list(path.to_frame()["key"])[-3:] == [shard_key("t-1", f"{place}@{A}"), BARRIER,
                                                  "out-1"]

    # The shards are released with the barrier's last copy, and forgotten.
    def held(key: str, worker: str) -> bool:
        name, location = arrived(key, worker)
        return b.holdings.at(name, store.locations.codes[location]) is not None

    b.apply(("delete", BARRIER, MEM_B, 6.0))
    assert all(held(k, w) for k in ("t-0", "t-1") for w in (A, B))
    b.apply(("delete", BARRIER, MEM_A, 6.1))
    assert not any(store.labels.values[store.key_label[store.state_key[s]]]
                   in (SHARDS_LABEL, RECEIVED_LABEL) for s in b.live_states())
    assert not (b.shuffles.shards or b.shuffles.barriers or b.shuffles.received
                or b.shuffles.keys)


def big_shuffle_events(n: int) -> list[tuple]:
    """``n`` partitions on A and B shuffled to ``n`` outputs on both, one shard per
    transfer task and worker."""
    workers = (A, B)
    events = [("root", 0.0)]
    for i in range(n):
        home = workers[i % 2]
        events += [("compute", f"x-{i}", home, 1, 1.0, 2.0, 100),
                   ("compute", f"t-{i}", home, 1, 2.0, 3.0, 8, (f"x-{i}",), -1,
                    "shuffle-transfer")]
        for dest in workers:
            events.append(("shard", f"t-{i}", home, f"memory@{dest}", 10, 2.0, 2.5,
                           (f"x-{i}",)))
            if dest != home:
                name = shard_key(f"t-{i}", f"memory@{dest}")
                events += [("transfer", name, f"memory@{home}", f"memory@{dest}", 3.0, 3.1, 10),
                           ("delete", name, f"memory@{home}", 3.1)]
        if home != B:
            events.append(("transfer", f"t-{i}", f"memory@{home}", MEM_B, 3.1, 3.2, 8))
    events.append(("compute", BARRIER, B, 1, 3.5, 4.0, 8, tuple(f"t-{i}" for i in range(n))))
    events.append(("transfer", BARRIER, MEM_B, MEM_A, 4.0, 4.1, 8))
    events += [("compute", f"out-{i}", workers[i % 2], 1, 4.2, 4.3, 10, (BARRIER,))
               for i in range(n)]
    return events


def test_a_shuffle_makes_mutations_in_proportion_to_its_partitions():
    """Every output on a worker reads what that worker received, merged once: not every
    shard again (which made n squared mutations)."""
    counts = {}
    for n in (50, 100):
        b = PAGBuilder()
        b.apply_many(big_shuffle_events(n))
        assert b.n_parked == 0
        counts[n] = b.store.n_mutations
        merges = b.pag().mutations
        received = b.pag().states.query("label == @RECEIVED_LABEL")
        assert len(received) == 2 and (received["size"] == 10 * n).all()
        into_outputs = merges[merges["dst"].isin(
            b.pag().states.index[b.pag().states["key"].str.startswith("out-")])]
        assert len(into_outputs) == 2 * n  # the barrier and what the worker received
    assert counts[100] <= 2.05 * counts[50]


@pytest.mark.parametrize("late_sends", [False, True])
def test_windows_build_a_shuffle_exactly_as_one_by_one(monkeypatch, late_sends):
    # A second shuffle like the first (labels the windows know), then routine events the
    # windows take around the release: more partitions, their release.
    first = shuffle_events(late_sends, disk=True)
    names = {**{f"{k}-{i}": f"{k}-{i + 2}" for k in ("x", "t", "out") for i in (0, 1)},
             BARRIER: BARRIER.replace("4b3f", "5c4e")}

    def renamed(value):
        if isinstance(value, tuple):
            return tuple(map(renamed, value))
        if not isinstance(value, str):
            return value
        head, arrow, tail = value.partition("->")
        return names.get(head, head) + arrow + tail

    events = [*first, *(renamed(e) for e in first if e[0] != "root"),
              *(("compute", f"y-{i}", A, 2, 6.0 + i, 6.5 + i, 10, ("out-0",)) for i in range(4)),
              *(("delete", f"y-{i}", MEM_A, 10.0 + i) for i in range(3)),
              ("delete", BARRIER, MEM_B, 13.0), ("delete", "y-3", MEM_A, 13.1),
              ("delete", BARRIER, MEM_A, 13.2),
              *(renamed(("delete", BARRIER, where, 14.0)) for where in (MEM_A, MEM_B))]
    events = [tuple(TYPES[e[0]](*e)) for e in events]  # every field, as the scheduler gives
    one = PAGBuilder(run_id="same")
    for event in events:
        one.apply(event)
    monkeypatch.setattr(feed_module, "COLUMNS_FROM", 1)  # windows wherever they can
    monkeypatch.setattr(feed_module, "PAUSE_MIN", 0)
    windowed = PAGBuilder(run_id="same")
    windowed.apply_many(events)
    for table in ("states", "mutations", "causes", "moments"):
        assert getattr(windowed.pag(), table).equals(getattr(one.pag(), table)), table
    assert windowed.holdings.newest == one.holdings.newest
    assert vars(windowed.shuffles) == vars(one.shuffles) == vars(Shuffles())


@pytest.mark.parametrize("at", ["after the shards", "between the sends"])
def test_a_shuffle_goes_on_in_the_next_segment_when_the_graph_is_spooled(at):
    # The scheduler spools its graph to disk when it grows too large and goes on in a
    # new segment: a shuffle split before it is merged after it, as in one segment.
    events = [*shuffle_events(), ("delete", BARRIER, MEM_B, 6.0), ("delete", BARRIER, MEM_A, 6.1)]
    cut = next(i for i, e in enumerate(events) if e[0] == "transfer" and "->" in e[1])
    if at == "after the shards":
        cut = next(i for i, e in enumerate(events) if e[2:3] == (B,) and e[1] == BARRIER)
    whole = PAGBuilder()
    whole.apply_many(events)
    first = PAGBuilder()
    first.apply_many(events[:cut])
    second = PAGBuilder()
    second.continue_from(first, 3.5)
    second.apply_many(events[cut:])
    assert second.n_parked == 0

    def made(builder: PAGBuilder, key: str) -> set[tuple[str, str]]:
        store = builder.store
        sid = next(s for s in range(store.n_states)
                   if store.keys.values[store.state_key[s]] == key)
        return sources_of(store, sid)

    for key in (BARRIER, "out-0", "out-1"):
        assert made(second, key) == made(whole, key)
    # The shards are released with the barrier's last copy, in the new segment too.
    live = {second.store.keys.values[second.store.state_key[s]] for s in second.live_states()}
    assert not any("->" in key for key in live)
    assert not (second.shuffles.shards or second.shuffles.barriers or second.shuffles.keys)


def test_a_malformed_shard_event_is_refused_and_changes_nothing():
    b = PAGBuilder()
    b.apply_many(shuffle_events()[:4])
    n = b.store.n_states
    for event in [("shard", "t-0", A, MEM_A, -1, 2.0, 2.8), ("shard", "t-0", A, 7, 1, 2.0, 2.8),
                  ("shard", "t-0", A, A, 1, 2.0, 2.8), ("shard", "t-0", A, MEM_A, "x", 2.0, 2.8),
                  ("shard", "t-0", A, MEM_A, 1)]:
        with pytest.raises((ValueError, TypeError)):
            b.apply(event)
    assert b.store.n_states == n


def test_shards_are_counted_as_distributed_counts_them():
    table = b"\x00" * 1234
    assert shard_bytes((7, table)) == 1234  # a dataframe shard: (partition, table)
    arrays = ((0, 1), [((0, 0), ((0, 0), np.zeros((10, 10)))), ((0, 1), ((0, 0), np.ones(5)))])
    assert shard_bytes(arrays) == 800 + 40  # an array shard: indices count nothing


def test_a_send_never_ends_before_it_started_when_the_clock_estimate_moves():
    """A worker's estimate of the scheduler's clock is renewed at each heartbeat: a send
    timed across a renewal must still make a batch the scheduler accepts (one event
    ending before it started got the whole batch rejected)."""
    recorded = []
    recorder = ShardRecorder(None, recorded.append, lambda: 9.5)  # moved back 0.5 s
    recorder._sent({0: ["t-0", 1]}, MEM_A, MEM_B, [(0, b"x" * 10)], start=10.0)
    transfer, delete = recorded
    assert transfer[0] == "transfer" and transfer[4] == transfer[5] == 10.0
    assert transfer[6] == 10 and delete == ("delete", shard_key("t-0", MEM_B), MEM_A, 10.0)
    assert len(decode_batch(encode_batch(recorded, A, 1))) == 2


def test_what_a_worker_reports_in_another_form_gives_no_shards():
    def entry(shards):
        return Finished("t", False, A, 1, 1.0, 2.0, 8, ("x",), "t", "t", None, None,
                        shards=shards)

    made = task_events(entry([1.5, [[MEM_A, 10], [MEM_B, 20]]]))
    assert [e[0] for e in made] == ["compute", "shard", "shard"]
    assert made[1][3:7] == (MEM_A, 10, 1.0, 1.5)
    assert task_events(entry([9.0, [[MEM_A, 10]]]))[1][6] == 2.0  # a split outside the run
    for shards in ([1.5], "junk", [1.5, [[MEM_A, -1]]], [1.5, [[7, 10]]],
                   [1.5, [[MEM_A, "10"]]]):
        assert [e[0] for e in task_events(entry(shards))] == ["compute"]


def frame(seed: int = 1, freq: str = "1s"):
    return dask.datasets.timeseries(start="2000-01-01", end="2000-01-09", freq=freq,
                                    partition_freq="1D", seed=seed)


WORKLOADS = {
    "shuffle": lambda: frame().shuffle("id", shuffle_method="p2p").x.sum(),
    "groupby": lambda: frame().groupby("name").x.mean(split_out=4, shuffle_method="p2p"),
    "hash join": lambda: frame().reset_index().merge(
        frame(2, "10s").reset_index(), on="timestamp", shuffle_method="p2p").size,
    "set_index": lambda: frame().reset_index().set_index("id", shuffle_method="p2p").x.sum(),
    "array rechunk": lambda: da.random.random((3000, 3000), chunks=(300, 3000)).rechunk(
        (3000, 300), method="p2p").sum(),
}


def shard_metric(client: Client) -> float:
    """Shard bytes distributed counted: once every worker's count reached the scheduler."""
    def on_workers(dask_worker):
        return sum(v for k, v in dask_worker.digests_total.items()
                   if isinstance(k, tuple) and k[:1] == ("p2p",) and k[2:] == SHARDS_METRIC[1:])

    counted = sum(client.run(on_workers).values())

    async def reached(dask_scheduler):
        await async_poll_for(
            lambda: dask_scheduler.cumulative_worker_metrics.get(SHARDS_METRIC, 0) >= counted,
            timeout=30)
        return dask_scheduler.cumulative_worker_metrics[SHARDS_METRIC]

    return client.run_on_scheduler(reached)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_a_shuffle_s_shards_hold_the_bytes_distributed_counts_and_explain_its_path(crux_client,
                                                                                  name):
    before = crux_dask.get_pag(crux_client).states
    before_metric = shard_metric(crux_client) if len(before) else 0.0
    dask.compute(WORKLOADS[name]())
    pag = crux_dask.get_pag(crux_client)
    states = pag.states[len(before):]
    shards = states[states["label"] == SHARDS_LABEL]
    kinds = pag.mutations.drop_duplicates("dst").set_index("dst")["kind"]
    split = shards[kinds[shards["state_id"]].to_numpy() == "SPLIT"]
    assert len(split) and split["key"].is_unique
    assert split["origin"].str.contains("transfer").all()
    counted = shard_metric(crux_client) - before_metric
    assert split["size"].sum() == pytest.approx(counted, rel=0.01)
    sent = shards[kinds[shards["state_id"]].to_numpy() == "TRANSFER"]
    assert len(sent)  # two workers: some shards crossed

    # Measured times agree with the barrier: it finished after every shard arrived.
    barrier = states[states["label"] == BARRIER_LABEL]
    assert len(barrier)
    assert sent["time"].max() <= barrier["time"].max() + 0.01

    path = crux_dask.get_wcp(crux_client, computation=-1)
    assert sum(path.breakdown.values()) == pytest.approx(path.length, abs=1e-6)
    assert set(path.breakdown) == set(CATEGORIES)
    assert path.breakdown["wait"] <= 0.10 * path.length
    steps = path.to_frame()
    # Splitting is the transfer task's computation; sending, to memory or disk, a transfer.
    shard_steps = steps[steps["label"] == SHARDS_LABEL]
    assert set(shard_steps["category"]) <= {"compute", "transfer"}
    # Through the barrier to the transfer task that was last, when its data released it
    # (in a join, a barrier may instead wait for a thread the other side's tasks held).
    on_path = steps.index[(steps["label"] == BARRIER_LABEL) & (steps["via"] == "data")]
    if len(on_path):
        before_barrier = steps.loc[on_path[0] - 1, "label"]
        assert before_barrier == SHARDS_LABEL or "transfer" in before_barrier


def test_a_shuffle_whose_worker_dies_leaves_a_consistent_graph(crux_client):
    def slow(df):
        time.sleep(0.2)
        return df

    meta = frame(3)._meta
    result = frame(3).map_partitions(slow, meta=meta).shuffle("id", shuffle_method="p2p").x.sum()
    expected = frame(3).x.sum().compute()
    future = crux_client.compute(result)

    async def mid_shuffle(dask_scheduler):  # some transfer tasks done, shards made
        await async_poll_for(lambda: any(
            ts.state == "memory" for ts in dask_scheduler.tasks.values()
            if ts.prefix.name == "shuffle-transfer"), timeout=60)

    crux_client.run_on_scheduler(mid_shuffle)
    crux_client.restart_workers([next(iter(crux_client.scheduler_info()["workers"]))])
    wait(future)
    assert future.result() == pytest.approx(expected)

    pag = crux_dask.get_pag(crux_client)
    stats = crux_dask.get_stats(crux_client)
    assert stats["events_pending"] == 0 and stats["last_error"] is None
    n = len(pag.states)
    mutations = pag.mutations
    assert mutations["src"].between(0, n - 1).all() and mutations["dst"].between(0, n - 1).all()
    assert (mutations["src"] < mutations["dst"]).all()  # a DAG, in order of creation
    states = pag.states
    assert (states[states["label"] == SHARDS_LABEL]["size"] >= 0).all()
    path = crux_dask.get_wcp(crux_client, computation=-1)
    assert path.length > 0
    assert sum(path.breakdown.values()) == pytest.approx(path.length, abs=1e-6)


def test_what_to_fix_a_hash_join_whose_path_runs_through_its_shards():
    # The run is the join alone (a cluster of its own), so the path suggest() replays
    # is the join's; its top labels include the shards', which is no task prefix to
    # speed up.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        dask.compute(WORKLOADS["hash join"]())
        pag = crux_dask.get_pag(client)
        steps = pag.wcp().to_frame()
        assert (steps["label"] == SHARDS_LABEL).any(), steps.to_string()
        suggested = pag.suggest(load=crux_dask.get_load(client))
    changes = suggested[suggested["kind"] == "what-if"]
    assert len(changes) >= 3 and np.isfinite(changes["predicted"]).all()
    assert not changes["change"].str.contains(SHARDS_LABEL, regex=False).any()
    speedups = changes[changes["change"].str.endswith(" 2x faster")]
    assert len(speedups) and set(speedups["change"].str.removesuffix(" 2x faster")) <= set(
        pag.states["label"])
    # The shuffle wrote its shards to disk in threads of its own, while the tasks ran:
    # no spill for a task to carry, nor for "no spill" to save.
    states = pag.states
    assert (states.loc[states["label"] == SHARDS_LABEL, "location"]
            .str.startswith("disk@").any())
    assert pag.what_if().run.spill.sum() == 0.0
    assert changes.set_index("change").loc["no spill", "saved"] == 0.0
