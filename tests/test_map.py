"""The task-group map's layout: a grid of fixed pitch, a layer too tall for one column in
columns side by side; and TPC-H Q5's map in a real browser, where every label can be read."""

from __future__ import annotations

from collections import Counter
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_dashboard import browser, console_errors
from tpch import generate, q5

import crux_dask
from crux_dask.dashboard.data import static_source
from crux_dask.dashboard.map_layout import (
    COLUMN_PX,
    NODE_PX,
    ROW_PX,
    ROWS_PER_COLUMN,
    frame,
    layer_ticks,
    node_px,
    positions,
)
from crux_dask.dashboard.overview import PAGOverview

if TYPE_CHECKING:
    from distributed import Client

#: Where the browser drew the map's groups, once it drew those of ``arguments[0]`` (their
#: labels, sorted): each group's label box and node box in canvas pixels, else false.
DRAWN_GROUPS = """
    for (const doc of Bokeh.documents) {
        const figure = doc.get_model_by_name('crux-overview');
        if (!figure) { continue; }
        const nodes = doc.get_model_by_name('crux-overview-nodes');
        const names = figure.renderers.find((r) => r.glyph.type === 'Text');
        const data = nodes.data_source.data;
        if (JSON.stringify(Array.from(data.label).sort()) !== JSON.stringify(arguments[0])) {
            return false;
        }
        const plot = doc.views_manager.find_one(figure);
        const marker = doc.views_manager.find_one(nodes)?.glyph;
        const text = doc.views_manager.find_one(names)?.glyph;
        if (!plot || !marker || !text || !plot.has_finished() || !text.labels
                || text.sx.length !== data.x.length || marker.sx.length !== data.x.length
                || plot.frame.bbox.width < figure.frame_width) {
            return false;
        }
        const {x_scale, y_scale} = plot.frame;
        const groups = [];
        for (let i = 0; i < data.x.length; i++) {
            const sx = x_scale.compute(data.x[i]), sy = y_scale.compute(data.y[i]);
            if (Math.abs(sx - text.sx[i]) > 0.5 || Math.abs(sy - text.sy[i]) > 0.5
                    || text.labels[i]?.text !== data.name[i]) {
                return false;  // not painted yet with the data and ranges as they are
            }
            const anchor = text.anchor_.get(i);
            const left = sx + text.x_offset.get(i) - anchor.x * text.swidth[i];
            const top = sy + text.y_offset.get(i) - anchor.y * text.sheight[i];
            const radius = marker.size.get(i) / 2;
            groups.push({
                name: data.name[i], on_path: data.on_path[i] > 0,
                label: [left, top, left + text.swidth[i], top + text.sheight[i]],
                node: [sx - radius, sy - radius, sx + radius, sy + radius],
            });
        }
        const legend = [...figure.center, ...figure.right, ...figure.left, ...figure.above,
                        ...figure.below].find((m) => m.type === 'Legend');
        const box = (bbox) => [bbox.left, bbox.top, bbox.right, bbox.bottom];
        plot.el.scrollIntoView({block: 'center'});
        return {groups, frame: box(plot.frame.bbox),
                legend: box(doc.views_manager.find_one(legend).bbox)};
    }
    return false;"""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("tpch"))


def intersect(a: list[float], b: list[float]) -> bool:
    """Whether two boxes (left, top, right, bottom) share more than an edge."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_a_layer_taller_than_a_column_is_split_into_columns_side_by_side() -> None:
    layer = {0: 0, **{g: 1 for g in range(1, 26)}, 26: 2, 27: 2}
    x, y = positions(list(layer), layer)
    assert (x[0], y[0]) == (0, 0)
    columns = [x[g] for g in range(1, 26)]
    assert columns == sorted(columns) and set(columns) == {1, 2, 3}  # as few as hold 25
    assert Counter(columns) == {1: 9, 2: 9, 3: 7}  # as many in each as can be
    assert [y[g] for g in range(1, 10)] == [4 - i for i in range(9)]  # top down, centred
    assert len({(x[g], y[g]) for g in layer}) == len(layer)
    assert (x[26], y[26], x[27], y[27]) == (4, 0.5, 4, -0.5)  # the next layer moved right
    assert layer_ticks([layer[g] for g in layer], [x[g] for g in layer]) == {
        0: "0", 2: "1", 4: "2"}


def test_a_layer_that_fits_keeps_one_column_at_its_layer() -> None:
    layer = {g: g // ROWS_PER_COLUMN for g in range(3 * ROWS_PER_COLUMN)}
    x, _ = positions(list(layer), layer)
    assert x == layer
    one_more = {g: 0 for g in range(ROWS_PER_COLUMN + 1)}
    assert set(positions(list(one_more), one_more)[0].values()) == {0, 1}


@pytest.mark.parametrize(("columns", "rows"), [(1, 1), (3, 10), (17, 4)])
def test_the_frame_keeps_the_grid_s_pitch_in_pixels(columns: int, rows: int) -> None:
    shape = frame(columns, rows)
    (left, right), (bottom, top) = shape.x_range, shape.y_range
    assert shape.width / (right - left) == pytest.approx(COLUMN_PX, rel=0.01)
    assert shape.height / (top - bottom) == pytest.approx(ROW_PX, rel=0.01)
    assert left < 0 < columns - 1 + 0.5 < right and bottom < -(rows - 1) / 2 <= (rows - 1) / 2 < top
    assert node_px(1) < node_px(1e6) < node_px(1e15) == NODE_PX


def test_every_label_of_the_map_can_be_read(crux_client: Client, data: Path,
                                            tmp_path: Path) -> None:
    """TPC-H Q5's map, drawn by the browser: each label is in the frame, clear of the
    legend, of every other label and of every group's node, though one layer holds
    more groups than a column."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    assert len(q5(data).compute()) == 5
    expected = PAGOverview(static_source(crux_dask.get_pag(crux_client)))
    expected.update()
    layer = expected.fold.layers()
    widest = max(Counter(layer[g] for g in expected.source.data["group"]).values())
    assert widest > ROWS_PER_COLUMN
    port = crux_client.cluster.scheduler.http_server.port
    driver = browser()
    try:
        driver.get(f"http://127.0.0.1:{port}/status")
        driver.find_element(By.LINK_TEXT, "Crux").click()
        drawn = WebDriverWait(driver, 60, poll_frequency=0.25).until(
            lambda driver: driver.execute_script(
                DRAWN_GROUPS, sorted(expected.source.data["label"])),
            "the map did not draw the groups of the run")
        driver.save_screenshot(str(tmp_path / "map.png"))
        assert console_errors(driver) == []
    finally:
        driver.quit()
    groups, shown = drawn["groups"], drawn["frame"]
    assert sum(g["on_path"] for g in groups) >= 10
    unreadable = [(a["name"], "outside the frame") for a in groups
                  if not (shown[0] <= a["label"][0] and a["label"][2] <= shown[2]
                          and shown[1] <= a["label"][1] and a["label"][3] <= shown[3])]
    unreadable += [(a["name"], "under the legend") for a in groups
                   if intersect(a["label"], drawn["legend"])]
    unreadable += [(a["name"], b["name"]) for a, b in combinations(groups, 2)
                   if intersect(a["label"], b["label"])]
    unreadable += [(a["name"], f"{b['name']}'s node") for a in groups for b in groups
                   if intersect(a["label"], b["node"])]
    assert unreadable == []
