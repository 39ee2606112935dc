"""The mapping rules: from events to exact states and mutations."""

from __future__ import annotations

import pytest

import crux_dask.graph.feed as feed_module
from crux_dask import PAGBuilder
from crux_dask.events import Compute
from crux_dask.graph import rules

A = "tcp://127.0.0.1:1001"
B = "tcp://127.0.0.1:1002"
C = "tcp://127.0.0.1:1003"


def rows(builder: PAGBuilder):
    pag = builder.pag()
    return pag.states.set_index("state_id"), pag.mutations


def test_first_task_is_appended_from_the_graph_root():
    b = PAGBuilder()
    root = b.root(10.0)
    x = b.compute("x", A, 7, 10.5, 11.0, 80, (), root, "x")
    states, mutations = rows(b)
    assert states.loc[root, "location"] == "root"
    assert states.loc[x, ["key", "location", "worker", "thread", "size", "time"]].tolist() == [
        "x", f"memory@{A}", A, 7, 80, 11.0]
    (edge,) = mutations.itertuples()
    assert (edge.src, edge.dst, edge.kind) == (root, x, "APPEND")
    assert edge.cost == pytest.approx(1.0) and edge.busy == pytest.approx(0.5)
    assert (edge.start, edge.stop) == (10.5, 11.0)


def test_single_input_is_a_convert():
    b = PAGBuilder()
    b.root(0.0)
    x = b.compute("x", A, 1, 0, 1, 8, ())
    y = b.compute("y", A, 1, 1, 3, 8, ("x",))
    _, mutations = rows(b)
    assert mutations.iloc[-1][["src", "dst", "kind", "busy", "cost"]].tolist() == [
        x, y, "CONVERT", 2.0, 2.0]


def test_several_inputs_merge_and_the_last_arrival_is_remembered():
    b = PAGBuilder()
    b.root(0.0)
    x = b.compute("x", A, 1, 0, 5, 8, ())
    y = b.compute("y", A, 1, 0, 2, 8, ())
    z = b.compute("z", A, 1, 5, 6, 8, ("y", "x"))
    _, mutations = rows(b)
    merges = mutations[mutations["dst"] == z]
    assert merges["kind"].tolist() == ["MERGE", "MERGE"]
    assert merges["src"].tolist() == [y, x]
    last = b.store.state_pred[z]
    assert b.store.mutation_src[last] == x  # x became available last


def test_fan_out_to_siblings_of_one_group_is_a_split():
    b = PAGBuilder()
    b.root(0.0)
    whole = b.compute("whole", A, 1, 0, 1, 300, ())
    parts = [b.compute(f"('part-1', {i})", A, 1, 1, 2, 100, ("whole",), label="part")
             for i in range(3)]
    other = b.compute("other", A, 1, 2, 3, 8, ("whole",), label="other")
    _, mutations = rows(b)
    from_whole = mutations[mutations["src"] == whole].set_index("dst")["kind"]
    assert [from_whole[p] for p in parts] == ["SPLIT"] * 3
    assert from_whole[other] == "CONVERT"


def test_one_consumer_per_group_stays_a_convert():
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0, 1, 8, ())
    b.compute("y", A, 1, 1, 2, 8, ("x",), label="y")
    b.compute("z", A, 1, 1, 2, 8, ("x",), label="z")
    _, mutations = rows(b)
    assert mutations["kind"].tolist() == ["APPEND", "CONVERT", "CONVERT"]


def test_transfer_moves_data_and_the_consumer_reads_the_copy():
    b = PAGBuilder()
    b.root(0.0)
    x = b.compute("x", A, 1, 0, 1, 1000, ())
    moved = b.transfer("x", f"memory@{A}", f"memory@{B}", 1.2, 1.5)
    y = b.compute("y", B, 2, 1.5, 2, 8, ("x",))
    states, mutations = rows(b)
    assert states.loc[moved, ["key", "location", "worker", "size", "time"]].tolist() == [
        "x", f"memory@{B}", B, 1000, 1.5]
    transfer = mutations[mutations["dst"] == moved].iloc[0]
    assert (transfer["src"], transfer["kind"]) == (x, "TRANSFER")
    assert transfer["busy"] == pytest.approx(0.3) and transfer["cost"] == pytest.approx(0.5)
    assert mutations[mutations["dst"] == y]["src"].tolist() == [moved]


