"""TPC-H queries over ``dd.read_parquet`` data generated here: where their paths' time went.

The data is the TPC-H generator's (scale 0.05, eight files per table); the
queries are written from the TPC-H specification (:mod:`tpch`).
"""

from __future__ import annotations

import pytest
from test_causes import check_breakdown, check_stages
from tpch import QUERIES, generate

import crux_dask

#: Rows of each query's answer: Q1's four flag and status pairs, Q3's ten orders, Q5's
#: five nations of ASIA.
ROWS = {"q1": 4, "q3": 10, "q5": 5}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("tpch"))


@pytest.mark.parametrize("name", list(QUERIES))
def test_a_tpch_query_s_path_is_explained_stage_by_stage(crux_client, data, name):
    answer = QUERIES[name](data).compute()
    assert len(answer) == ROWS[name]
    path = crux_dask.get_wcp(crux_client)
    check_breakdown(path)
    check_stages(crux_dask.get_pag(crux_client), path)
    steps = path.to_frame()
    # The path starts where the query's graph reached the scheduler, with reading files.
    assert (steps["category"] == "io").any()
    assert path.breakdown["wait"] + path.breakdown["scheduling"] <= 0.1 * path.length, \
        path.summary()
