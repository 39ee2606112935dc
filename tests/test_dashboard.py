"""The Crux tab, its components, the JSON API and the standalone report."""

from __future__ import annotations

import contextlib
import functools
import html
import json
import os
import shutil
import threading
import time
from itertools import pairwise

import dask
import numpy as np
import pandas as pd
import pytest
from bokeh.document import Document
from bokeh.document.events import ColumnsStreamedEvent
from bokeh.layouts import column as bokeh_column
from bokeh.models import ColumnDataSource, DataTable
from bokeh.server.callbacks import NextTickCallback
from distributed.utils_test import async_poll_for, gen_cluster
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

import crux_dask
from crux_dask import PAGBuilder
from crux_dask.advice import SCALING_SHAPES
from crux_dask.dashboard.breakdown import Breakdown
from crux_dask.dashboard.data import live_source, static_source
from crux_dask.dashboard.off_loop import OffLoop
from crux_dask.dashboard.overview import CATEGORY_COLORS, OFF_PATH, PAGOverview, _states_of
from crux_dask.dashboard.pieces import hold_back, release, set_in_pieces, text
from crux_dask.dashboard.prefixes import PrefixTable
from crux_dask.dashboard.report import report_html
from crux_dask.dashboard.steps import StepsTable, steps_columns
from crux_dask.dashboard.suggestions import SuggestionTable, _suggestions, _suggestions_apart
from crux_dask.dashboard.timeline import WCPTimeline
from crux_dask.load import LoadLog, load_frame

from workloads import chain

DASHBOARD = {"dashboard": True, "dashboard_address": ":0"}


def diamond():
    def work(x, seconds):
        time.sleep(seconds)
        return x + 1

    top = dask.delayed(work)(1, 0.01, dask_key_name="top")
    left = dask.delayed(work)(top, 0.2, dask_key_name="left")
    right = dask.delayed(work)(top, 0.01, dask_key_name="right")
    return dask.delayed(sum)([left, right], dask_key_name="bottom")


async def fetch(s, path: str):
    url = f"http://127.0.0.1:{s.http_server.port}{path}"
    try:
        response = await AsyncHTTPClient().fetch(url)
        return response.code, response.body.decode()
    except HTTPClientError as error:
        return error.code, error.response.body.decode() if error.response else ""


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD)
async def test_pages_answer_and_the_tab_is_listed(c, s, a, b):
    await crux_dask.attach(c)
    await c.compute(diamond())
    for path in ["/crux", "/individual-crux-timeline", "/individual-crux-breakdown",
                 "/individual-crux-steps", "/individual-crux-overview",
                 "/individual-crux-prefixes", "/individual-crux-suggestions"]:
        code, _ = await fetch(s, path)
        assert code == 200, path
    code, status = await fetch(s, "/status")
    status = status.replace("'", '"')
    assert code == 200 and 'href="crux"' in status
    assert "individual-crux-timeline" in status  # under "More..."
    # What JupyterLab's Dask extension lists: distributed's pages and ours.
    code, plots = await fetch(s, "/individual-plots.json")
    plots = json.loads(plots)
    assert plots["Individual Crux Timeline"] == "/individual-crux-timeline"
    assert plots["Individual Crux Overview"] == "/individual-crux-overview"
    assert plots["Individual Crux Prefixes"] == "/individual-crux-prefixes"
    assert plots["Individual Task Stream"] == "/individual-task-stream"
    for route in plots.values():
        code, _ = await fetch(s, route)
        assert code == 200, route


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD, config={"crux-dask.graph-process": False})
async def test_a_page_is_made_in_a_thread_and_shown_in_stages(c, s, a, b):
    """The page's components are made off the event loop; the document gets them one
    at a time once its client says it shows the rest (here no browser says so: the
    event BokehJS sends is triggered as the server would on its message).  Without a
    graph process, the scheduler serves the pages itself."""
    from bokeh.events import DocumentReady

    from crux_dask.dashboard import pages, showing

    made_in, in_order = [], []
    crux_layout, at_the_latest = pages.crux_layout, showing.STAGES_AT_THE_LATEST

    def recorded_layout(data):
        made_in.append(threading.current_thread())
        updaters, layout = crux_layout(data)
        in_order.extend(layout.children)
        return updaters, layout

    pages.crux_layout, showing.STAGES_AT_THE_LATEST = recorded_layout, 600_000
    try:
        await crux_dask.attach(c)
        await c.compute(diamond())
        code, _ = await fetch(s, "/crux")
    finally:
        pages.crux_layout, showing.STAGES_AT_THE_LATEST = crux_layout, at_the_latest
    assert code == 200
    assert len(made_in) == 1 and made_in[0] is not threading.current_thread()
    (server,) = [app for app in s.http_application.applications
                 if "/crux" in getattr(app, "app_paths", ())]
    (session,) = server.get_sessions("/crux")
    document = session.document
    _, body = document.roots[0].children
    assert body.children == []  # nothing but the selectors before the page is shown
    assert document.get_model_by_name("crux-run") is not None
    shown = []  # the page's parts after each change of the body's
    document.on_change(lambda event: shown.append(list(body.children)))
    await session.with_document_locked(document.callbacks.trigger_event, DocumentReady())
    # Bokeh 3.10 changes the document in a thread: wait for the change to be announced.
    await async_poll_for(lambda: shown and len(shown[-1]) == 5, timeout=10)
    assert list(body.children) == in_order  # each part at its place on the page
    added = [next(part for part in now if part not in before)
             for before, now in pairwise([[], *shown]) if len(now) > len(before)]
    sizes = [len(part.references()) for part in added]
    assert len(added) == 5 and sizes == sorted(sizes, reverse=True)  # the largest first
    names = {model.name for part in body.children for model in part.references()}
    assert {"crux-breakdown", "crux-prefixes", "crux-steps", "crux-timeline-bars",
            "crux-overview", "crux-suggestions"} <= names


