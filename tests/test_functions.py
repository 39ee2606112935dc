"""The code behind each task group, found on the scheduler in its first task, on real
clusters: functions of this file (called directly, nested in Dask's own, pickled by
value), Dask's own, and callables :mod:`inspect` cannot locate."""

from __future__ import annotations

import functools
import inspect
import operator
import os

import dask
import dask.array as da
import dask.dataframe as dd
import pandas as pd
from bokeh.events import DocumentReady
from dask._task_spec import Task
from distributed.utils import key_split_group
from distributed.utils_test import async_poll_for, gen_cluster
from tornado.httpclient import AsyncHTTPClient

import crux_dask
import crux_dask.plugins.functions as recorder
from crux_dask.functions import (
    BY_VALUE,
    FUNCTION_COLUMNS,
    Function,
    FunctionLog,
    code_label,
    describe,
)

DASHBOARD = {"dashboard": True, "dashboard_address": ":0"}


def double(x: int) -> int:
    return 2 * x


def doubled_frame(frame: pd.DataFrame) -> pd.DataFrame:
    return frame * 2


class Unreadable:
    """A callable whose attributes raise when :mod:`inspect` reads them."""

    def __call__(self, x: int) -> int:
        return x

    @property
    def __wrapped__(self) -> None:
        raise RuntimeError("this attribute cannot be read")


def row_of(functions: pd.DataFrame, group: str) -> pd.Series:
    (found,) = functions.index[functions["group"] == group]
    return functions.loc[found]


def first_line(function) -> int:
    return inspect.getsourcelines(function)[1]


def test_a_prefix_shows_its_first_group_of_user_code():
    log = FunctionLog()
    log.add("('clean-1', 0)", "clean", Function("dask.dataframe.core", "apply_and_enforce"))
    log.add("clean-2", "clean", describe(doubled_frame))
    log.add("clean-3", "clean", describe(double))
    log.add("data", "data")
    assert log.prefix_label("clean") == (f"{os.path.basename(__file__)}:"
                                         f"{first_line(doubled_frame)} doubled_frame")
    assert log.group_label("('clean-1', 0)") == "apply_and_enforce"
    assert log.prefix_label("data") == log.group_label("data") == ""
    assert log.frame()["group"].tolist() == ["('clean-1', 0)", "clean-2", "clean-3", "data"]
    assert dict(log.frame().dtypes.astype(str)) == FUNCTION_COLUMNS


def test_the_newest_groups_are_kept():
    log = FunctionLog(most=10)
    for i in range(25):
        log.add(f"g{i}", "g")
    assert len(log) + log.dropped == 25 and len(log) <= 10
    assert log.frame()["group"].tolist() == [f"g{i}" for i in range(25 - len(log), 25)]
    assert "g0" not in log and "g24" in log


def read_once_per_group(test):
    """``test(read, c, s, a, b)``, with ``read`` the group of each task whose function
    the scheduler read."""
    async def counted_test(c, s, a, b):
        read = []
        task_function = recorder.task_function

        def counted(run_spec):
            read.append(key_split_group(run_spec.key))
            return task_function(run_spec)

        recorder.task_function = counted
        try:
            await test(read, c, s, a, b)
        finally:
            recorder.task_function = task_function

    counted_test.__name__ = test.__name__
    return counted_test


@gen_cluster(client=True)
@read_once_per_group
async def test_a_delayed_function_of_this_file_is_found_once_per_group(read, c, s, a, b):
    await crux_dask.attach(c)
    total = dask.delayed(sum)([dask.delayed(double)(i) for i in range(200)])
    assert await c.compute(total) == 2 * sum(range(200))
    functions = await crux_dask.get_functions(c)
    assert list(functions.columns) == list(FUNCTION_COLUMNS)
    row = row_of(functions, "double")
    assert row["file"] == __file__ and row["line"] == first_line(double)
    assert (row["prefix"], row["module"], row["qualname"]) == ("double", __name__, "double")
    assert row["user"]
    summed = row_of(functions, "sum")
    assert (summed["module"], summed["qualname"], summed["user"]) == ("builtins", "sum", False)
    assert sorted(read) == sorted(functions["group"])  # one task read per group
    assert await c.compute(dask.delayed(sum)([dask.delayed(double)(i) for i in range(50)]))
    assert len(read) == len(functions)  # the groups known already are not read again
    stats = await crux_dask.get_stats(c)
    assert stats["function_groups"] == len(functions) and stats["functions_failed"] == 0


