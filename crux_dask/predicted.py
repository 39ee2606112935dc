"""The PAG of a predicted run: a what-if replay's schedule written as the events of a run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from crux_dask.pag import PAG
    from crux_dask.replay import Schedule
    from crux_dask.runs import Run

__all__ = ["predicted_pag"]


def predicted_pag(run: Run, schedule: Schedule) -> PAG:
    """A PAG of the predicted run, built by :class:`~crux_dask.PAGBuilder` from its events."""
    from crux_dask.graph.builder import PAGBuilder

    store = run.store
    keys = np.asarray(store.keys.values, dtype=object)[store.column("state_key", run.state)]
    names = [run.workers[w] if w < len(run.workers) else f"tcp://what-if:{w}"
             for w in range(schedule.workers)]
    origin = run.origin
    events: list[tuple[float, int, tuple]] = [(0.0, 0, ("root", origin, "graph"))]
    for d, src, dst, began, there in schedule.transfers:
        events.append((there, 1, ("transfer", keys[d], f"memory@{names[src]}",
                                  f"memory@{names[dst]}", origin + began, origin + there,
                                  int(run.size[d]))))
    labels = run.label_names
    for task in range(run.n_tasks):
        inputs = tuple(keys[run.deps[run.dep_ptr[task]:run.dep_ptr[task + 1]]])
        releaser = int(schedule.released_by[task])
        events.append((schedule.stop[task], 2, (
            "compute", keys[task], names[schedule.worker[task]], int(schedule.thread[task]),
            origin + schedule.start[task], origin + schedule.stop[task], int(run.size[task]),
            inputs, 0, labels[task], None, None, None, None, None,
            origin + schedule.sent[task], origin + schedule.runnable[task],
            origin + schedule.runnable[task],
            keys[releaser] if releaser >= 0 else None,
            names[schedule.worker[releaser]] if releaser >= 0 else None)))
    last = schedule.stop[run.outputs].max() if len(run.outputs) else 0.0
    # The client gathers once every output is computed; the output computed last is
    # the one it receives last, so that the path ends through it.
    by_stop = run.outputs[np.argsort(schedule.stop[run.outputs], kind="stable")]
    for task, delay in zip(by_stop.tolist(), np.sort(run.output_delay).tolist()):
        there = last + delay
        events.append((there, 3, ("transfer", keys[task], f"memory@{names[schedule.worker[task]]}",
                                  "client", origin + min(last, there), origin + there,
                                  int(run.size[task]))))
    events.sort(key=lambda e: (e[0], e[1]))
    builder = PAGBuilder(run_id=f"{store.run_id}-what-if")
    builder.apply_many([e[2] for e in events])
    builder.resolve_parked()
    return builder.pag()
