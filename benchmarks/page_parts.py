"""What Bokeh does on the event loop for each part of the ``/crux`` page, whatever the graph.

A live page is added to its document a part (a component) per turn of the
event loop, the part of most models first, each at its place on the page
(``crux_dask.dashboard.showing.show_in_stages``).  On that turn Bokeh walks
every model of the document to find the new ones and applies the theme to
them (the *check*), and encodes the new models as the change the browser is
sent (the *encoding*).  Neither depends on the graph's size (its data goes in
pieces after, see ``crux_dask.dashboard.pieces``); both grow with the number
of models, the check with all the document's.  This measures both for each
part, in the order they are added, on an empty graph (median of 5 pages).

Usage: ``python benchmarks/page_parts.py``
"""

from __future__ import annotations

import statistics
import time

from bokeh.document import Document
from bokeh.layouts import column
from bokeh.protocol import Protocol
from distributed.dashboard.components.scheduler import BOKEH_THEME

from crux_dask import PAGBuilder
from crux_dask.dashboard.data import GraphView
from crux_dask.dashboard.layout import crux_layout
from crux_dask.dashboard.showing import insert_in_place, largest_first

ROUNDS = 5


def empty_graph() -> GraphView:
    builder = PAGBuilder()
    builder.root(0.0)
    return GraphView(builder.store, builder.end)


def one_page() -> list[tuple[str, int, int, float, float]]:
    """Each part: its name, its models, the document's models after it, the check and
    the encoding, in seconds."""
    protocol = Protocol()
    _, layout = crux_layout(empty_graph, background=False)
    parts = list(layout.children)
    layout.children = []
    doc = Document()
    doc.theme = BOKEH_THEME
    doc.add_root(column(layout))
    events: list = []
    doc.on_change(events.append)
    measured, shown = [], []
    for position, part in largest_first(parts):
        events.clear()
        started = time.perf_counter()
        insert_in_place(layout, position, part, shown)
        checked = time.perf_counter()
        protocol.create("PATCH-DOC", list(events))
        encoded = time.perf_counter()
        names = {model.name for model in part.references()
                 if model.name and model.name.startswith("crux-")}
        names = sorted(name for name in names  # components, not their models
                       if not any(name.startswith(other + "-") for other in names))
        measured.append((", ".join(names) or type(part).__name__, len(part.references()),
                         len(doc.models), checked - started, encoded - checked))
    return measured


def main() -> None:
    pages = [one_page() for _ in range(ROUNDS)]
    print(f"{'part':<48} {'models':>6} {'in doc':>6} {'check':>8} {'encode':>8} {'turn':>8}")
    for i, (name, models, in_doc, *_) in enumerate(pages[0]):
        check = statistics.median(page[i][3] for page in pages)
        encode = statistics.median(page[i][4] for page in pages)
        print(f"{name[:48]:<48} {models:>6} {in_doc:>6} {check * 1e3:6.1f} ms "
              f"{encode * 1e3:6.1f} ms {(check + encode) * 1e3:6.1f} ms")


if __name__ == "__main__":
    main()
