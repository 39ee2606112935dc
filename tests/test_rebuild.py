"""The live graph and the graph rebuilt from its exported tables agree exactly.

A run is recorded on the scheduler (the live builder) and read back offline
(from DataFrames or Parquet): both must give every state the same
last-arriving input, the same end state and the same critical paths, whatever
the workers' clocks and the order in which their reports arrive.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crux_dask import PAG, PAGBuilder
from crux_dask.path import PARTS
from crux_dask.provenance import read_dataset, write_dataset

WORKERS = ["tcp://10.0.0.1:1", "tcp://10.0.0.2:1", "tcp://10.0.0.3:1"]


class Cluster:
    """A plausible run drawn step by step, reported the way Dask reports it.

    The scheduler reports computations; each worker reports its fetches,
    spills and releases in batches of its own.  Every worker's times are off
    the scheduler's clock by its own offset (up to ±50 ms), as each converts
    them with its own estimate of the scheduler's clock.
    """

    def __init__(self, draw) -> None:
        self.draw = draw
        self.offset = {w: draw(st.floats(-0.05, 0.05)) for w in WORKERS}
        self.clock = 1000.0
        self.held: dict[str, set[str]] = {}  # key -> locations holding it
        self.done: list[str] = []
        self.where_computed: dict[str, str] = {}
        self.streams: dict[str, list[tuple]] = {"scheduler": [], **{w: [] for w in WORKERS}}

    def times(self, worker: str) -> tuple[float, float]:
        start = self.clock
        self.clock += self.draw(st.sampled_from([0.0, 0.001, 0.01, 0.03, 0.1]))
        return start + self.offset[worker], self.clock + self.offset[worker]

    def report(self, source: str, event: tuple) -> None:
        self.streams[source].append(event)
        if self.draw(st.integers(0, 24)) == 0:  # reported twice
            self.streams[source].append(event)

    def compute(self) -> None:
        draw = self.draw
        worker = draw(st.sampled_from(WORKERS))
        memory = f"memory@{worker}"
        inputs = sorted(set(draw(st.lists(st.sampled_from(self.done), max_size=3)))) if (
            self.done) else []
        inputs = [k for k in inputs if self.held.get(k)]
        for name in inputs:
            if memory not in self.held[name]:
                source = draw(st.sampled_from(sorted(self.held[name])))
                if source.startswith("disk@"):
                    source = "memory@" + source.partition("@")[2]
                    self.unspill(name, source.partition("@")[2])
                    if source == memory:
                        continue
                start, stop = self.times(worker)
                self.report(worker, ("transfer", name, source, memory, start, stop,
                                     draw(st.sampled_from([None, 100])),
                                     draw(st.sampled_from([None, start - 0.01]))))
                self.held[name].add(memory)
        key = f"('{draw(st.sampled_from(['load', 'mix', 'sum']))}-x', {len(self.done)})"
        start, stop = self.times(worker)
        moments: tuple = ()
        if draw(st.booleans()):  # sent, received, runnable; and who freed its queue slot
            sent = start - self.offset[worker] - draw(st.sampled_from([0.0, 0.002, 0.05]))
            runnable = draw(st.sampled_from([None, sent + self.offset[worker] + 0.001]))
            freed = draw(st.sampled_from(self.done)) if self.done and draw(
                st.integers(0, 3)) == 0 else None
            # ... and when the scheduler learnt it finished (its priority, files and
            # first sending not recorded).
            announced = draw(st.sampled_from([None, stop - self.offset[worker] + 0.003]))
            moments = (sent, None if runnable is None else runnable - 0.0005, runnable,
                       freed, self.where_computed.get(freed), None, None, None, announced)
        self.report("scheduler", ("compute", key, worker, draw(st.sampled_from([1, 2, None])),
                                  start, stop, draw(st.integers(0, 10_000)), tuple(inputs), 0,
                                  None, None, None, None, None, None, *moments))
        self.where_computed[key] = worker
        self.done.append(key)
        self.held[key] = {memory}

    def move(self, key: str, worker: str, source: str, target: str) -> None:
        """Spill (memory to disk) or load back: a transfer, then the source copy is gone."""
        start, stop = self.times(worker)
        self.report(worker, ("transfer", key, f"{source}@{worker}", f"{target}@{worker}",
                             start, stop, None))
        self.report(worker, ("delete", key, f"{source}@{worker}", stop))
        self.held[key] -= {f"{source}@{worker}"}
        self.held[key].add(f"{target}@{worker}")

    def unspill(self, key: str, worker: str) -> None:
        self.move(key, worker, "disk", "memory")

    def spill(self, key: str) -> None:
        places = sorted(p for p in self.held[key] if p.startswith("memory@"))
        if places:
            self.move(key, self.draw(st.sampled_from(places)).partition("@")[2], "memory",
                      "disk")

    def release(self, key: str) -> None:
        for place in sorted(self.held.pop(key, ())):
            worker = place.partition("@")[2]
            self.report(worker, ("delete", key, place, self.times(worker)[1]))

    def step(self) -> None:
        action = self.draw(st.sampled_from(["compute"] * 5 + ["spill", "release"]))
        alive = [k for k in self.done if self.held.get(k)]
        if action == "compute" or not alive:
            self.compute()
        elif action == "spill":
            self.spill(self.draw(st.sampled_from(alive)))
        else:
            self.release(self.draw(st.sampled_from(alive)))

    def deliveries(self) -> list[list[tuple]]:
        """Batches as they reach the scheduler: each source in order, sources interleaved."""
        batches = {source: _cut(events, self.draw) for source, events in self.streams.items()}
        order = self.draw(st.permutations(
            [source for source, parts in batches.items() for _ in parts]))
        return [batches[source].pop(0) for source in order]


def _cut(events: list[tuple], draw) -> list[list[tuple]]:
    if not events:
        return []
    cuts = sorted(set(draw(st.lists(st.integers(1, len(events)), max_size=4))) | {len(events)})
    return [events[a:b] for a, b in zip([0, *cuts], cuts) if a < b]


@st.composite
def recorded_runs(draw) -> list[list[tuple]]:
    cluster = Cluster(draw)
    for _ in range(draw(st.integers(1, 40))):
        cluster.step()
    return cluster.deliveries()


def record(batches: list[list[tuple]]) -> PAGBuilder:
    """The live builder after receiving ``batches``, as the scheduler applies them."""
    builder = PAGBuilder(run_id="run")
    builder.root(999.0, "graph")
    for now, batch in enumerate(batches):
        builder.apply_many(batch, float(now))
        if now % 3 == 2:
            builder.resolve_parked(older_than=now - 1.0)
    builder.resolve_parked()
    return builder


def _same_floats(a, b) -> bool:
    return np.array_equal(np.asarray(a, float), np.asarray(b, float), equal_nan=True)


def assert_same_graph(live: PAGBuilder, offline: PAG) -> None:
    store, rebuilt = live.store, offline.stores[0]
    assert rebuilt.n_states == store.n_states
    assert list(rebuilt.state_pred) == list(store.state_pred), "last-arriving inputs differ"
    assert _same_floats(rebuilt.state_ready, store.state_ready), "ready times differ"
    assert offline.ends[0] == live.end, "end states differ"
    assert list(rebuilt.state_cause) == list(store.state_cause), "last causes differ"
    for name in ("cause_src", "cause_dst", "cause_kind"):
        assert list(getattr(rebuilt, name)) == list(getattr(store, name)), name
    for name in ("state_requested", "state_received", "state_runnable", "state_announced"):
        assert _same_floats(getattr(rebuilt, name), getattr(store, name)), name
    shown = live.pag()
    for method in ("observed", "longest"):
        expected = shown.wcp(method=method)
        got = offline.wcp(method=method)
        assert got.steps[["via", "mutation_id", "cause_id"]].equals(
            expected.steps[["via", "mutation_id", "cause_id"]]), method
        assert math.isclose(got.length, expected.length, abs_tol=1e-12), method
        assert got.breakdown == pytest.approx(expected.breakdown, abs=1e-9), method
        for part in PARTS:  # every stage of every step
            assert np.allclose(got.steps[part], expected.steps[part], atol=1e-9), part


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recorded_runs())
def test_the_graph_read_back_from_its_tables_is_the_live_graph(batches):
    live = record(batches)
    shown = live.pag()
    assert_same_graph(live, PAG.from_frames(shown.states, shown.mutations, shown.causes,
                                            shown.moments))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recorded_runs())
def test_the_graph_read_back_from_parquet_is_the_live_graph(tmp_path_factory, batches):
    live = record(batches)
    path = tmp_path_factory.mktemp("runs")
    write_dataset(path, live.pag())
    assert_same_graph(live, read_dataset(path))


def test_the_end_read_back_is_the_end_the_dashboard_showed_despite_skewed_clocks():
    # Worker B's clock runs 2 ms behind A's: the copy of x on B, and the total
    # made from it, carry times before x's own.
    a, b = "tcp://10.0.0.1:1", "tcp://10.0.0.2:1"
    live = PAGBuilder(run_id="run")
    live.root(0.0)
    live.compute("x", a, 1, 9.0, 10.0, 8)
    live.transfer("x", f"memory@{a}", f"memory@{b}", 9.997, 9.998)
    total = live.compute("total", b, 1, 9.998, 9.999, 8, ("x",))
    assert live.end == total
    shown = live.pag()
    offline = PAG.from_frames(shown.states, shown.mutations)
    assert offline.ends[0] == total
    assert offline.wcp().states["key"].iloc[-1] == "total"
    assert_same_graph(live, offline)
