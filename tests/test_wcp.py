"""Critical paths: the thesis's examples, and networkx as an oracle."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crux_dask import PAG, PAGBuilder

W = "tcp://127.0.0.1:1001"


def thesis_merge_example() -> tuple[PAG, dict[str, int]]:
    """Figure 5.3.1: A→B→C→D (2 s each) and A→E (2 s), D and E merge into F at 1:08."""
    b = PAGBuilder()
    b.root(60.0)
    ids = {"A": b.compute("A", W, 1, 60, 60, 1, (), label="A")}
    for key, source, start, stop in [("B", "A", 60, 62), ("C", "B", 62, 64), ("D", "C", 64, 66),
                                     ("E", "A", 60, 62)]:
        ids[key] = b.compute(key, W, 1, start, stop, 1, (source,), label=key)
    ids["F"] = b.compute("F", W, 1, 66, 68, 1, ("D", "E"), label="F")
    return b.pag(), ids


def test_thesis_merge_example_follows_the_last_arrival():
    pag, ids = thesis_merge_example()
    path = pag.wcp(start=ids["A"])
    assert path.states["key"].tolist() == ["A", "B", "C", "D", "F"]
    assert path.length == pytest.approx(8.0)
    assert path.steps["kind"].tolist() == ["CONVERT", "CONVERT", "CONVERT", "MERGE"]
    assert sum(path.breakdown.values()) == pytest.approx(path.length)
    # Without a start the walk goes on to the graph's root.
    assert pag.wcp().states["key"].tolist() == ["root", "A", "B", "C", "D", "F"]


def test_shortest_path_over_inverse_cost_picks_the_wrong_path():
    """A chain of four 2.5 s steps arrives last; a 1 s + 9 s path looks 'cheaper' in 1/cost."""
    b = PAGBuilder()
    b.root(0.0)
    b.compute("A", W, 1, 0, 0, 1, (), label="A")
    previous = "A"
    for i, stop in enumerate([2.5, 5.0, 7.5], 1):
        b.compute(f"B{i}", W, 1, stop - 2.5, stop, 1, (previous,), label=f"B{i}")
        previous = f"B{i}"
    b.compute("C", W, 1, 0, 1, 1, ("A",), label="C")
    b.compute("D", W, 1, 7.5, 10, 1, ("B3", "C"), label="D")
    pag = b.pag()
    states, mutations = pag.states, pag.mutations
    key = dict(zip(states["state_id"], states["key"]))
    a_id = states.index[states["key"] == "A"][0]
    d_id = states.index[states["key"] == "D"][0]

    graph = nx.DiGraph()
    for m in mutations.itertuples():
        graph.add_edge(m.src, m.dst, inverse=1.0 / m.cost if m.cost else float("inf"))
    naive = [key[s] for s in nx.shortest_path(graph, a_id, d_id, weight="inverse")]
    ours = pag.wcp(start=int(a_id), end=int(d_id)).states["key"].tolist()
    assert naive == ["A", "C", "D"]
    assert ours == ["A", "B1", "B2", "B3", "D"]


def test_longest_busy_path_prefers_work_over_waiting():
    pag, _ = thesis_merge_example()
    path = pag.wcp(method="longest")
    assert path.states["key"].tolist() == ["A", "B", "C", "D", "F"]
    assert path.steps["busy"].sum() == pytest.approx(8.0)


def test_observed_path_honours_start_and_end():
    pag, ids = thesis_merge_example()
    path = pag.wcp(start=ids["E"], end=ids["F"])
    assert path.states["key"].tolist() == ["E", "F"]
    with pytest.raises(ValueError, match="does not descend"):
        pag.wcp(start=ids["B"], end=ids["E"])
    with pytest.raises(ValueError, match="not in the graph"):
        pag.wcp(end=999)
    with pytest.raises(ValueError, match="unknown method"):
        pag.wcp(method="shortest")


def test_breakdown_splits_transfer_wait_and_compute():
    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", W, 1, 0.5, 1.0, 8, ())
    b.transfer("x", f"memory@{W}", "memory@tcp://other:1", 1.2, 1.5)
    b.compute("y", "tcp://other:1", 1, 1.6, 2.0, 8, ("x",))
    path = b.pag().wcp()
    assert path.breakdown["compute"] == pytest.approx(0.9)
    assert path.breakdown["transfer"] == pytest.approx(0.3)
    assert path.breakdown["wait"] == pytest.approx(0.8)
    assert path.length == pytest.approx(2.0)
    frame = path.to_frame()
    assert frame["category"].tolist() == ["compute", "transfer", "compute"]
    assert (frame["busy"] + frame["wait"]).sum() == pytest.approx(path.length)
    assert "critical path" in path._repr_html_()


def test_a_transfer_that_waited_for_its_consumer_is_not_the_cause():
    """Dask moves an input only when its consumer can run: the wait is the other input's."""
    b = PAGBuilder()
    b.root(0.0)
    b.compute("a", W, 1, 0.0, 0.1, 8, ())
    b.compute("slow", W, 1, 0.1, 0.6, 8, ("a",))
    b.compute("fast", "tcp://other:1", 1, 0.1, 0.15, 8, ())
    b.transfer("fast", "memory@tcp://other:1", f"memory@{W}", 0.61, 0.62)  # arrives last
    b.compute("join", W, 1, 0.62, 0.63, 8, ("slow", "fast"))
    path = b.pag().wcp()
    assert path.states["key"].tolist() == ["root", "a", "slow", "join"]