@gen_cluster(client=True, nthreads=[("127.0.0.1", 2)] * 2)
async def test_components_show_the_critical_path(c, s, a, b):
    await crux_dask.attach(c)
    result = c.compute(diamond())  # held: no release reaches the graph between the updates
    await result
    path = await crux_dask.get_wcp(c)
    data = live_source(s.plugins["crux"])
    timeline, breakdown, steps, overview = components = (
        WCPTimeline(data), Breakdown(data), StepsTable(data), PAGOverview(data))
    driver = OffLoop(data, list(components))  # computed where the graph is
    driver.update()
    await async_poll_for(lambda: not driver.busy(), 10)
    driver.update()
    for component in components:
        columns = component.source.data
        assert len({len(v) for v in columns.values()}) == 1, type(component).__name__
    assert list(timeline.source.data["key"]) == path.steps["key"].tolist()
    assert list(steps.source.data["kind"]) == path.steps["kind"].tolist()
    assert dict(zip(breakdown.source.data["category"], breakdown.source.data["seconds"])) \
        == pytest.approx(path.breakdown)
    nodes = overview.source.data
    on_path = {label for label, seconds in zip(nodes["label"], nodes["on_path"]) if seconds}
    assert "left" in on_path and "right" not in on_path
    assert nodes["color"][nodes["label"].index("right")] == OFF_PATH
    left = nodes["label"].index("left")
    assert nodes["on_path"][left] >= 0.2  # its task sleeps 0.2 s on the path
    assert nodes["color"][left] == CATEGORY_COLORS[nodes["dominant"][left]]
    # Drill down: a group's individual states.
    group = overview.source.data["group"][overview.source.data["label"].index("left")]
    states = await s.plugins["crux"].analyse(_states_of, overview.fold, group)
    assert set(states["key"]) == {"left"}  # computed, then released (its tombstone)

    before = timeline.source.data
    driver.update()  # nothing changed: nothing computed, no new column dict is sent
    assert not driver.busy() and timeline.source.data is before
    del result


async def settled(driver: OffLoop) -> None:
    """Let ``driver`` compute where the graph is, and show what it computed."""
    driver.update()
    await async_poll_for(lambda: not driver.busy(), 10)
    driver.update()


def _steps_and_where(view):
    """What a steps table shows of ``view``, and the process and store it read."""
    return os.getpid(), id(view.store), steps_columns(view)


class WhereSteps(StepsTable):
    """A steps table that notes where each of its computations ran."""

    computer = staticmethod(_steps_and_where)

    def __init__(self, data):
        super().__init__(data)
        self.computed = []

    def show(self, computed):
        pid, store, columns = computed
        self.computed.append((pid, store))
        super().show(columns)


@pytest.mark.parametrize("apart", [True, False])
def test_live_pages_compute_off_the_event_loop(apart):
    """A live page's components compute where the graph is built: in its own process, or,
    without one, in a thread on a copy of the graph as it was; either way they show the
    same as components rendered at once, and a click on a group reads its states there."""

    @gen_cluster(client=True, nthreads=[("127.0.0.1", 2)] * 2,
                 config={"crux-dask.graph-process": apart})
    async def run(c, s, a, b):
        await crux_dask.attach(c)
        plugin = s.plugins["crux"]
        assert plugin.host.apart is apart
        result = c.compute(diamond())  # held: nothing is released while the test runs
        await result
        await crux_dask.get_wcp(c)  # every event applied
        data = live_source(plugin)
        steps, overview = WhereSteps(data), PAGOverview(data)
        driver = OffLoop(data, [steps, overview])
        driver.update()
        assert list(steps.source.data["kind"]) == [] and overview.source.data["label"] == []
        await async_poll_for(lambda: not driver.busy(), 10)
        driver.update()
        (pid, seen), = steps.computed
        if apart:
            assert pid == plugin.host.remote["pid"] != os.getpid()
        else:
            assert pid == os.getpid() and seen != id(plugin.host.builder.store)
        # The same as components rendered at once, on the graph the client gets.
        pag = await crux_dask.get_pag(c)
        while steps._version[1] != len(pag.states):  # an event came late: show it too
            await settled(driver)
            pag = await crux_dask.get_pag(c)
        computed = len(steps.computed)
        fetched = static_source(pag)
        at_once_steps, at_once_overview = StepsTable(fetched), PAGOverview(fetched)
        at_once_steps.update()
        at_once_overview.update()
        for column, values in at_once_steps.source.data.items():
            assert np.array_equal(steps.source.data[column], values), column
        assert overview.source.data == at_once_overview.source.data
        assert overview.edges.data == at_once_overview.edges.data
        # A click on a group: its states, read where the graph is.
        overview.source.selected.indices = [overview.source.data["label"].index("left")]
        await async_poll_for(lambda: overview.details.data["key"], 10)
        assert set(overview.details.data["key"]) == {"left"}
        driver.update()  # nothing changed: nothing computed again
        assert not driver.busy() and len(steps.computed) == computed
        later = c.compute(dask.delayed(time.sleep)(0.05, dask_key_name="later"))
        await later
        await crux_dask.get_wcp(c)
        driver.update()
        await async_poll_for(lambda: not driver.busy(), 10)
        driver.update()
        assert len(steps.computed) == computed + 1 and "later" in steps.source.data["key"]
        del result, later

    run()