@gen_cluster(client=True)
async def test_a_function_pickled_by_value_names_its_file_and_line(c, s, a, b):
    def halve(x: int) -> float:  # defined in a function: pickled by value
        return x / 2

    await crux_dask.attach(c)
    future = c.compute(dask.delayed(halve)(4))
    assert await future == 2
    (ts,) = [ts for ts in s.tasks.values() if ts.group.name == "halve"]
    assert ts.run_spec.func.__code__.co_filename == BY_VALUE  # the scheduler's copy
    row = row_of(await crux_dask.get_functions(c), "halve")
    assert row["file"] == __file__ and row["line"] == first_line(halve) and row["user"]
    assert row["qualname"].endswith("<locals>.halve")


@gen_cluster(client=True)
async def test_map_partitions_finds_the_function_it_maps(c, s, a, b):
    await crux_dask.attach(c)
    frame = pd.DataFrame({"a": range(40)})
    mapped = dd.from_pandas(frame, npartitions=4).map_partitions(doubled_frame)
    persisted = c.persist(mapped)
    pd.testing.assert_frame_equal(await c.compute(persisted), frame * 2)
    runs = [ts.run_spec for ts in s.tasks.values() if ts.prefix.name == "doubled_frame"
            and isinstance(ts.run_spec, Task)]
    assert runs and all(run.func.__module__.startswith("dask.") for run in runs)  # nested
    functions = await crux_dask.get_functions(c)
    mapping = functions[functions["prefix"] == "doubled_frame"]
    (row,) = mapping[mapping["qualname"] != ""].itertuples()  # the others alias its tasks
    assert (row.module, row.qualname, row.file, row.line, row.user) == (
        __name__, "doubled_frame", __file__, first_line(doubled_frame), True)


@gen_cluster(client=True)
async def test_an_array_reduction_runs_only_library_code(c, s, a, b):
    await crux_dask.attach(c)
    assert await c.compute(da.ones((40, 40), chunks=10).sum()) == 1600
    functions = await crux_dask.get_functions(c)
    assert len(functions) >= 2 and not functions["user"].any()
    named = functions[functions["qualname"] != ""]
    assert len(named) and named["module"].str.split(".").str[0].isin(["dask", "numpy"]).all()
    assert (await crux_dask.get_stats(c))["functions_failed"] == 0


@gen_cluster(client=True)
async def test_callables_inspect_cannot_locate_give_rows_without_a_file(c, s, a, b):
    await crux_dask.attach(c)
    made = {"__name__": "generated"}
    exec("increment = lambda x: x + 1", made)
    tasks = {"largest": dask.delayed(max)(3, 4, dask_key_name="largest"),
             "partial-add": dask.delayed(functools.partial(operator.add, 1))(
                 2, dask_key_name="partial-add"),
             "made-by-exec": dask.delayed(made["increment"])(5, dask_key_name="made-by-exec")}
    assert await c.gather(c.compute(list(tasks.values()))) == [4, 3, 6]
    functions = await crux_dask.get_functions(c)
    rows = {group: row_of(functions, group) for group in tasks}
    assert {group: row["qualname"] for group, row in rows.items()} == {
        "largest": "max", "partial-add": "add", "made-by-exec": "<lambda>"}
    assert all(row["file"] == "" and row["line"] == 0 for row in rows.values())
    assert rows["made-by-exec"]["module"] == "generated" and rows["made-by-exec"]["user"]
    assert (await crux_dask.get_stats(c))["functions_failed"] == 0
    # A callable whose attributes raise: counted, its group kept without a function.
    assert await c.compute(dask.delayed(Unreadable())(7, dask_key_name="unreadable")) == 7
    row = row_of(await crux_dask.get_functions(c), "unreadable")
    assert (row["module"], row["qualname"], row["file"], row["user"]) == ("", "", "", False)
    assert (await crux_dask.get_stats(c))["functions_failed"] == 1


