"""A recorded run as a Chrome trace, for Perfetto or ``chrome://tracing``."""

from __future__ import annotations

from typing import Any

from crux_dask.pag import PAG

__all__ = ["chrome_trace"]


def chrome_trace(pag: PAG, run_id: str | None = None) -> list[dict[str, Any]]:
    """Chrome trace events of a run: tasks and transfers per worker and thread.

    Every computation is one complete (``"X"``) event on its worker's thread,
    every transfer one on a ``transfers`` lane of the receiving worker, and the
    observed critical path has a process of its own.  Times are microseconds
    since the run's first state.
    """
    run_id = run_id or pag.run_ids[-1]
    store = pag.store(run_id)
    states = store.states_frame()
    mutations = store.mutations_frame()
    t0 = float(states["time"].min()) if len(states) else 0.0
    location = states["location"].to_numpy(dtype=object)
    label = states["label"].to_numpy(dtype=object)
    workers = sorted(w for w in states["worker"].dropna().unique())
    pid = {w: i + 1 for i, w in enumerate(workers)}
    events: list[dict[str, Any]] = []
    for worker, p in pid.items():
        events.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                       "args": {"name": worker}})
        events.append({"ph": "M", "name": "thread_name", "pid": p, "tid": 0,
                       "args": {"name": "transfers"}})

    def micros(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    computed = mutations[mutations["thread"].notna()].drop_duplicates("dst")
    for row in computed.itertuples():
        events.append({"ph": "X", "cat": "compute", "name": label[row.dst],
                       "pid": pid.get(row.worker, 0), "tid": int(row.thread),
                       "ts": micros(row.start), "dur": micros(row.stop) - micros(row.start),
                       "args": {"key": row.key, "kind": row.kind}})
    moved = mutations[(mutations["kind"] == "TRANSFER") & mutations["thread"].isna()]
    for row in moved.itertuples():
        events.append({"ph": "X", "cat": "transfer", "name": f"{label[row.dst]} transfer",
                       "pid": pid.get(row.worker, 0), "tid": 0, "ts": micros(row.start),
                       "dur": micros(row.stop) - micros(row.start),
                       "args": {"key": row.key, "from": location[row.src],
                                "to": location[row.dst]}})
    path_pid = len(pid) + 1
    events.append({"ph": "M", "name": "process_name", "pid": path_pid, "tid": 0,
                   "args": {"name": "critical path"}})
    path = pag.wcp(run_id=run_id)
    for row in path.to_frame().itertuples():
        events.append({"ph": "X", "cat": "wcp", "name": f"{row.kind} {row.label}",
                       "pid": path_pid, "tid": 0, "ts": micros(row.stop - row.cost),
                       "dur": round(row.cost * 1e6, 3),
                       "args": {"key": row.key, "busy": row.busy, "wait": row.wait,
                                "category": row.category}})
    return events