def test_release_is_a_delete_to_a_tombstone():
    b = PAGBuilder()
    b.root(0.0)
    x = b.compute("x", A, 1, 0, 1, 1000, ())
    gone = b.delete("x", f"memory@{A}", 4.0)
    states, mutations = rows(b)
    assert states.loc[gone, ["key", "size", "location", "time"]].tolist() == [
        "x", 0, f"memory@{A}", 4.0]
    assert mutations.iloc[-1][["src", "dst", "kind", "busy"]].tolist() == [
        x, gone, "DELETE", 0.0]
    assert b.delete("x", f"memory@{A}", 5.0) is None  # nothing left to release
    assert b.n_parked == 0  # and nothing to wait for: it was released there already
    assert b.end == x  # a tombstone never ends the workflow


def test_spill_and_unspill_are_transfers_through_disk():
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0, 1, 1000, ())
    on_disk = b.transfer("x", f"memory@{A}", f"disk@{A}", 2, 2.1)
    b.delete("x", f"memory@{A}", 2.1)
    back = b.transfer("x", f"disk@{A}", f"memory@{A}", 3, 3.2)
    y = b.compute("y", A, 1, 3.2, 4, 8, ("x",))
    states, mutations = rows(b)
    assert states.loc[on_disk, "location"] == f"disk@{A}"
    assert mutations[mutations["dst"] == back]["src"].tolist() == [on_disk]
    assert mutations[mutations["dst"] == y]["src"].tolist() == [back]


def test_a_consumer_reported_before_its_input_transfer_waits_for_it():
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0, 1, 1000, ())
    assert b.compute("y", B, 2, 1.5, 2, 8, ("x",), now=100.0) is None
    assert b.n_parked == 1
    moved = b.transfer("x", f"memory@{A}", f"memory@{B}", 1.1, 1.4)
    assert b.n_parked == 0
    _, mutations = rows(b)
    consumer = mutations[mutations["key"] == "y"]
    assert consumer["src"].tolist() == [moved]


def test_a_long_chain_reported_backwards_is_applied_when_its_first_link_comes():
    # Each task waits for the one before; the first one's arrival applies them all, in
    # a loop rather than a stack frame per link (sys.getrecursionlimit() is 1,000).
    b = PAGBuilder()
    b.root(0.0)
    n = 3_000
    for i in reversed(range(1, n)):
        assert b.compute(f"t-{i}", A, 1, i, i + 0.5, 8, (f"t-{i - 1}",), now=100.0) is None
    assert b.n_parked == n - 1
    b.compute("t-0", A, 1, 0, 0.5, 8, ())
    assert b.n_parked == 0 and b.n_fallbacks == 0
    _, mutations = rows(b)
    made = mutations[mutations["kind"] != "DELETE"].set_index("key")
    assert len(made) == n and made.loc["t-2999", "src"] == made.loc["t-2998", "dst"]


def test_a_task_reported_after_its_input_was_released_finds_it_across_a_spool():
    # The release came in the segment before, the consumer's report in this one: the
    # released copy is remembered, made once, not held, not a stand-in.
    first = PAGBuilder()
    first.root(0.0)
    first.compute("x", A, 1, 0.5, 1.0, 8, ())
    first.delete("x", f"memory@{A}", 2.0)
    first.compute("kept", A, 1, 1.0, 1.2, 8, ())
    second = PAGBuilder()
    second.continue_from(first, 3.0)
    y = second.compute("y", A, 2, 1.5, 1.8, 8, ("x",), now=100.0)
    z = second.compute("z", A, 2, 1.8, 1.9, 8, ("x",), now=100.0)
    assert second.n_parked == 0 and second.n_fallbacks == 0
    states, mutations = rows(second)
    made = mutations[mutations["kind"] != "DELETE"].set_index("dst")
    source = made.loc[y, "src"]
    assert made.loc[z, "src"] == source
    assert states.loc[source, ["key", "location", "time", "size"]].tolist() == [
        "x", f"memory@{A}", 1.0, 8]
    assert "x" not in second.holdings.newest and "kept" in second.holdings.newest