def test_the_live_replay_runs_in_a_process_of_its_own():
    """The same table as a replay in this process, or the same error; a process that
    dies gives a clear error, not a hang."""
    b = PAGBuilder()
    b.root(0.0)
    for i, (worker, seconds) in enumerate([("a", 0.5), ("a", 0.5), ("b", 0.1)]):
        b.compute(f"work-{i}", f"tcp://{worker}:1", 1, 1.0 + i, 1.0 + i + seconds, 8)
    store, end = b.store, b.end
    log = LoadLog()
    log.add("scheduler", 1.5, 0.99, 0.2)
    load = log.columns()  # travels with the graph
    expected, expected_shapes = _suggestions(store, end, load)
    replayed, shapes = _suggestions_apart(store.to_pieces(), end, load)
    pd.testing.assert_frame_equal(replayed, expected)
    pd.testing.assert_frame_equal(shapes.table, expected_shapes.table)
    assert shapes.summary() == expected_shapes.summary()
    with pytest.raises(ValueError, match="no task"):
        _suggestions_apart(PAGBuilder().store.to_pieces(), -1, None)
    with pytest.raises(RuntimeError, match="without an answer"):
        _suggestions_apart(store.to_pieces(), "not a state", None)


@pytest.mark.parametrize("apart", [True, False])
def test_what_to_fix_replays_between_computations_off_the_event_loop(apart):
    """The live table replays once the graph stopped changing, in a process of its own,
    like suggest; the graph is cut where it is built (in its process, or in a thread)."""

    @gen_cluster(client=True, nthreads=[("127.0.0.1", 2)] * 2,
                 config={"crux-dask.graph-process": apart})
    async def run(c, s, a, b):
        await crux_dask.attach(c)
        assert s.plugins["crux"].host.apart is apart
        result = c.compute(diamond())  # held: nothing is released while the test runs
        await result
        recorded = await crux_dask.get_pag(c)  # every event applied
        expected, expected_states = recorded.suggest(), recorded.states
        table = SuggestionTable(live_source(s.plugins["crux"]))
        table.update()  # first sight of the graph: it may still be changing
        assert table._running is None and table.source.data["change"] == []
        table.update()  # unchanged since: replay it
        graph, replay = table._running
        assert graph[1] == s.plugins["crux"].progress().n_states == len(expected_states)
        await async_poll_for(replay.done, 30)
        table.update()
        # The changes replayed; the advice, from the load sampled until then, before them.
        shown = pd.DataFrame(table.source.data)
        replayed, expected = (t[t["kind"] == "what-if"].reset_index(drop=True)
                              for t in (shown, expected))
        assert shown["kind"].tolist() == sorted(shown["kind"])  # advice first
        assert replayed["change"].tolist() == expected["change"].tolist()
        # To a tenth of a millisecond: a change that saves almost nothing replays its few
        # microseconds from the load sampled until then (2.90e-5 against 2.80e-5 s once).
        assert replayed["saved"].tolist() == pytest.approx(expected["saved"].tolist(),
                                                           abs=1e-4)
        assert "left" in replayed["path_then"][0]  # the slow task stays on the path
        assert "unchanged replay" in table.note.text
        # How many workers are enough: each shape's prediction drawn as the PAG predicts it.
        # (With the load the replay read and the samples since, which may move a host's
        # background by a little.)
        view = live_source(s.plugins["crux"])()
        scaling = recorded.scaling(*SCALING_SHAPES, load=load_frame(
            None if view.load is None else view.load()))
        for threads, line in table.scaling.lines.items():
            shapes = scaling.table[scaling.table["threads"] == threads]
            assert line.data["workers"] == shapes["workers"].tolist() == list(
                SCALING_SHAPES[0])
            assert line.data["predicted"] == pytest.approx(shapes["predicted"].tolist(),
                                                           rel=1e-3)
            assert line.data["total"] == (shapes["workers"] * threads).tolist()
        enough = scaling.table[scaling.table["enough"]]
        assert table.scaling.enough.data["workers"] == enough["workers"].tolist()
        assert table.scaling.recorded.location == pytest.approx(scaling.recorded)
        named = scaling.summary().split(":")[0]  # "2 workers × 1 thread are enough"
        assert table.scaling.note.text.startswith(html.escape(named) + ":")
        # Another computation: its states come after every state the table saw (waiting
        # for any new state could find one of the first computation's, arrived late).
        await c.compute(dask.delayed(time.sleep)(0.05, dask_key_name="later"))
        await crux_dask.flush(c)
        assert "later" in set((await crux_dask.get_pag(c)).states["key"])
        before = table.source.data
        table.update()  # the graph changed: not replayed until it is quiet again
        assert table._running is None and table.source.data is before
        del result

    run()


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD, nthreads=[("127.0.0.1", 2)] * 2)
async def test_path_selection_between_two_states(c, s, a, b):
    from crux_dask.dashboard.data import PathSelection, selected_source
    from crux_dask.dashboard.selectors import SelectionCheck, path_controls

    await crux_dask.attach(c)
    await c.compute(diamond())
    pag = await crux_dask.get_pag(c)
    computed = pag.states[pag.states["thread"].notna()]
    ids = dict(zip(computed["key"], computed["state_id"]))
    selection = PathSelection()
    data = selected_source(live_source(s.plugins["crux"]), selection)
    steps = StepsTable(data)
    driver = OffLoop(data, [steps])
    check = SelectionCheck(data, selection, [driver])
    start, end, method, message = path_controls(check).children

    async def checked() -> None:  # found off the event loop, then applied
        await async_poll_for(lambda: not check.busy(), 10)
        check.update()
        await settled(driver)

    start.value = str(ids["top"])
    await checked()
    end.value = str(ids["right"])
    assert selection.end is None  # not before its path is found
    await checked()
    assert list(steps.source.data["key"]) == ["right"] and message.text == ""
    method.value = "longest"
    await checked()
    assert selection.method == "longest"
    end.value = "not a number"
    assert "must be a state id" in message.text
    assert selection.end == ids["right"]  # a bad entry leaves the page as it was
    end.value = str(ids["left"])
    await checked()
    assert list(steps.source.data["key"]) == ["left"]
    start.value = str(ids["right"])  # the left branch does not descend from the right
    await checked()
    assert "does not descend" in message.text
    assert (selection.start, selection.end) == (ids["top"], ids["left"])
    assert list(steps.source.data["key"]) == ["left"]


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD, nthreads=[("127.0.0.1", 2)] * 2)
async def test_scope_selector_shows_the_path_of_one_computation(c, s, a, b):
    import distributed

    from crux_dask.dashboard.data import PathSelection, selected_source
    from crux_dask.dashboard.selectors import ScopeSelector, SelectionCheck
    from crux_dask.scopes import Scope

    await crux_dask.attach(c)
    with distributed.span("first"):
        await c.compute(diamond())
    with distributed.span("second"):
        await c.compute(dask.delayed(sum)([dask.delayed(len)("ab", dask_key_name="two")],
                                          dask_key_name="again"))
    await crux_dask.flush(c)
    selection = PathSelection()
    data = selected_source(live_source(s.plugins["crux"]), selection)
    steps = StepsTable(data)
    driver = OffLoop(data, [steps])
    await settled(driver)
    check = SelectionCheck(data, selection, [driver])
    selector = ScopeSelector(s.plugins["crux"], check)
    selector.update()  # the page's first update lists them, on the event loop

    async def checked() -> None:  # found off the event loop, then applied
        await async_poll_for(lambda: not check.busy(), 10)
        check.update()
        await settled(driver)

    labels = dict(selector.select.options)
    assert {"span: first", "span: second"} <= set(labels.values())
    whole = list(steps.source.data["key"])
    for name in ("first", "second"):
        value = next(v for v, label in labels.items() if label == f"span: {name}")
        selector.select.value = value
        await checked()
        expected = await crux_dask.get_wcp(c, span=name)
        assert list(steps.source.data["key"]) == expected.to_frame()["key"].tolist()
        assert set(steps.source.data["scope"]) <= {"this", "another"}
        assert selector.message.text == ""
    assert list(steps.source.data["key"]) != whole
    selector.select.value = ""
    await checked()
    assert list(steps.source.data["key"]) == whole and set(steps.source.data["scope"]) == {""}
    # A choice with no state in the graph shown says so and changes nothing.
    selector.scopes["nowhere"] = Scope("span", "x", "nowhere", 0.0, 1.0, frozenset({"nope"}))
    selector.select.value = "nowhere"
    await checked()
    assert "no state of the graph belongs" in selector.message.text
    assert selection.scope is None and list(steps.source.data["key"]) == whole


