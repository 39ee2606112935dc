"""The ``crux-dask`` command (also ``dask crux`` through the ``dask_cli`` entry point)."""

from __future__ import annotations

import time

import click

from crux_dask.wcp import CriticalPath


@click.group(name="crux", help="Workflow critical paths of Dask workflows.")
def main() -> None:
    pass


def format_path(path: CriticalPath, max_key: int = 40) -> str:
    """The steps of a critical path and its breakdown, as a text table."""
    frame = path.to_frame()
    if frame.empty:
        return path.summary()
    t0 = path.states["time"].iloc[0]
    table = frame.assign(
        key=frame["key"].str.slice(0, max_key),
        source=frame["source"].map(_short_location),
        destination=frame["destination"].map(_short_location),
        at=(frame["stop"] - t0).round(3),
        busy=frame["busy"].round(3),
        wait=frame["wait"].round(3),
    )[["step", "kind", "key", "source", "destination", "at", "busy", "wait"]]
    return f"{table.to_string(index=False)}\n\n{path.summary()}"


def _short_location(location: str) -> str:
    head, sep, rest = location.partition("@")
    if sep and head in ("memory", "disk"):
        return f"{head}@{rest.rpartition(':')[2]}"  # the worker's port is enough here
    return location


@main.command(help="Run a small ETL workflow on a LocalCluster and print its critical path.")
@click.option("--workers", default=2, show_default=True, help="Worker processes.")
@click.option("--slow", default=1.0, show_default=True,
              help="Seconds the slowest partition takes to load.")
def demo(workers: int, slow: float) -> None:
    import dask
    from distributed import Client, LocalCluster

    import crux_dask

    with LocalCluster(n_workers=workers, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        click.echo(f"Dashboard: {client.dashboard_link}")
        started = time.time()
        result = dask.compute(etl_workflow(slow))[0]
        elapsed = time.time() - started
        path = crux_dask.get_wcp(client)
        stats = crux_dask.get_stats(client)
    click.echo(f"Workflow result: {result:,.1f} in {elapsed:.2f} s "
               f"({stats['states']:,} data states, {stats['mutations']:,} mutations)\n")
    click.echo(format_path(path))


def etl_workflow(slow: float):
    """Load 8 partitions (one slow), clean them, join neighbours, and reduce."""
    import dask
    import numpy as np

    @dask.delayed(pure=True)
    def load(i: int, seconds: float) -> np.ndarray:
        time.sleep(seconds)  # reading a file
        return np.random.default_rng(i).random(1_000_000)

    @dask.delayed(pure=True)
    def clean(part: np.ndarray) -> np.ndarray:
        return np.sort(part[part > 0.1])

    @dask.delayed(pure=True)
    def join(left: np.ndarray, right: np.ndarray) -> float:
        return float(np.searchsorted(left, right[::1000]).sum())

    @dask.delayed(pure=True)
    def report(values: list[float]) -> float:
        return sum(values)

    parts = [clean(load(i, slow if i == 5 else 0.1)) for i in range(8)]
    joined = [join(parts[i], parts[(i + 1) % 8]) for i in range(8)]
    return report(joined)


if __name__ == "__main__":
    main()