def test_an_event_that_waits_again_waits_from_when_it_first_waited():
    # z needs two fetches; after the first it waits for the second, as long as it
    # may wait from when it first did, not given a stand-in at the next look.
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0, 1, 8, ())
    b.compute("y", A, 1, 1, 2, 8, ())
    assert b.compute("z", B, 2, 3, 4, 8, ("x", "y"), now=100.0) is None
    b.transfer("x", f"memory@{A}", f"memory@{B}", 2.1, 2.2, now=101.0)
    assert b.n_parked == 1
    b.resolve_parked(older_than=50.0)  # waited since 100: not yet its time
    assert b.n_parked == 1 and b.n_fallbacks == 0
    moved = b.transfer("y", f"memory@{A}", f"memory@{B}", 2.3, 2.4, now=102.0)
    _, mutations = rows(b)
    assert moved in mutations[mutations["key"] == "z"]["src"].tolist()
    b.resolve_parked(older_than=150.0)
    assert b.n_parked == 0 and b.n_fallbacks == 0


def test_a_release_reported_before_the_task_that_made_the_data_waits_for_it():
    # y waits for its input's transfer, which B reports after y's release.
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0, 1, 1000, ())
    assert b.compute("y", B, 2, 1.5, 2, 8, ("x",), now=100.0) is None
    assert b.delete("y", f"memory@{B}", 3.0, now=100.0) is None
    assert b.n_parked == 2
    b.transfer("x", f"memory@{A}", f"memory@{B}", 1.1, 1.4)
    assert b.n_parked == 0
    states, mutations = rows(b)
    y = states.index[(states["key"] == "y") & (states["size"] == 8)].item()
    gone = mutations[(mutations["src"] == y) & (mutations["kind"] == "DELETE")]["dst"]
    assert states.loc[gone.item(), ["size", "time"]].tolist() == [0, 3.0]
    # A release of data never reported goes once its wait is over, with nothing made.
    assert b.delete("z", f"memory@{B}", 4.0, now=100.0) is None
    assert b.resolve_parked() == 0 and b.n_parked == 0


def test_an_input_that_never_arrives_falls_back_to_the_newest_copy():
    b = PAGBuilder()
    b.root(0.0)
    x = b.compute("x", A, 1, 0, 1, 1000, ())
    b.compute("y", B, 2, 1.5, 2, 8, ("x",), now=100.0)
    assert b.resolve_parked(older_than=50.0) == 0  # not old enough yet
    assert b.resolve_parked(older_than=101.0) == 1
    _, mutations = rows(b)
    assert mutations[mutations["key"] == "y"]["src"].tolist() == [x]
    assert b.n_fallbacks == 1


def test_scattered_data_comes_from_the_client():
    b = PAGBuilder()
    b.root(0.0)
    landed = b.transfer("data-1", "client", f"memory@{A}", 1.0, 1.5, 500)
    back = b.transfer("data-1", f"memory@{A}", "client", 2.0, 2.5)
    states, mutations = rows(b)
    client = mutations[mutations["dst"] == landed]["src"].item()
    assert states.loc[client, ["location", "origin"]].tolist() == ["client", "client"]
    assert mutations[mutations["dst"] == client]["kind"].tolist() == ["APPEND"]
    assert states.loc[back, ["location", "size"]].tolist() == ["client", 500]


