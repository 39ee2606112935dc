"""PAG snapshots: the data-model columns, and frames that round-trip."""

from __future__ import annotations

import pandas as pd
import pytest

from crux_dask import PAG, PAGBuilder
from crux_dask.model import MUTATION_COLUMNS, STATE_COLUMNS

A, B = "tcp://127.0.0.1:1001", "tcp://127.0.0.1:1002"


def small_workflow() -> PAGBuilder:
    b = PAGBuilder()
    b.root(100.0)
    b.compute("('load-1', 0)", A, 11, 100.1, 100.5, 1000, (), label="load")
    b.compute("('load-1', 1)", B, 12, 100.1, 100.3, 1000, (), label="load")
    b.transfer("('load-1', 1)", f"memory@{B}", f"memory@{A}", 100.6, 100.7)
    b.compute("sum-1", A, 11, 100.7, 101.0, 8, ("('load-1', 0)", "('load-1', 1)"), label="sum")
    b.delete("('load-1', 1)", f"memory@{B}", 101.1)
    return b


def test_tables_have_exactly_the_design_columns():
    pag = small_workflow().pag()
    assert dict(pag.states.dtypes.astype(str)) == {
        c: ("str" if t == "str" else t) for c, t in STATE_COLUMNS.items()}
    assert list(pag.mutations.columns) == list(MUTATION_COLUMNS)
    assert str(pag.mutations["thread"].dtype) == "Int64"
    assert pag.states["run_id"].nunique() == 1
    root = pag.states.iloc[0]
    assert root["location"] == "root" and pd.isna(root["worker"]) and pd.isna(root["thread"])


def test_cost_telescopes_along_any_path():
    pag = small_workflow().pag()
    path = pag.wcp()
    assert path.steps["cost"].sum() == pytest.approx(path.length)
    # load 1 finished first and was fetched only once sum could run, after load 0:
    # load 0 is what sum waited for.
    assert path.states["key"].tolist() == ["root", "('load-1', 0)", "sum-1"]


def test_frames_round_trip_to_the_same_graph_and_path():
    pag = small_workflow().pag()
    again = PAG.from_frames(pag.states, pag.mutations)
    pd.testing.assert_frame_equal(again.states, pag.states)
    pd.testing.assert_frame_equal(again.mutations, pag.mutations)
    for method in ("observed", "longest"):
        pd.testing.assert_frame_equal(again.wcp(method=method).states,
                                      pag.wcp(method=method).states)


def test_several_runs_in_one_set_of_frames():
    first, second = small_workflow().pag(), small_workflow().pag()
    pag = PAG.from_frames(pd.concat([first.states, second.states]),
                          pd.concat([first.mutations, second.mutations]))
    assert pag.run_ids == [first.run_ids[0], second.run_ids[0]]
    assert len(pag) == len(first) * 2
    assert pag.wcp(run_id=first.run_ids[0]).length == pytest.approx(first.wcp().length)
    with pytest.raises(ValueError, match="no run 'nope'"):
        pag.wcp(run_id="nope")


@pytest.mark.parametrize("damage, message", [
    (lambda s, m: (s.drop(columns="time"), m), "lacks columns"),
    (lambda s, m: (s.assign(state_id=s["state_id"] + 5), m), "state ids must be"),
    (lambda s, m: (s, m.assign(src=m["dst"])), "lower to a higher"),
    (lambda s, m: (s, m.assign(dst=99)), "does not exist"),
    (lambda s, m: (s, m.assign(kind="TELEPORT")), "unknown mutation kind"),
])
def test_inconsistent_frames_are_refused(damage, message):
    pag = small_workflow().pag()
    with pytest.raises(ValueError, match=message):
        PAG.from_frames(*damage(pag.states, pag.mutations))
