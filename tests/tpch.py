"""TPC-H data generated here with ``tpchgen-cli``, and queries written from the TPC-H
specification with ``dask.dataframe`` over ``dd.read_parquet``.

Prices, quantities and discounts are decimals in the generated files; the
queries compute with them as floats, as a user of pandas would.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
import sys
from pathlib import Path

import dask.dataframe as dd

__all__ = ["QUERIES", "generate", "q1", "q3", "q5"]

_MONEY = ("l_quantity", "l_extendedprice", "l_discount", "l_tax")


def generate(directory: Path, scale: float = 0.05, parts: int = 8) -> Path:
    """Every table at ``scale`` in ``parts`` Parquet files each, under ``directory``."""
    tool = shutil.which("tpchgen-cli") or str(Path(sys.executable).with_name("tpchgen-cli"))
    subprocess.run([tool, "parquet", "-s", str(scale), f"--parts={parts}",
                    f"--output-dir={directory}"], check=True, capture_output=True, timeout=300)
    return directory


def _lineitem(data: Path, columns: list[str]) -> dd.DataFrame:
    frame = dd.read_parquet(data / "lineitem", columns=columns)
    money = [c for c in columns if c in _MONEY]
    return frame.astype(dict.fromkeys(money, "float64")) if money else frame


def q1(data: Path) -> dd.DataFrame:
    """Pricing summary report: lineitems shipped by 90 days before 1998-12-01."""
    items = _lineitem(data, ["l_returnflag", "l_linestatus", "l_shipdate", *_MONEY])
    items = items[items.l_shipdate <= datetime.date(1998, 9, 2)]
    items = items.assign(disc_price=items.l_extendedprice * (1 - items.l_discount))
    items = items.assign(charge=items.disc_price * (1 + items.l_tax))
    return items.groupby(["l_returnflag", "l_linestatus"]).agg(
        sum_qty=("l_quantity", "sum"), sum_base_price=("l_extendedprice", "sum"),
        sum_disc_price=("disc_price", "sum"), sum_charge=("charge", "sum"),
        avg_qty=("l_quantity", "mean"), avg_price=("l_extendedprice", "mean"),
        avg_disc=("l_discount", "mean"), count_order=("l_quantity", "count"),
    ).reset_index().sort_values(["l_returnflag", "l_linestatus"])


def q3(data: Path) -> dd.DataFrame:
    """Shipping priority: the ten unshipped orders of the BUILDING segment of most revenue."""
    day = datetime.date(1995, 3, 15)
    customers = dd.read_parquet(data / "customer", columns=["c_custkey", "c_mktsegment"])
    customers = customers[customers.c_mktsegment == "BUILDING"]
    orders = dd.read_parquet(data / "orders", columns=[
        "o_orderkey", "o_custkey", "o_orderdate", "o_shippriority"])
    orders = orders[orders.o_orderdate < day]
    items = _lineitem(data, ["l_orderkey", "l_extendedprice", "l_discount", "l_shipdate"])
    items = items[items.l_shipdate > day]
    joined = customers.merge(orders, left_on="c_custkey", right_on="o_custkey").merge(
        items, left_on="o_orderkey", right_on="l_orderkey")
    joined = joined.assign(revenue=joined.l_extendedprice * (1 - joined.l_discount))
    return joined.groupby(["l_orderkey", "o_orderdate", "o_shippriority"]).revenue.sum(
    ).reset_index().nlargest(10, "revenue")


def q5(data: Path) -> dd.DataFrame:
    """Local supplier volume: revenue in 1994 of ASIA's nations, from local suppliers."""
    region = dd.read_parquet(data / "region", columns=["r_regionkey", "r_name"])
    region = region[region.r_name == "ASIA"]
    nation = dd.read_parquet(data / "nation", columns=["n_nationkey", "n_regionkey", "n_name"])
    customer = dd.read_parquet(data / "customer", columns=["c_custkey", "c_nationkey"])
    orders = dd.read_parquet(data / "orders", columns=["o_orderkey", "o_custkey",
                                                       "o_orderdate"])
    orders = orders[(orders.o_orderdate >= datetime.date(1994, 1, 1))
                    & (orders.o_orderdate < datetime.date(1995, 1, 1))]
    items = _lineitem(data, ["l_orderkey", "l_suppkey", "l_extendedprice", "l_discount"])
    supplier = dd.read_parquet(data / "supplier", columns=["s_suppkey", "s_nationkey"])
    joined = (region.merge(nation, left_on="r_regionkey", right_on="n_regionkey")
              .merge(customer, left_on="n_nationkey", right_on="c_nationkey")
              .merge(orders, left_on="c_custkey", right_on="o_custkey")
              .merge(items, left_on="o_orderkey", right_on="l_orderkey")
              .merge(supplier, left_on=["l_suppkey", "n_nationkey"],
                     right_on=["s_suppkey", "s_nationkey"]))
    joined = joined.assign(revenue=joined.l_extendedprice * (1 - joined.l_discount))
    return joined.groupby("n_name").revenue.sum().reset_index().sort_values(
        "revenue", ascending=False)


QUERIES = {"q1": q1, "q3": q3, "q5": q5}