def test_reading_a_file_starts_from_a_file_state():
    b = PAGBuilder()
    b.root(0.0)
    loaded = b.transfer("input.csv", "file@node1:/data/input.csv", f"memory@{A}", 1.0, 2.0,
                        10_000_000)
    states, mutations = rows(b)
    file_state = mutations[mutations["dst"] == loaded]["src"].item()
    assert states.loc[file_state, ["label", "location", "origin"]].tolist() == [
        "input.csv", "file@node1:/data/input.csv", "file"]


def test_annotations_override_kind_label_and_location():
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0, 1, 8, ())
    out = b.compute("write-x", A, 1, 1, 3, 8, ("x",), label="out.nc", kind="APPEND",
                    location="file@node1:/out.nc")
    states, mutations = rows(b)
    assert states.loc[out, ["label", "location"]].tolist() == ["out.nc", "file@node1:/out.nc"]
    assert mutations.iloc[-1]["kind"] == "APPEND"


def test_a_task_that_wrote_a_file_is_in_its_workers_memory_too():
    b = PAGBuilder()
    b.root(0.0)
    out = b.compute("write-x", A, 1, 0, 1, 8, (), label="out.nc", kind="APPEND",
                    location="file@node1:/out.nc")
    use = b.compute("read-x", A, 1, 1, 2, 8, ("write-x",))  # same worker: from memory
    assert use is not None and b.n_parked_total == 0
    fetched = b.transfer("write-x", f"memory@{A}", f"memory@{B}", 2, 3, 8)
    _, mutations = rows(b)
    assert mutations.set_index("dst").loc[[use, fetched], "src"].tolist() == [out, out]
    gone = b.delete("write-x", f"memory@{A}", 4)  # the file stays
    assert rows(b)[1].set_index("dst").loc[gone, "src"] == out
    assert b.compute("again", B, 1, 4, 5, 8, ("write-x",)) is not None
    assert b.n_parked_total == 0


def test_unknown_event_kinds_are_refused():
    with pytest.raises(ValueError, match="unknown event kind 'explode'"):
        PAGBuilder().apply(("explode", 1))


def test_a_task_without_a_label_is_labelled_by_dask_key_split():
    from dask.utils import key_split

    b = PAGBuilder()
    b.root(0.0)
    for i, key in enumerate(["inc-abc123", "('x-3f2a1b7c9d0e', 0, 1)",
                             "('rechunk-merge-abc', 1)",
                             "finalize-0123456789abcdef0123456789abcdef", "hello-world-1"]):
        sid = b.compute(key, A, 1, i, i + 1, 8)
        assert b.pag().states.loc[sid, "label"] == key_split(key), key


def test_a_fetch_reported_after_the_source_released_its_copy_still_links_to_it():
    """Workers report on their own schedule: A's release may arrive before B's fetch."""
    b = PAGBuilder()
    b.root(0.0)
    x = b.compute("x", A, 1, 0, 1, 1000, ())
    b.delete("x", f"memory@{A}", 2.0)  # A's batch arrives first
    moved = b.transfer("x", f"memory@{A}", f"memory@{B}", 1.2, 1.5)  # then B's
    _, mutations = rows(b)
    assert mutations[mutations["dst"] == moved]["src"].tolist() == [x]
    assert b.n_parked == 0 and b.n_fallbacks == 0


def test_forced_resolution_follows_event_time_so_chains_resolve():
    b = PAGBuilder()
    b.root(0.0)
    # y on B needs x's copy on B, whose transfer needs x on A: none reported yet.
    b.compute("y", B, 2, 3.0, 4.0, 8, ("x",), now=1.0)
    b.transfer("x", f"memory@{A}", f"memory@{B}", 2.0, 2.5, 100, now=1.0)
    b.compute("x", A, 1, 0.0, 1.0, 100, ("w",), now=1.0)  # its own input is never reported
    assert b.n_parked == 3
    b.resolve_parked()
    assert b.n_parked == 0
    path = b.pag().wcp()
    assert path.states["key"].tolist()[-3:] == ["x", "x", "y"]
    assert path.steps["kind"].tolist()[-2:] == ["TRANSFER", "CONVERT"]