async def shown(s, route: str, name: str):
    """The model ``name`` of the page at ``route``, in the document of its session."""
    response = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{s.http_server.port}{route}")
    assert response.code == 200
    (server,) = [app for app in s.http_application.applications
                 if route in getattr(app, "app_paths", ())]
    session = server.get_sessions(route)[-1]
    document = session.document
    await session.with_document_locked(document.callbacks.trigger_event, DocumentReady())
    await async_poll_for(lambda: document.get_model_by_name(name) is not None, timeout=10)
    return document.get_model_by_name(name)


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD)
async def test_the_dashboard_shows_the_code_behind_prefixes_and_steps(c, s, a, b):
    await crux_dask.attach(c)
    chain = dask.delayed(double)(1, dask_key_name=("double", 0))
    for i in range(1, 4):
        chain = dask.delayed(double)(chain, dask_key_name=("double", i))
    assert await c.compute(chain) == 16
    await crux_dask.flush(c)
    label = f"{os.path.basename(__file__)}:{first_line(double)} double"
    assert code_label(describe(double)) == label
    prefixes = await shown(s, "/individual-crux-prefixes", "crux-prefixes")
    await async_poll_for(lambda: "double" in prefixes.source.data["prefix"], timeout=10)
    data = prefixes.source.data
    assert data["code"][list(data["prefix"]).index("double")] == label
    steps = await shown(s, "/individual-crux-steps", "crux-steps")
    await async_poll_for(lambda: "double" in list(steps.source.data["key_group"]), timeout=10)
    (key,) = [column for column in steps.columns if column.field == "key"]
    assert f'{{"double": "{label}"}}' in key.formatter.template


def test_a_recorded_run_s_reports_show_the_code_behind_its_prefixes(crux_client, tmp_path):
    # The CLI's report of the exported run, and the HTML report of the live one: the
    # prefix double's code is this file's function, as inspect locates it.
    from click.testing import CliRunner

    from crux_dask.cli import main
    from crux_dask.dashboard.report import report_html

    chain = dask.delayed(double)(1, dask_key_name=("double", 0))
    for i in range(1, 4):
        chain = dask.delayed(double)(chain, dask_key_name=("double", i))
    assert dask.compute(chain)[0] == 16
    label = f"{os.path.basename(__file__)}:{inspect.getsourcelines(double)[1]} double"
    path = crux_dask.export_parquet(crux_client, tmp_path / "runs")
    done = CliRunner().invoke(main, ["report", str(path)])
    assert done.exit_code == 0, done.output
    table = done.output.split("by prefix:\n")[1].split("\n\n")[0].splitlines()
    assert table[0].split()[-1] == "code"
    (row,) = [line for line in table if line.split()[:1] == ["double"]]
    assert row.endswith(label)
    html = report_html(crux_dask.get_pag(crux_client),
                       functions=crux_dask.get_functions(crux_client))
    assert f'"{label}"' in html  # in the by-prefix table's data
    assert f'"{label}"' not in report_html(crux_dask.get_pag(crux_client))


def test_the_table_is_exported_and_read_back_unchanged(crux_client, tmp_path):
    client = crux_client
    frame = pd.DataFrame({"a": range(40)})
    mapped = dd.from_pandas(frame, npartitions=4).map_partitions(doubled_frame)
    total = dask.delayed(sum)([dask.delayed(double)(i) for i in range(10)])
    assert dask.compute(total)[0] == 90
    pd.testing.assert_frame_equal(mapped.compute(), frame * 2)
    functions = crux_dask.get_functions(client)
    assert {"double", "sum"} <= set(functions["group"])
    assert set(functions.loc[functions["user"], "qualname"]) == {"double", "doubled_frame"}
    path = crux_dask.export_parquet(client, tmp_path / "runs")
    pd.testing.assert_frame_equal(crux_dask.read_functions(path), functions)
    # A dataset written before the table: it reads as empty.
    for table in (path / "functions.parquet").iterdir():
        for part in table.iterdir():
            part.unlink()
        table.rmdir()
    empty = crux_dask.read_functions(path)
    assert empty.empty and dict(empty.dtypes.astype(str)) == FUNCTION_COLUMNS
