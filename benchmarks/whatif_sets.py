"""What-if predictions judged over sets of recordings, not one run of each.

One run of :mod:`whatif_realcode` varies more than a change of the model moves
it: a recording that came out slow is one point of fifteen.  This benchmark
records ``--rounds`` rounds of its five workloads on 1×1, 1×2 and 2×1, one
after another, each on a fresh cluster, and keeps each recording's PAG and
load in ``DIR``.  ``evaluate`` then predicts, from every recording on 1×1 and
1×2, the other shapes (as :mod:`whatif_realcode`'s cases), each against the
median makespan of all the recordings of that shape: every recording is also
a real run.  The code that evaluates is the code imported, so two versions of
the model judge the same recordings: run ``evaluate`` from each checkout.

The recordings are Python pickles: evaluate only the ones you made.

Usage: ``python benchmarks/whatif_sets.py record DIR [--rounds N]`` then
``python benchmarks/whatif_sets.py evaluate DIR``
"""

from __future__ import annotations

import argparse
import logging
import pickle
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from tpch import generate
from whatif_realcode import CASES, PARTS, POINT_TARGET, SCALE, WORKLOADS, Config, calibrate
from whatif_validation import record

SHAPES: list[Config] = [(1, 1), (1, 2), (2, 1)]


def _on(shape: Config) -> str:
    return f"{shape[0]}×{shape[1]}"


def _change(change: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in change.items())


def record_sets(directory: Path, rounds: int) -> None:
    """Record ``rounds`` rounds of every workload on every shape of :data:`SHAPES`."""
    logging.getLogger("distributed.shuffle._scheduler_plugin").setLevel(logging.ERROR)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="whatif-tpch-") as data:
        params = {"loops": calibrate(), "data": generate(Path(data), SCALE, PARTS)}
        for round_ in range(rounds):
            for name, workload in WORKLOADS.items():
                for shape in SHAPES:
                    pag, load = record(workload, *shape, **params)
                    path = directory / f"{name}-{shape[0]}x{shape[1]}-{round_}.pickle"
                    path.write_bytes(pickle.dumps((pag, load)))
                    print(f"{name} on {_on(shape)}, round {round_ + 1}/{rounds}: "
                          f"{pag.what_if().recorded:.3f} s", flush=True)


def evaluate(directory: Path) -> pd.DataFrame:
    """Every case of every recording in ``directory``, predicted with the code imported:
    its error against the median of the recordings of its changed shape."""
    recordings: dict[tuple[str, Config], list[Any]] = {}
    for path in sorted(directory.glob("*.pickle")):
        name, shape, _ = path.stem.split("-")
        workers, threads = map(int, shape.split("x"))
        recordings.setdefault((name, (workers, threads)), []).append(
            pickle.loads(path.read_bytes()))
    made = {key: statistics.median(pag.what_if().recorded for pag, _ in found)
            for key, found in recordings.items()}
    rows = []
    for (name, shape), found in recordings.items():
        for recorded_on, change, changed in CASES:
            if recorded_on != shape or (name, changed) not in made:
                continue
            for pag, load in found:
                result = pag.what_if(load=load, **change)
                rows.append({"workload": name, "recorded_on": _on(shape),
                             "change": _change(change), "recorded": result.recorded,
                             "predicted": result.makespan, "measured": made[name, changed],
                             "replay_error": result.replay_error, "range": result.range})
    return pd.DataFrame(rows)


def summarize(rows: pd.DataFrame) -> None:
    """The counts and errors of :func:`evaluate`'s cases, and each case's median error."""
    error = rows["predicted"] / rows["measured"] - 1
    point = rows["range"].isna()
    ranged = rows[~point]
    inside = sum(low <= measured <= high
                 for (low, high), measured in zip(ranged["range"], ranged["measured"]))
    within = error.abs() <= POINT_TARGET
    rho = (rows["predicted"] / rows["recorded"]).rank().corr(
        (rows["measured"] / rows["recorded"]).rank())
    print(f"within ±{POINT_TARGET:.0%}: {within.sum()}/{len(rows)}; median abs error "
          f"{error.abs().median():.1%}, mean {error.abs().mean():.1%}; points within: "
          f"{within[point].sum()}/{point.sum()}; measured inside the range: "
          f"{inside}/{len(ranged)}; worst unchanged replay "
          f"{rows['replay_error'].abs().max():.1%}; rank correlation {rho:.2f}")
    cases = rows.assign(error=error).groupby(["workload", "recorded_on", "change"],
                                             sort=False)["error"]
    for (name, recorded_on, change), errors in cases:
        print(f"  {name:<7} {recorded_on} {change:<10} median error {errors.median():+.1%} "
              f"({len(errors)} recordings)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["record", "evaluate"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--rounds", type=int, default=3, help="recordings of each shape")
    args = parser.parse_args()
    if args.action == "record":
        record_sets(args.directory, args.rounds)
    else:
        summarize(evaluate(args.directory))


if __name__ == "__main__":
    main()