def test_a_waiting_event_waits_for_a_waiting_maker_whatever_the_clocks_say():
    b = PAGBuilder()
    b.root(0.0)
    # x's input is never reported, so x waits; y needs x and waits too.  y's
    # clock puts it before x, but only x can make what y needs.
    b.compute("x", A, 1, 0.0, 2.0, 8, ("w",), now=1.0)
    b.compute("y", A, 1, 1.9, 1.95, 8, ("x",), now=1.0)
    assert b.n_parked == 2
    assert b.resolve_parked() == 2
    states, mutations = rows(b)
    y = states.index[states["key"] == "y"].item()
    (src,) = mutations[mutations["dst"] == y]["src"]
    assert states.loc[src, "key"] == "x"  # the real x, not a stand-in
    (made_from,) = mutations[mutations["dst"] == src]["src"]
    assert states.loc[made_from, "key"] == "w"  # only w was stood in for
    assert b.n_parked_total == 2


def test_a_lost_worker_releases_everything_it_held():
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", A, 1, 0, 1, 8, ())
    b.compute("y", A, 1, 0, 1, 8, ())
    b.transfer("x", f"memory@{A}", f"memory@{B}", 1.0, 1.1)
    assert b.lose(A, 5.0) == 2
    _, mutations = rows(b)
    gone = mutations[mutations["kind"] == "DELETE"]
    assert sorted(gone["key"]) == ["x", "y"] and set(gone["worker"]) == {A}
    # The copy on B is still there for its consumers.
    z = b.compute("z", B, 2, 2, 3, 8, ("x",))
    assert z is not None and b.n_parked == 0


def skewed_fan_in(rounds: int) -> list[tuple]:
    """Rounds of eight parts on B merged into a total on A; B's clock is 5 ms ahead.

    The last part of a round carries a later time than its fetch and than the
    total made from it, and it is copied to a third worker too: only the order
    of causes says the total is last.
    """
    events: list[tuple] = [("root", 0.0, "graph")]
    for r in range(rounds):
        t = 10.0 * r + 1.0
        fetched = t + 0.08  # on A's clock
        parts = [f"part-{r}-{i}" for i in range(8)]
        for i, part in enumerate(parts):
            stop = fetched + 0.005 if i == 7 else t + 0.01 * i  # B's clock
            events.append(("compute", part, B, 1, stop - 0.002, stop, 8, (), -1, "part",
                           None, None, None, None, None))
        for part in parts:
            events.append(("transfer", part, f"memory@{B}", f"memory@{A}", fetched - 0.001,
                           fetched, 8))
        events.append(("transfer", parts[7], f"memory@{B}", f"memory@{C}", fetched - 0.002,
                       fetched - 0.001, 8))
        events.append(("compute", f"total-{r}", A, 1, fetched, fetched + 0.0001, 8,
                       tuple(parts), -1, "total", None, None, None, None, None))
    return events


def built(events: list[tuple], how: str, monkeypatch) -> PAGBuilder:
    """A builder that applied ``events`` one by one, or in windows of columns from the
    first event on (so that even a last, short run is put in columns)."""
    b = PAGBuilder()
    if how == "windows":
        monkeypatch.setattr(feed_module, "COLUMNS_FROM", 1)
        b.apply_many(events)
    else:
        for event in events:
            b.apply(event)
    return b


@pytest.mark.parametrize("how", ["one by one", "windows"])
def test_a_state_made_from_the_end_is_the_end_whatever_the_clocks_say(how, monkeypatch):
    b = built(skewed_fan_in(60), how, monkeypatch)
    states, _ = rows(b)
    last_part = states[states["key"] == "part-59-7"]["time"].max()
    assert last_part > states.loc[b.end, "time"]  # the clocks say the part came last
    assert states.loc[b.end, "key"] == "total-59"
    assert b.pag().wcp().states["key"].iloc[-1] == "total-59"


