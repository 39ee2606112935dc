"""Scale of the pure core: ingest, critical paths and memory at a million states.

A synthetic workflow shaped like a Dask graph runs through the real builder:
layers of tasks on 16 workers, each task merging three outputs of the layer
before, one input in ten fetched from another worker, and every replica
released once its consumers are done.  Printed, all measured in this run:

* ingest rate (events per second through ``PAGBuilder``) of the events as
  they reach the scheduler: encoded batches of 5,000 events, decoded and
  applied ten at a time, as the scheduler plugin does;
* the same events applied as tuples (``apply_many``, which puts them in
  columns itself), and what encoding the batches cost their producers;
* observed WCP time (its steps flagged against their task groups, see
  :mod:`crux_dask.groups`), the statistics of every task group, and
  ``longest`` time on the full graph,
* memory per state (resident set growth while building),
* ``longest`` against networkx's ``dag_longest_path`` at 100,000 states.

Usage: ``python benchmarks/core_scale.py [--states N]``
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import random
import time

import numpy as np

from crux_dask import PAGBuilder, decode_batch, encode_batch
from crux_dask.columns import EventColumns
from crux_dask.groups import group_stats

WORKERS = [f"tcp://10.0.0.{i}:4000" for i in range(16)]
INPUTS = 3
TRANSFER_SHARE = 0.1
CHUNK = 50_000
#: Events per batch (the workers' default ``crux-dask.batch-size``), and
#: batches per apply.
BATCH = 5_000
BATCHES_PER_APPLY = 10


def rss() -> int:
    """Resident set size of this process, in bytes."""
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def workflow_events(n_tasks: int, seed: int = 0):
    """Yield lists of events of a synthetic layered workflow, in time order."""
    rng = random.Random(seed)
    width = 1_600
    clock = 1.0e9
    chunk: list[tuple] = [("root", clock, "graph")]
    previous: list[tuple[str, str]] = []  # (key, worker) of the layer before
    by_worker: dict[str, list[str]] = {}
    replicas: dict[str, list[str]] = {}
    layer = 0
    made = 0
    while made < n_tasks:
        current = []
        current_by_worker: dict[str, list[str]] = {w: [] for w in WORKERS}
        for i in range(min(width, n_tasks - made)):
            key = f"('layer{layer}-8f2a6c1e9b4d', {i})"
            worker = WORKERS[i % len(WORKERS)]
            inputs = []
            for _ in range(INPUTS if previous else 0):
                if rng.random() < TRANSFER_SHARE / INPUTS:
                    dep_key, dep_worker = previous[rng.randrange(len(previous))]
                else:
                    dep_key, dep_worker = rng.choice(by_worker[worker]), worker
                if worker not in replicas[dep_key]:
                    clock += 1e-4
                    chunk.append(("transfer", dep_key, f"memory@{dep_worker}",
                                  f"memory@{worker}", clock - 5e-5, clock, 1000))
                    replicas[dep_key].append(worker)
                if dep_key not in inputs:
                    inputs.append(dep_key)
            clock += 1e-4
            chunk.append(("compute", key, worker, 7, clock - 8e-5, clock, 1000, tuple(inputs),
                          0, f"layer{layer}", None, None, None, None, None))
            replicas[key] = [worker]
            current.append((key, worker))
            current_by_worker[worker].append(key)
            made += 1
            if len(chunk) >= CHUNK:
                yield chunk
                chunk = []
        for dep_key, _ in previous:
            for where in replicas.pop(dep_key):
                clock += 1e-6
                chunk.append(("delete", dep_key, f"memory@{where}", clock))
        previous, by_worker = current, current_by_worker
        layer += 1
    yield chunk


def build(n_tasks: int) -> tuple[PAGBuilder, int, float, int]:
    """Build the PAG from tuples; return the builder, events applied, seconds spent, bytes grown."""
    builder = PAGBuilder()
    gc.collect()
    before = rss()
    events = 0
    spent = 0.0
    for chunk in workflow_events(n_tasks):
        t0 = time.perf_counter()
        builder.apply_many(chunk)
        spent += time.perf_counter() - t0
        events += len(chunk)
    del chunk
    gc.collect()
    return builder, events, spent, rss() - before


def encode(n_tasks: int) -> tuple[list[bytes], int, float]:
    """The workflow's events in encoded batches; also how many, and the seconds encoding took."""
    batches = []
    spent = 0.0
    events = 0
    for chunk in workflow_events(n_tasks):
        t0 = time.perf_counter()
        batches += [encode_batch(chunk[i:i + BATCH]) for i in range(0, len(chunk), BATCH)]
        spent += time.perf_counter() - t0
        events += len(chunk)
    return batches, events, spent