def run_next_ticks(doc) -> int:
    """Run a document's next-tick callbacks as a Bokeh server would, until none is left."""
    ran = 0
    while pending := [cb for cb in doc.session_callbacks if isinstance(cb, NextTickCallback)]:
        for callback in pending:
            callback.callback()  # a one-shot callback: it removes itself
            ran += 1
    return ran


def test_a_long_source_reaches_the_document_in_pieces_in_order():
    """The first row at once, then at most a piece a turn; a newer setting stops the pieces
    of an older one; text is sent as string arrays and kept as objects."""
    doc = Document()
    source = ColumnDataSource({"key": [], "seconds": []})
    doc.add_root(source)
    sent = []
    doc.on_change(lambda event: sent.append(event))
    data = {"key": text(f"k{i}" for i in range(7)), "seconds": np.arange(7.0)}
    set_in_pieces(source, data, piece=3)
    assert list(source.data["key"]) == ["k0"]
    assert run_next_ticks(doc) == 2  # rows 1-3, then 4-6
    streamed = [event for event in sent if isinstance(event, ColumnsStreamedEvent)]
    assert [list(event.data["key"]) for event in streamed] == [["k1", "k2", "k3"],
                                                               ["k4", "k5", "k6"]]
    assert all(event.data["key"].dtype.kind == "U" for event in streamed)
    assert list(source.data["key"]) == [f"k{i}" for i in range(7)]
    assert source.data["key"].dtype == object
    assert np.array_equal(source.data["seconds"], np.arange(7.0))

    set_in_pieces(source, data, piece=3)
    newer = {"key": text(["new"] * 5), "seconds": np.zeros(5)}
    set_in_pieces(source, newer, piece=3)  # before a piece of the older one went out
    run_next_ticks(doc)
    assert list(source.data["key"]) == ["new"] * 5

    # A part added to a page goes without its long sources; they follow in pieces.
    part = bokeh_column(DataTable(source=ColumnDataSource(data)),
                        DataTable(source=ColumnDataSource({"key": text(["short"])})))
    long, short = (table.source for table in part.children)
    hold_back([long, short], piece=3)
    assert len(long.data["key"]) == 0 and list(short.data["key"]) == ["short"]
    release([long, short], piece=3)  # in no document yet: still held
    assert len(long.data["key"]) == 0
    doc.add_root(part)
    release([long, short], piece=3)
    assert list(long.data["key"]) == ["k0"]
    run_next_ticks(doc)
    assert list(long.data["key"]) == list(data["key"])
    # Newer data set while it was held wins over what was held.
    other = bokeh_column(DataTable(source=ColumnDataSource(data)))
    (table,) = other.children
    hold_back([table.source], piece=3)
    set_in_pieces(table.source, {"key": text(["newer"]), "seconds": np.ones(1)})
    doc.add_root(other)
    release([table.source], piece=3)
    run_next_ticks(doc)
    assert list(table.source.data["key"]) == ["newer"]


def test_overview_stays_within_its_glyph_budget():
    b = PAGBuilder()
    b.root(0.0)
    for i in range(500):
        b.compute(f"t{i}-x", "w", 1, i, i + 1, 8, (), label=f"group{i}")
    overview = PAGOverview(static_source(b.pag()), max_groups=50, max_edges=20)
    overview.update()
    assert len(overview.source.data["x"]) == 50
    assert len(overview.edges.data["x0"]) <= 20