def _columns_of(store) -> dict:
    """Every column's bytes and every table's strings: what makes two stores equal."""
    from array import array

    from crux_dask.growable import StringTable
    return {name: value.tobytes() if isinstance(value, array) else
            (value.values, value.codes) if isinstance(value, StringTable) else value
            for name, value in vars(store).items() if name != "origin"}  # what it copies


def test_a_copy_or_the_pieces_up_to_some_lengths_are_the_graph_as_it_was_then(monkeypatch):
    # A scheduler takes the lengths on its event loop, then copies in a thread while
    # events go on: what came after is not in the copy.
    from crux_dask import store as store_module
    from crux_dask.store import PAGStore

    monkeypatch.setattr(store_module, "PIECE_BYTES", 512)  # pieces of 64 to 512 rows: many

    b = PAGBuilder()
    b.root(0.0)
    for i in range(600):
        b.compute(f"t-{i}", "tcp://w:1", 1, i, i + 0.5, 8, (f"t-{i - 1}",) if i else ())
    b.compute("odd\0key", "tcp://w:1", 1, 700.0, 701.0, 8, ())
    b.compute("", "tcp://w:2", 1, 700.0, 701.0, 8, ())
    then = _columns_of(b.store.copy())
    upto = b.store.lengths()
    for i in range(600, 700):
        b.compute(f"t-{i}", "tcp://w:3", 1, i, i + 0.5, 8, (f"t-{i - 1}",))
    assert _columns_of(b.store.copy(upto)) == then
    assert _columns_of(PAGStore.from_pieces(b.store.to_pieces(upto))) == then
    pieces = b.store.to_pieces()
    assert _columns_of(PAGStore.from_pieces(pieces)) == _columns_of(b.store)
    # Of about the bytes asked for (keys of 5 characters here; pickling adds its own).
    assert max(map(len, pieces[1:])) < 2 * 512


@pytest.mark.parametrize("how", ["one by one", "windows"])
def test_a_task_behind_another_on_its_thread_waited_for_it_whatever_the_clocks_say(
        how, monkeypatch):
    # Ten tasks queued at once for one thread, each 0.12 s.  The worker converts each
    # task's times with its estimate of the scheduler's clock at the time, which a
    # heartbeat on a loaded machine moved back 12.7 ms before the sixth: it starts
    # before the fifth stops (as Dask's task stream showed it), more than the slack.
    jump = rules.CLOCK_SLACK + 0.0027
    events, start = [("root", 0.0, "graph")], 1.0
    for i in range(10):
        if i == 5:
            start -= jump
        events.append(Compute("compute", f"work-{i}", A, 1, start, start + 0.12, 8,
                              sent=0.5, received=0.5, runnable=0.5))
        start += 0.12
    b = built(events, how, monkeypatch)
    path = b.pag().wcp()
    steps = path.to_frame()
    works = steps[steps["category"] == "compute"]
    assert list(works["key"]) == [f"work-{i}" for i in range(10)]
    assert (works["via"].iloc[1:] == "thread").all()
    # The clocks' disagreement is taken from the task that started early, not added.
    assert sum(path.breakdown.values()) == pytest.approx(path.length, abs=1e-9)
    assert path.breakdown["compute"] == pytest.approx(10 * 0.12 - jump, abs=1e-9)


@pytest.mark.parametrize("how", ["one by one", "windows"])
def test_a_task_that_started_before_the_one_ahead_on_its_thread_did_not_wait_for_it(
        how, monkeypatch):
    # Applied out of the order they ran in: the second ran first, so it waited for
    # no thread, whatever it was applied after.
    events = [("root", 0.0, "graph"),
              Compute("compute", "later", A, 1, 2.0, 3.0, 8, runnable=0.5),
              Compute("compute", "earlier", A, 1, 1.0, 2.5, 8, runnable=0.5)]
    b = built(events, how, monkeypatch)
    assert b.store.n_causes == 0