def test_a_slow_transfer_stays_critical():
    """A checkpoint whose move takes longer than the other branch is on the path."""
    b = PAGBuilder()
    b.root(0.0)
    b.compute("checkpoint", "tcp://other:1", 1, 0.0, 1.0, 8, ())
    b.transfer("checkpoint", "memory@tcp://other:1", f"memory@{W}", 1.0, 9.0)
    b.compute("other", W, 1, 0.0, 5.0, 8, ())
    b.compute("restart", W, 1, 9.0, 10.0, 8, ("other", "checkpoint"))
    path = b.pag().wcp()
    assert path.states["key"].tolist() == ["root", "checkpoint", "checkpoint", "restart"]
    assert path.breakdown["transfer"] == pytest.approx(8.0)
    again = PAG.from_frames(b.pag().states, b.pag().mutations)
    assert again.wcp().states["key"].tolist() == path.states["key"].tolist()


def test_empty_graph_has_an_empty_path():
    b = PAGBuilder()
    b.root(0.0)
    path = b.pag().wcp()
    assert len(path) == 0 and path.length == 0.0
    assert b.pag().wcp(method="longest").length == 0.0


# -- networkx as the oracle for ``longest`` ---------------------------------------------

@st.composite
def random_dags(draw):
    n = draw(st.integers(1, 25))
    pairs = [(s, d) for s, d in itertools.combinations(range(n), 2)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=60)) if pairs else []
    # Small integers make ties common.
    busy = draw(st.lists(st.integers(0, 4), min_size=len(edges), max_size=len(edges)))
    times = np.cumsum(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    return n, sorted(edges), busy, times


def frames_of(n, edges, busy, times):
    states = pd.DataFrame({
        "state_id": np.arange(n), "run_id": "r", "key": [f"k{i}" for i in range(n)],
        "label": "t", "size": 0, "time": times.astype(float), "origin": "t",
        "location": "memory@w", "worker": "w", "thread": pd.array([1] * n, dtype="Int64"),
    })
    src = np.array([e[0] for e in edges], dtype="int64")
    dst = np.array([e[1] for e in edges], dtype="int64")
    mutations = pd.DataFrame({
        "mutation_id": np.arange(len(edges)), "run_id": "r", "src": src, "dst": dst,
        "kind": "MERGE", "cost": times[dst] - times[src] if len(edges) else [],
        "busy": np.array(busy, dtype=float), "start": 0.0, "stop": 0.0,
        "key": "k", "worker": "w", "thread": pd.array([1] * len(edges), dtype="Int64"),
    })
    return states, mutations


@settings(max_examples=250, deadline=None)
@given(random_dags())
def test_longest_matches_networkx(dag):
    n, edges, busy, times = dag
    pag = PAG.from_frames(*frames_of(n, edges, busy, times))
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_weighted_edges_from([(s, d, w) for (s, d), w in zip(edges, busy)], weight="busy")
    expected_path = nx.dag_longest_path(graph, weight="busy")
    expected = sum(graph[a][b]["busy"] for a, b in itertools.pairwise(expected_path))

    busy_of = pag.mutations.set_index("mutation_id")["busy"]

    def busy_along(path) -> float:
        return busy_of.loc[path.steps["mutation_id"]].sum()

    path = pag.wcp(method="longest")
    assert busy_along(path) == expected
    # The path is a real chain of mutations of the graph.
    src, dst = path.steps["src"].tolist(), path.steps["dst"].tolist()
    assert all(d == s for d, s in zip(dst, src[1:]))
    assert all((s, d) in graph.edges for s, d in zip(src, dst))

    # Between two given states: networkx on the subgraph between them.
    if edges:
        s0, d0 = edges[0]
        between = nx.descendants(graph, s0) & (nx.ancestors(graph, d0) | {d0})
        sub = graph.subgraph(between | {s0})
        best = max(
            sum(sub[a][b]["busy"] for a, b in itertools.pairwise(p))
            for p in nx.all_simple_paths(sub, s0, d0)
        )
        assert busy_along(pag.wcp(start=s0, end=d0, method="longest")) == best


@settings(max_examples=100, deadline=None)
@given(random_dags())
def test_observed_walk_takes_the_last_arrival_at_every_step(dag):
    n, edges, busy, times = dag
    pag = PAG.from_frames(*frames_of(n, edges, busy, times))
    end = int(pag.ends[0])
    path = pag.wcp()
    incoming: dict[int, list[int]] = {}
    for s, d in edges:
        incoming.setdefault(d, []).append(s)
    state = end
    walked = [end]
    while state in incoming:
        # the first of the latest sources, in mutation order
        state = max(incoming[state], key=lambda s: (times[s], -edges.index((s, walked[-1]))))
        walked.append(state)
    assert path.states["state_id"].tolist() == walked[::-1]
    assert path.length == pytest.approx(times[walked[0]] - times[walked[-1]])


def test_by_prefix_accounts_for_every_second_of_the_path():
    b = PAGBuilder()
    b.root(0.0)
    for i in range(3):  # three loads queued for one thread, then a quick sum sent late
        b.compute(f"load-{i}", W, 1, float(i), i + 1.0, 8, (), sent=0.0, runnable=0.0)
    b.compute("total", W, 1, 3.2, 4.0, 8, ("load-0", "load-1", "load-2"), label="sum",
              sent=3.1)
    b.compute("late", W, 1, 5.0, 5.2, 8, ("total",), label="tail")
    path = b.pag().wcp()
    table = path.by_prefix()
    assert table["prefix"].tolist() == ["load", "tail", "sum"]
    assert table["seconds"].sum() == pytest.approx(path.length)
    assert table["share"].sum() == pytest.approx(1.0)
    assert table.set_index("prefix")["steps"].to_dict() == {"load": 3, "tail": 1, "sum": 1}
    # The tail had no moments: its second before it is unexplained, more than its compute.
    assert table.set_index("prefix")["dominant"].to_dict() == {
        "load": "compute", "tail": "wait", "sum": "compute"}
