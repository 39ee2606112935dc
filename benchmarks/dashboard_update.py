"""Cost of one live dashboard update, at 10k, 100k and 1M states.

The graph grows by a batch of events between updates, as it does while a
workflow runs; each figure is the time for all four Crux components (timeline,
breakdown, steps table, task-group map) to take in the change, median of 5,
and the map's own share of it.  The first update of a page (which folds in
the whole graph once) is printed too.

Usage: ``python benchmarks/dashboard_update.py``
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from core_scale import build

from crux_dask.dashboard.breakdown import Breakdown
from crux_dask.dashboard.data import GraphView
from crux_dask.dashboard.overview import PAGOverview
from crux_dask.dashboard.steps import StepsTable
from crux_dask.dashboard.timeline import WCPTimeline


def measure(n_states: int) -> tuple[float, float]:
    builder, *_ = build(int(n_states / 2.2))
    latest: list[GraphView] = []

    def data() -> GraphView:
        view = GraphView(builder.store, builder.end)
        if latest and latest[0].version == view.version:
            return latest[0]
        latest[:] = [view]
        return view

    components = [WCPTimeline(data), Breakdown(data), StepsTable(data), PAGOverview(data)]
    started = time.perf_counter()
    for component in components:
        component.update()
    first = time.perf_counter() - started
    # The workflow goes on: 2,000 more tasks between updates, fanned out from the
    # last state of the batch before (so the critical path grows one step a batch).
    store = builder.store
    previous = store.keys.values[store.state_key[builder.end]]
    worker = store.workers.values[store.state_worker[builder.end]]
    clock = store.state_time[builder.end]
    times, map_times = [], []
    for batch in range(5):
        for i in range(2_000):
            key = f"more-{batch}-{i}"
            builder.apply(("compute", key, worker, 7, clock, clock + 1e-4, 1000, (previous,),
                           -1, "more", None, None, None, None, None))
            clock += 1e-4
        previous = key
        started = time.perf_counter()
        for component in components[:-1]:
            component.update()
        before_map = time.perf_counter()
        components[-1].update()
        times.append(time.perf_counter() - started)
        map_times.append(time.perf_counter() - before_map)
    return first, statistics.median(times), statistics.median(map_times)


def main() -> None:
    for n in (10_000, 100_000, 1_000_000):
        first, update, map_update = measure(n)
        print(f"{n:>9,} states: update {update * 1e3:6.1f} ms   [target <= 50 ms]   "
              f"of which the task-group map {map_update * 1e3:5.1f} ms [target <= 150 ms]   "
              f"(first load of a page: {first * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
