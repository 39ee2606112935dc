"""What Crux leaves for the scheduler's garbage collector after a run.

A full collection walks every container the scheduler's process holds, element
by element, and holds the event loop (and every thread) while it does: the
longest pauses of a busy scheduler.  Whatever Crux keeps -- its copy of the
graph, the transitions kept for the export -- must not make them longer.

For each configuration (``none``, ``crux``, and with ``--compare-with DIR``
``crux-other``, as in ``overhead.py``), in rotating order for ``--repeats``
rounds: a scheduler and two worker processes run ``--tasks`` tiny tasks (the
graph of ``overhead.py``), every task is released, and on the scheduler's
event loop the benchmark times a full collection (the fastest of five) and
counts the objects it tracks and the elements of the lists among them.

Usage: ``python benchmarks/heap.py [--tasks N] [--repeats N] [--compare-with DIR]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from overhead import Cluster, run_tiny


def collect(dask_scheduler: Any = None) -> dict[str, float]:
    """On the scheduler: a full collection timed (the fastest of five), and what it walks."""
    import gc
    import time

    spent = []
    for _ in range(5):
        started = time.perf_counter()
        gc.collect()
        spent.append(time.perf_counter() - started)
    tracked = gc.get_objects()
    return {"collection_ms": min(spent) * 1e3, "objects": len(tracked),
            "list_elements": sum(len(o) for o in tracked if type(o) is list)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=90_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-with", type=Path, metavar="DIR")
    args = parser.parse_args()
    # The functions of overhead.py the cluster runs travel by reference to their module.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [
        str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    configs = ("none", "crux", *(("crux-other",) if args.compare_with else ()))
    results: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="crux-heap-") as scratch:
        for round_ in range(args.repeats):
            turn = round_ % len(configs)
            for config in configs[turn:] + configs[:turn]:
                cluster = Cluster(config, Path(scratch), other=args.compare_with)
                try:
                    run_tiny(cluster.client, args.tasks)
                    cluster.settle()
                    result = cluster.client.run_on_scheduler(collect)
                finally:
                    cluster.close()
                results[config].append(result)
                print(f"  round {round_ + 1} {config:<11} full collection "
                      f"{result['collection_ms']:6.1f} ms, {result['objects']:,} objects, "
                      f"{result['list_elements']:,} list elements", file=sys.stderr, flush=True)
    print(f"{args.tasks:,} tiny tasks, all released; {args.repeats} rounds, medians")
    print(f"  {'config':<12} {'full collection ms':>19} {'tracked objects':>16} "
          f"{'list elements':>14}")
    for config, rounds in results.items():
        median = {m: statistics.median(r[m] for r in rounds) for m in rounds[0]}
        print(f"  {config:<12} {median['collection_ms']:>19.1f} {median['objects']:>16,.0f} "
              f"{median['list_elements']:>14,.0f}")


if __name__ == "__main__":
    main()