def test_each_table_has_one_editor_and_one_formatter_per_format():
    """Bokeh makes a formatter and an editor per column left to its defaults: each a
    model more to encode on the event loop when the page is shown."""
    from bokeh.models import CellEditor, CellFormatter, NumberFormatter, TableColumn

    b = PAGBuilder()
    b.root(0.0)
    data = static_source(b.pag())
    tables = {"steps": StepsTable(data).root, "prefixes": PrefixTable(data).root,
              "map's states": PAGOverview(data).table,
              "what to fix": SuggestionTable(data, background=False).table}
    for name, table in tables.items():
        models = table.references()
        columns = [m for m in models if isinstance(m, TableColumn)]
        formats = {column.formatter.format if isinstance(column.formatter, NumberFormatter)
                   else None for column in columns}
        assert len(columns) >= 5, name
        assert sum(isinstance(m, CellEditor) for m in models) == 1, name
        assert sum(isinstance(m, CellFormatter) for m in models) == len(formats), name
    steps = {column.field: column for column in tables["steps"].columns}
    assert steps["busy"].formatter.format == "0.000" and steps["busy"].width == 70
    assert steps["busy"].formatter is steps["wait"].formatter
    assert not isinstance(steps["key"].formatter, NumberFormatter)


def test_the_map_puts_each_task_group_one_layer_after_its_deepest_input():
    import random

    import networkx as nx

    # A random DAG of task groups: each group's tasks read a task of some earlier groups.
    rng = random.Random(7)
    b = PAGBuilder()
    b.root(0.0)
    dag = nx.DiGraph()
    clock = 1.0
    for g in range(40):
        inputs = rng.sample(range(g), min(g, rng.randint(0, 3)))
        dag.add_node(f"g{g}")
        dag.add_edges_from((f"g{i}", f"g{g}") for i in inputs)
        for t in range(2):
            b.compute(f"('g{g}', {t})", "tcp://w:1", 1, clock, clock + 0.01, 8,
                      tuple(f"('g{i}', 0)" for i in inputs))
            clock += 0.01
    overview = PAGOverview(static_source(b.pag()))
    overview.update()
    layer = overview.fold.layers()
    names = overview.fold._names
    # Groups without inputs take their data from the graph's root, the first layer.
    root = names[int(overview.fold._groups(b.store, np.array([0]))[0])]
    dag.add_edges_from((root, n) for n in list(dag) if dag.in_degree(n) == 0)
    found = {names[g]: depth for g, depth in layer.items()}
    expected = {n: depth for depth, generation in enumerate(nx.topological_generations(dag))
                for n in generation}
    assert found == expected
    # The path is drawn group to group, from node to node, in its own order.
    from distributed.utils import key_split_group

    path_groups = [key_split_group(k) for k in b.pag().wcp().states["key"]]
    visited = [g for i, g in enumerate(path_groups) if i == 0 or g != path_groups[i - 1]]
    nodes = overview.source.data
    where = {label: (x, y) for label, x, y in zip(nodes["label"], nodes["x"], nodes["y"])}
    hops = overview.path_edges.data
    assert list(zip(hops["x0"], hops["y0"], hops["x1"], hops["y1"])) == [
        (*where[a], *where[b]) for a, b in pairwise(visited)]
    assert len(visited) > 3


def test_components_follow_the_dashboard_component_contract(caplog):
    import logging

    from bokeh.models import ColumnDataSource, Model
    from distributed.dashboard.components import DashboardComponent

    b = PAGBuilder()
    b.root(0.0)
    for i in range(5):
        b.compute(f"t{i}-x", "w", 1, i, i + 1, 8, (), label=f"group{i}")
    data = static_source(b.pag())
    static_suggestions = functools.partial(SuggestionTable, background=False)
    for cls in (WCPTimeline, Breakdown, StepsTable, PAGOverview, PrefixTable,
                static_suggestions):
        component = cls(data)
        assert isinstance(component, DashboardComponent)
        assert isinstance(component.source, ColumnDataSource)
        assert isinstance(component.root, Model)
        component.update()
        before = component.source.data
        component.update()  # the same view: nothing is rebuilt nor sent
        assert component.source.data is before, type(component).__name__

    def broken():
        raise RuntimeError("the graph is not readable")

    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError):
        StepsTable(broken).update()
    assert "the graph is not readable" in caplog.text  # logged, as distributed's are


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD)
async def test_json_api_matches_the_client_api(c, s, a, b):
    await crux_dask.attach(c)
    await c.compute(diamond())
    # Every release done, so that no event arrives after the graph is taken.
    await async_poll_for(lambda: not (s.tasks or a.state.tasks or b.state.tasks), timeout=10)
    pag = await crux_dask.get_pag(c)
    path = await crux_dask.get_wcp(c)

    code, body = await fetch(s, "/crux/api/v1/states?limit=10000")
    states = json.loads(body)
    assert code == 200 and states["total"] == len(pag.states)
    assert [r["key"] for r in states["states"]] == pag.states["key"].tolist()
    code, body = await fetch(s, "/crux/api/v1/states?key=left")
    assert {r["key"] for r in json.loads(body)["states"]} == {"left"}
    code, body = await fetch(s, f"/crux/api/v1/states/{path.states['state_id'].iloc[-1]}")
    assert json.loads(body)["key"] == path.states["key"].iloc[-1]
    code, body = await fetch(s, "/crux/api/v1/mutations?kind=merge")
    assert json.loads(body)["total"] == (pag.mutations["kind"] == "MERGE").sum()
    code, body = await fetch(s, "/crux/api/v1/wcp")
    wcp = json.loads(body)
    assert [st["key"] for st in wcp["steps"]] == path.steps["key"].tolist()
    assert wcp["length"] == pytest.approx(path.length)
    code, body = await fetch(s, "/crux/api/v1/stats")
    assert json.loads(body)["states"] == len(pag.states)


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD, config={"crux-dask.graph-process": False})
async def test_a_long_path_is_written_a_piece_at_a_time(c, s, a, b):
    """The JSON of a path is made and cut where it is computed, and written a piece per
    write: whole, the same JSON."""
    from crux_dask.dashboard import api_reads
    from crux_dask.plugins import staging

    await crux_dask.attach(c)
    assert await c.compute(chain(100)) == 100
    path = await crux_dask.get_wcp(c)
    writes = []
    write = api_reads.WCPHandler.write
    piece_bytes, staging.PIECE_BYTES = staging.PIECE_BYTES, 2048
    api_reads.WCPHandler.write = lambda handler, chunk: (writes.append(len(chunk)),
                                                   write(handler, chunk))[1]
    try:
        code, body = await fetch(s, "/crux/api/v1/wcp")
    finally:
        staging.PIECE_BYTES, api_reads.WCPHandler.write = piece_bytes, write
    assert code == 200 and len(writes) > 10 and max(writes) == 2048
    wcp = json.loads(body)
    assert [step["key"] for step in wcp["steps"]] == path.steps["key"].tolist()
    assert len(body.encode()) == sum(writes)