def build_from_batches(batches: list[bytes]) -> tuple[PAGBuilder, float, int]:
    """Decode and apply the batches; return the builder, seconds spent, bytes grown."""
    builder = PAGBuilder()
    gc.collect()
    before = rss()
    t0 = time.perf_counter()
    for i in range(0, len(batches), BATCHES_PER_APPLY):
        decoded = [decode_batch(data) for data in batches[i:i + BATCHES_PER_APPLY]]
        parts = [batch.columns if batch.columns is not None else  # a short last batch: rows
                 EventColumns.from_events(batch.rows) for batch in decoded]
        builder.apply_columns(EventColumns.concat(parts))
    spent = time.perf_counter() - t0
    gc.collect()
    return builder, spent, rss() - before


def same_graph(a: PAGBuilder, b: PAGBuilder) -> bool:
    """Whether two builders hold the same states and mutations (NaN equal to NaN)."""
    columns = [name for name, value in vars(a.store).items() if hasattr(value, "typecode")]
    return all(np.array_equal(np.asarray(getattr(a.store, name)),
                              np.asarray(getattr(b.store, name)), equal_nan=True)
               for name in columns)


def best_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure_full(n_states: int) -> None:
    """Ingest, critical paths and memory at ``n_states`` states."""
    n_tasks = int(n_states / 2.2)
    batches, events, encoding = encode(n_tasks)
    builder, spent, grown = build_from_batches(batches)
    size = sum(map(len, batches))
    del batches
    gc.collect()
    from_tuples, _, tuples_spent, _ = build(n_tasks)
    pag = builder.pag()
    store = builder.store
    n, m = store.n_states, store.n_mutations
    print(f"graph: {n:,} states, {m:,} mutations from {events:,} events")
    print(f"ingest of encoded batches: {events / spent:,.0f} events/s ({spent:.2f} s)   "
          "[target >= 500,000]")
    print(f"ingest of tuples: {events / tuples_spent:,.0f} events/s ({tuples_spent:.2f} s); "
          f"same graph: {same_graph(builder, from_tuples)}")
    print(f"encoding the batches (producers): {encoding / events * 1e6:.2f} us/event, "
          f"{size / events:.0f} bytes/event")
    del from_tuples
    observed = best_of(5, lambda: pag.wcp())
    print(f"observed WCP: {observed * 1e3:.2f} ms, {len(pag.wcp())} steps   [target <= 50 ms]")
    grouped = best_of(3, lambda: group_stats(store))
    print(f"task group statistics: {grouped:.2f} s over {store.n_states:,} states, "
          f"{len(group_stats(store))} groups   [target <= 0.5 s]")
    longest = best_of(3, lambda: pag.wcp(method="longest"))
    print(f"longest busy path: {longest:.2f} s   [target <= 2 s]")
    print(f"memory: {grown / n:.0f} bytes/state resident growth, "
          f"{store.nbytes() / n:.0f} bytes/state in columns and string tables   "
          "[target <= 200]")


def compare_networkx(n_states: int = 100_000) -> None:
    """``longest`` against networkx's ``dag_longest_path`` on the same graph."""
    import networkx as nx

    builder, *_ = build(int(n_states / 2.2))
    pag = builder.pag()
    mutations = pag.mutations
    graph = nx.DiGraph()
    graph.add_nodes_from(range(builder.store.n_states))
    graph.add_weighted_edges_from(
        zip(mutations["src"].tolist(), mutations["dst"].tolist(),
            mutations["busy"].tolist()), weight="busy")
    ours = best_of(3, lambda: pag.wcp(method="longest"))
    theirs = best_of(1, lambda: nx.dag_longest_path(graph, weight="busy"))
    busy = mutations.set_index("mutation_id")["busy"]
    ours_busy = busy.loc[pag.wcp(method="longest").steps["mutation_id"]].sum()
    path = nx.dag_longest_path(graph, weight="busy")
    theirs_busy = sum(graph[a][b]["busy"] for a, b in itertools.pairwise(path))
    print(f"longest at {builder.store.n_states:,} states: ours {ours * 1e3:.0f} ms, "
          f"networkx {theirs * 1e3:.0f} ms, ratio {theirs / ours:.1f}x   [target >= 10x]; "
          f"same busy total: {abs(ours_busy - theirs_busy) < 1e-9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=1_000_000)
    args = parser.parse_args()
    measure_full(args.states)
    gc.collect()
    compare_networkx()


if __name__ == "__main__":
    main()