@pytest.mark.parametrize("query, parameter", [
    ("states?limit=-1", "limit"), ("states?limit=lots", "limit"),
    ("states?start_time=nan", "start_time"), ("mutations?kind=TELEPORT", "kind"),
    ("wcp?method=shortest", "method"), ("wcp?start=abc", "start"), ("wcp?end=99999", "end"),
])
def test_invalid_parameters_get_a_400_naming_them(query, parameter):
    @gen_cluster(client=True, scheduler_kwargs=DASHBOARD)
    async def run(c, s, a, b):
        await crux_dask.attach(c)
        await c.compute(diamond())
        code, body = await fetch(s, f"/crux/api/v1/{query}")
        assert code == 400 and json.loads(body)["parameter"] == parameter
        code, body = await fetch(s, "/crux/api/v1/states/424242")
        assert code == 404

    run()


def test_report_is_standalone_html(tmp_path):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster), \
            crux_dask.crux_report(str(tmp_path / "report.html")):
        dask.compute(diamond())
    html = (tmp_path / "report.html").read_text()
    assert "Workflow critical path" in html and "crux-timeline" in html
    assert "crux-suggestions" in html and "left 2x faster" in html  # the slow task first
    assert "crux-scaling" in html and "How many workers are enough" in html
    work = next(code for code in diamond.__code__.co_consts if getattr(code, "co_name", "")
                == "work")  # the code behind every prefix: this file's function
    # (in the page's JSON, where Bokeh escapes "<" and ">")
    assert f'"test_dashboard.py:{work.co_firstlineno} diamond.&lt;locals&gt;.work"' in html
    assert "cdn.bokeh.org" not in html  # Bokeh is inlined: no server, no network


def test_report_of_an_empty_graph():
    b = PAGBuilder()
    b.root(0.0)
    assert "<html" in report_html(b.pag())


# -- a real browser -------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the browser tests: chromium and chromedriver are missing")
        pytest.skip("headless Chromium is not installed (Debian: chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def rendered_bars(driver, expected: int | None = None, timeout: float = 30.0) -> int:
    """The bars the timeline drew, once it drew some, or ``expected`` of them: a long
    source streams in pieces, and the browser may be shown the first before the rest
    (the count last seen, if it never drew that many)."""
    script = """
        if (!window.Bokeh || !Bokeh.documents.length) { return -1; }
        for (const doc of Bokeh.documents) {
            const bars = doc.get_model_by_name('crux-timeline-bars');
            if (bars) { return bars.data_source.data.left.length; }
        }
        return -1;"""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    seen = [-1]

    def drawn(driver):
        count = driver.execute_script(script)
        seen[0] = count if count is not None else -1
        done = seen[0] > 0 if expected is None else seen[0] == expected
        return seen[0] if done else False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.25).until(drawn)
    except TimeoutException:
        return seen[0]


def paths_of_two_spans(c) -> tuple[crux_dask.CriticalPath, crux_dask.CriticalPath]:
    """Run a diamond in the span "first" and one task in "second": the whole run's path
    and that of "first" (of another length)."""
    import distributed

    with distributed.span("first"):
        dask.compute(diamond())
    with distributed.span("second"):
        dask.compute(dask.delayed(len)("ab", dask_key_name="two"))
    whole, first = crux_dask.get_wcp(c), crux_dask.get_wcp(c, span="first")
    assert len(whole) != len(first)
    return whole, first


def choose_span(driver, name: str, steps: int) -> None:
    """Choose the span ``name`` on the page, and wait for its path of ``steps`` steps."""
    from selenium.webdriver.support.ui import WebDriverWait

    chosen = driver.execute_script("""
        for (const doc of Bokeh.documents) {
            const select = doc.get_model_by_name('crux-scope');
            if (select) {
                const option = select.options.find((o) => o[1] === arguments[0]);
                select.value = option[0];
                return option[0];
            }
        }
        return null;""", f"span: {name}")
    assert chosen and chosen.startswith("span:")
    WebDriverWait(driver, 30, poll_frequency=0.25).until(
        lambda d: rendered_bars(d) == steps, "the timeline kept the whole run")


def console_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser")
            if entry["level"] == "SEVERE" and "favicon" not in entry["message"]]


@contextlib.contextmanager
def watched_cluster(apart: bool = True):
    """Headless Chromium, and a client of a cluster with Crux attached; its dashboard's URL.

    ``apart``: the graph, and the pages, in a process of their own (the pages
    relayed by the scheduler), else in the scheduler's.
    """
    from distributed import Client, LocalCluster

    driver = browser()
    try:
        with dask.config.set({"crux-dask.graph-process": apart}), \
                LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                             dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
            crux_dask.attach(c)
            yield driver, c, f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
    finally:
        driver.quit()


@pytest.mark.parametrize("apart", [True, False], ids=["graph-process", "in-scheduler"])
def test_browser_follows_the_crux_tab_and_sees_every_step(tmp_path, monkeypatch, apart):
    from selenium.webdriver.common.by import By

    from crux_dask.dashboard import pieces, showing

    with watched_cluster(apart) as (driver, c, url):
        dask.compute(diamond())
        path = crux_dask.get_wcp(c)
        # The page's parts come when the browser says it shows the rest: not later.
        monkeypatch.setattr(showing, "STAGES_AT_THE_LATEST", 600_000)
        # Long sources come in pieces: here a row at a time.
        monkeypatch.setattr(pieces, "PIECE_ROWS", 1)
        assert len(path) > 2
        streamed = []  # rows per piece
        stream = ColumnDataSource.stream

        def counted(source, data, *args, **kwargs):
            streamed.append(len(next(iter(data.values()))))
            return stream(source, data, *args, **kwargs)

        monkeypatch.setattr(ColumnDataSource, "stream", counted)
        driver.get(f"{url}/status")
        driver.find_element(By.LINK_TEXT, "Crux").click()
        assert driver.current_url.rstrip("/").endswith("/crux")
        assert rendered_bars(driver, len(path)) == len(path)
        shown = driver.execute_script("""
            const shown = {};
            for (const doc of Bokeh.documents) {
                for (const name of ['crux-timeline-bars', 'crux-steps']) {
                    const model = doc.get_model_by_name(name);
                    if (model) { shown[name] = Array.from(model.data_source ?
                        model.data_source.data.key : model.source.data.key); }
                }
            }
            return shown;""")
        keys = path.steps["key"].tolist()
        assert shown == {"crux-timeline-bars": keys, "crux-steps": keys}  # all, in order
        assert set(streamed) == {1} and len(streamed) >= 2 * (len(path) - 1)
        runs = driver.execute_script("""
            for (const doc of Bokeh.documents) {
                const select = doc.get_model_by_name('crux-run');
                if (select) { return select.options.map((o) => o[0]); }
            }
            return null;""")
        assert runs == [""]  # only the run being recorded: nothing was spooled
        # What to fix: replayed off the event loop once the graph is quiet, then shown.
        from selenium.webdriver.support.ui import WebDriverWait

        changes = WebDriverWait(driver, 30, poll_frequency=0.25).until(
            lambda driver: driver.execute_script("""
                for (const doc of Bokeh.documents) {
                    const table = doc.get_model_by_name('crux-suggestions');
                    if (table && table.source.data.change.length) {
                        const data = table.source.data;
                        return Array.from(data.change).filter(
                            (_, i) => data.kind[i] == 'what-if');
                    }
                }
                return false;"""), "the what-to-fix table stayed empty")
        expected = crux_dask.get_pag(c).suggest()
        assert changes == expected[expected["kind"] == "what-if"]["change"].tolist()
        # How many workers are enough, drawn in the browser: a point per shape, and the star.
        points = driver.execute_script("""
            for (const doc of Bokeh.documents) {
                const plot = doc.get_model_by_name('crux-scaling');
                if (plot) {
                    return plot.renderers.filter((r) => r.glyph.type == 'Scatter').map(
                        (r) => Array.from(r.data_source.data.workers));
                }
            }
            return null;""")
        shapes = crux_dask.get_pag(c).scaling(*SCALING_SHAPES).table
        assert points[:-1] == [shapes[shapes["threads"] == t]["workers"].tolist()
                               for t in SCALING_SHAPES[1]]
        assert len(points[-1]) == 1  # the shape that is enough
        driver.save_screenshot(str(tmp_path / "crux-tab.png"))
        assert console_errors(driver) == []


def test_an_open_page_goes_on_finding_paths_when_the_graph_process_dies():
    """The graph process computing what a page shows dies: the page, which the scheduler
    serves, keeps its websocket, and the path of a span chosen afterwards is found by the
    process that resumed, with no error in the browser's console."""
    import signal

    from selenium.webdriver.support.ui import WebDriverWait

    with watched_cluster(apart=True) as (driver, c, url):
        whole, first = paths_of_two_spans(c)
        driver.get(f"{url}/crux")
        assert rendered_bars(driver, len(whole)) == len(whole)
        driver.execute_script("window.cruxFirstLoad = true;")  # gone with a reload
        crux = c.cluster.scheduler.plugins["crux"]
        os.kill(crux.host.remote["pid"], signal.SIGKILL)
        WebDriverWait(driver, 30, poll_frequency=0.25).until(
            lambda driver: crux.host.restarts == 1, "the graph process was not restarted")
        choose_span(driver, "first", len(first))
        assert driver.execute_script("return window.cruxFirstLoad === true")  # not reloaded
        assert console_errors(driver) == []


def test_browser_switches_the_path_to_one_span(tmp_path):
    from distributed.utils import key_split_group

    with watched_cluster() as (driver, c, url):
        whole, first = paths_of_two_spans(c)
        driver.get(f"{url}/crux")
        assert rendered_bars(driver, len(whole)) == len(whole)
        choose_span(driver, "first", len(first))
        # The map draws the span's path: one hop per change of task group along it.
        groups = [key_split_group(k) for k in first.states["key"]]
        hops = sum(a != b for a, b in pairwise(groups))
        drawn = driver.execute_script("""
            for (const doc of Bokeh.documents) {
                const path = doc.get_model_by_name('crux-overview-path');
                if (path) { return path.data_source.data.x0.length; }
            }
            return null;""")
        assert drawn == hops > 0
        driver.save_screenshot(str(tmp_path / "crux-span.png"))
        assert console_errors(driver) == []


def test_browser_shows_the_same_path_in_the_report(tmp_path):
    from distributed import Client, LocalCluster

    driver = browser()
    try:
        with LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                          dashboard_address=":0") as cluster, Client(cluster) as c:
            with crux_dask.crux_report(str(tmp_path / "report.html"), client=c):
                dask.compute(diamond())
            path = crux_dask.get_wcp(c)
        driver.get((tmp_path / "report.html").as_uri())
        assert rendered_bars(driver, len(path)) == len(path)
        driver.save_screenshot(str(tmp_path / "report.png"))
        assert console_errors(driver) == []
    finally:
        driver.quit()


@gen_cluster(client=True, scheduler_kwargs=DASHBOARD, config={"crux-dask.max-states": 100})
async def test_run_selector_shows_a_spooled_run(c, s, a, b):

    from crux_dask.dashboard.data import (
        PathSelection,
        RunChoice,
        Runs,
        chosen_source,
        selected_source,
    )
    from crux_dask.dashboard.selectors import RunSelector

    await crux_dask.attach(c)
    for _ in range(2):  # each flushed graph is more than max-states: a segment spooled
        assert await c.compute(chain(300)) == 300
        await crux_dask.flush(c)
    plugin = s.plugins["crux"]
    spooled = plugin.spooled_runs()
    assert len(spooled) >= 2

    runs = Runs(plugin)
    choice = RunChoice()
    data = selected_source(chosen_source(live_source(plugin), runs, choice), PathSelection())
    steps = StepsTable(data)
    driver = OffLoop(data, [steps])
    selector = RunSelector(runs, choice, [driver])
    values = [value for value, _ in selector.select.options]
    assert values[0] == "" and sorted(values[1:]) == sorted(spooled)
    await settled(driver)
    live_keys = list(steps.source.data["key"])

    selector.select.value = spooled[0]  # the first segment: read back in the spool's thread

    def read_back() -> bool:
        selector.update()
        if runs.view(spooled[0]) is not None:
            return True
        assert selector.message.text.startswith("reading")
        return False

    await async_poll_for(read_back, timeout=10)
    selector.update()
    await settled(driver)
    assert selector.message.text == ""
    keys = [key for key in steps.source.data["key"] if key.startswith("step-")]
    numbers = [int(key.split("-")[1]) for key in keys]
    # The pipeline's beginning, in order, and not what the live run shows.
    assert numbers[0] == 0 and numbers == sorted(numbers) and len(numbers) > 10
    assert keys != [key for key in live_keys if key.startswith("step-")]

    selector.select.value = "no-such-run"
    selector.update()
    assert "cannot show this run" in selector.message.text
    await settled(driver)
    assert list(steps.source.data["key"]) == live_keys  # the live run stays on screen
    code, _ = await fetch(s, "/crux")
    assert code == 200


@gen_cluster(client=True, scheduler_kwargs={**DASHBOARD, "http_prefix": "/dask"})
async def test_everything_moves_under_a_dashboard_prefix(c, s, a, b):
    await crux_dask.attach(c)
    await c.compute(diamond())
    for path in ["/dask/crux", "/dask/individual-crux-steps", "/dask/crux/api/v1/stats"]:
        code, _ = await fetch(s, path)
        assert code == 200, path
    code, status = await fetch(s, "/dask/status")
    assert code == 200 and "crux" in status
    code, plots = await fetch(s, "/dask/individual-plots.json")
    assert json.loads(plots)["Individual Crux Steps"] == "/individual-crux-steps"
    code, _ = await fetch(s, "/crux")
    assert code == 404  # nothing answers outside the prefix


def test_a_thread_handoff_is_a_link_between_two_bars_and_a_row_that_says_so():
    b = PAGBuilder()
    b.root(0.0)
    w = "tcp://10.0.0.1:1"
    for i in range(3):  # all runnable at once, on one thread
        b.compute(f"t{i}", w, 1, float(i), i + 1.0, 8, (), sent=0.0, received=0.0,
                  runnable=0.0)
    data = static_source(b.pag())
    timeline, steps, breakdown, prefixes = (WCPTimeline(data), StepsTable(data),
                                            Breakdown(data), PrefixTable(data))
    for component in (timeline, steps, breakdown, prefixes):
        component.update()
    assert prefixes.source.data["prefix"] == ["t0", "t1", "t2"]  # the keys' own prefixes
    assert prefixes.source.data["seconds"] == pytest.approx([1.0, 1.0, 1.0])
    assert list(steps.source.data["via"]) == ["data", "thread", "thread"]
    links = timeline.links.data
    assert list(links["via"]) == ["thread", "thread"]
    # From where the task before ended to where this one started: the same lane.
    assert links["x0"] == pytest.approx([1.0, 2.0]) and links["x1"] == pytest.approx([1.0, 2.0])
    assert set(links["y0"]) == set(links["y1"]) == {f"memory@{w}"}
    shown = dict(zip(breakdown.source.data["category"], breakdown.source.data["seconds"]))
    assert shown["compute"] == pytest.approx(3.0) and shown["wait"] == pytest.approx(0.0)


def test_a_fold_is_kept_by_its_token_for_the_newest_pages():
    """A copy of a fold (as it arrives, pickled, where the graph is) finds the fold that
    folded, until as many newer ones pushed it out; the task-group map then folds again."""
    import pickle

    from crux_dask.dashboard.off_loop import KEPT_AT_MOST, kept
    from crux_dask.dashboard.overview import GroupFold

    b = PAGBuilder()
    b.root(0.0)
    b.compute("x", "tcp://w:1", 1, 1.0, 2.0, 8)
    b.compute("y", "tcp://w:1", 1, 2.0, 3.0, 8, ("x",))
    view = static_source(b.pag())()
    fold = GroupFold()
    kept(pickle.loads(pickle.dumps(fold)))(view)
    assert kept(pickle.loads(pickle.dumps(fold)))._states_seen == b.store.n_states
    assert fold._states_seen == 0  # the page's own stays empty
    for _ in range(KEPT_AT_MOST):
        kept(GroupFold())
    assert kept(pickle.loads(pickle.dumps(fold)))._states_seen == 0
