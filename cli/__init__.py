"""The ``crux-dask`` command (also ``dask crux`` through the ``dask_cli`` entry point)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import click

from crux_dask.path import STAGES
from crux_dask.wcp import CriticalPath

if TYPE_CHECKING:
    import pandas as pd

    from crux_dask.pag import PAG
    from crux_dask.scaling import Scaling


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
        busy=(frame["busy"] + frame["io"]).round(3),
        client=frame["client"].round(3),
        **{part: frame[part].round(3) for part in STAGES},
        sched=(frame["scheduling"] + frame["queued"]).round(3),
        wait=frame["wait"].round(3),
    )[["step", "via", "kind", "key", "straggler", "source", "destination", "at", "busy",
       "client", *STAGES, "sched", "wait"]]
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
@click.option("--report", "report_file", default="crux-report.html", show_default=True,
              help="Where to write the standalone HTML report of the run.")
@click.option("--serve", is_flag=True,
              help="Keep the cluster and its dashboard up until Ctrl-C.")
def demo(workers: int, slow: float, report_file: str, serve: bool) -> None:
    import dask
    from distributed import Client, LocalCluster

    import crux_dask
    from crux_dask.dashboard.report import report_html

    with LocalCluster(n_workers=workers, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        started = time.time()
        result = dask.compute(etl_workflow(slow))[0]
        elapsed = time.time() - started
        pag, load = crux_dask.get_pag(client), crux_dask.get_load(client)
        functions = crux_dask.get_functions(client)
        path = pag.wcp()
        click.echo(f"Workflow result: {result:,.1f} in {elapsed:.2f} s "
                   f"({len(pag):,} data states, {len(pag.mutations):,} mutations)\n")
        click.echo(format_path(path))
        click.echo(f"\n{format_prefixes(path, functions)}")
        click.echo(f"\n{format_suggestions(pag, pag.run_ids[-1], load)}")
        with open(report_file, "w") as f:
            f.write(report_html(pag, load=load, functions=functions))
        click.echo(f"\nReport: {report_file}")
        if serve:
            click.echo(f"Dashboard: {client.dashboard_link.replace('/status', '/crux')} "
                       "(Ctrl-C to stop)")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                click.echo("Stopping the cluster.")


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


@main.command(help="Run one of the thesis's HPC workflow cases and print its critical path.")
@click.argument("case", required=False)
@click.option("--list", "list_cases", is_flag=True, help="List the cases and exit.")
@click.option("--workers", default=2, show_default=True, help="Worker processes.")
@click.option("--ranks", default=None, type=int, help="MPI ranks per simulation.")
@click.option("--scale", default=None, type=float, help="Multiply every duration.")
@click.option("--seed", default=None, type=int, help="Picks the slowest rank.")
@click.option("--config", "config_file", default=None, type=click.Path(exists=True),
              help="YAML file of simulation settings.")
@click.option("--out", default=None, type=click.Path(),
              help="Export the provenance to this dataset directory.")
def sim(case: str | None, list_cases: bool, workers: int, ranks: int | None,
        scale: float | None, seed: int | None, config_file: str | None,
        out: str | None) -> None:
    from crux_dask.sim_workflows import CASES, SimConfig, run_case

    if list_cases or case is None:
        for name, (_, description) in CASES.items():
            click.echo(f"{name:<11} {description}")
        return
    settings = {}
    if config_file:
        import yaml

        with open(config_file) as f:
            settings = yaml.safe_load(f) or {}
    settings.update({k: v for k, v in (("ranks", ranks), ("scale", scale), ("seed", seed))
                     if v is not None})
    try:
        config = SimConfig.from_dict(settings)
        if case not in CASES:
            raise ValueError(f"unknown case {case!r}; cases: {', '.join(CASES)}")
    except ValueError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(2)
    result = run_case(case, config, workers=workers, out=out, show_progress=True)
    click.echo(f"\nCase {case}: makespan {result.makespan:.2f} s, configured critical work "
               f"{result.case.critical_seconds:.2f} s\n")
    click.echo(format_path(result.path))
    if result.dataset:
        click.echo(f"\nProvenance written to {result.dataset}")


@main.command(help="Run a recorded run again from its provenance and report the fidelity.")
@click.argument("path", type=click.Path())
@click.option("--run", "run_id", default=None, help="Run id (default: the latest).")
@click.option("--workers", default=None, type=int, help="Worker processes (default: as "
              "recorded).")
def replay(path: str, run_id: str | None, workers: int | None) -> None:
    from crux_dask.sim_workflows import replay as replay_run

    _load(path, run_id)  # a bad dataset ends here, with its message
    fidelity = replay_run(path, run_id, workers=workers)
    click.echo(fidelity.summary())


def _load(path: str, run: str | None = None):
    """Read a dataset; a bad one ends the command with its message and status 2."""
    from crux_dask.provenance import ProvenanceError, read_dataset

    try:
        return read_dataset(path, run)
    except ProvenanceError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(2)


@main.command(help="Summarise the critical path of a run of an exported dataset.")
@click.argument("path", type=click.Path())
@click.option("--run", "run_id", default=None, help="Run id (default: the latest).")
@click.option("--computation", type=int, default=None,
              help="The path of one computation: its index in the table (-1: the latest).")
@click.option("--span", default=None, help="The path of one span: its id, name or last tag.")
@click.option("--html", "html_file", default=None, type=click.Path(),
              help="Also write the path as a standalone HTML page.")
def report(path: str, run_id: str | None, computation: int | None, span: str | None,
           html_file: str | None) -> None:
    from crux_dask.groups import key_groups
    from crux_dask.provenance import read_functions, read_load, read_scopes
    from crux_dask.scopes import scope_path, scopes_frame, select

    pag = _load(path, run_id)
    run_id = run_id or pag.run_ids[-1]
    store = pag.store(run_id)
    scopes = read_scopes(path, run_id)
    click.echo(f"Run {run_id}: {store.n_states:,} data states\n")
    groups = key_groups(store) if scopes else None
    if computation is None and span is None:
        path_ = pag.wcp(run_id=run_id)
    else:
        try:
            scope = select(scopes, computation, span)
        except ValueError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(2)
        click.echo(f"The {scope.kind} {scope.name!r}:")
        path_ = scope_path(store, scope, groups)
    click.echo(format_path(path_))
    click.echo(f"\n{format_prefixes(path_, read_functions(path, run_id))}")
    if scopes and computation is None and span is None:
        table = scopes_frame(store, scopes, groups)
        click.echo("\nComputations and spans (see --computation and --span):")
        click.echo(table.assign(start=table["start"] - table["start"].min())[
            ["kind", "name", "start", "makespan", "tasks", "path_length", "top_categories"]
        ].to_string(float_format=lambda x: f"{x:.3f}"))
    click.echo(f"\n{format_suggestions(pag, run_id, read_load(path, run_id))}")
    if html_file:
        with open(html_file, "w") as f:
            f.write(f"<!doctype html><html><head><meta charset='utf-8'><title>Crux run "
                    f"{run_id}</title></head><body>{path_._repr_html_()}</body></html>")
        click.echo(f"\nWrote {html_file}")


@main.command(help="Write the graph a scheduler that did not close left in its spool "
                   "directory (its journal) as a dataset.")
@click.argument("spool_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("path", type=click.Path())
def recover(spool_dir: str, path: str) -> None:
    from crux_dask.plugins.engine import recover as recover_graph
    from crux_dask.plugins.journal import journals
    from crux_dask.provenance import write_dataset

    left = journals(spool_dir)
    if not left:
        click.echo(f"error: no journal in {spool_dir}", err=True)
        sys.exit(2)
    failed = False
    for journal in left:
        try:
            pag = recover_graph(str(journal))
        except Exception as error:  # a damaged journal: the others are still written
            click.echo(f"error: could not recover the journal {journal}: {error!r}", err=True)
            failed = True
            continue
        write_dataset(path, pag)
        click.echo(f"Recording {journal.name}: {len(pag.states):,} data states in "
                   f"{len(pag.run_ids)} segment(s), written to {path}")
    if failed:
        sys.exit(2)


def format_prefixes(path: CriticalPath, functions: pd.DataFrame | None = None,
                    top: int = 10) -> str:
    """Where the path spends its time, by task prefix, as a text table (the first ``top``),
    with the code behind each prefix where the run's ``functions`` table says."""
    from crux_dask.functions import FunctionLog

    table = path.by_prefix()
    if table.empty:
        return "No step on the path."
    if functions is not None and len(functions):
        log = FunctionLog.of(functions)
        table = table.assign(code=table["prefix"].map(log.prefix_label))
    shown = table.head(top).assign(share=lambda t: (t["share"] * 100).map("{:.1f} %".format))
    more = f"\n... and {len(table) - top} more prefixes" if len(table) > top else ""
    return ("Where the path spends its time, by prefix:\n"
            + shown.to_string(index=False, float_format=lambda x: f"{x:.3f}") + more)


def format_suggestions(pag: PAG, run_id: str, load: pd.DataFrame | None = None) -> str:
    """What to fix in a run as text: the advice, with the figures behind each, then the
    what-if changes; a run that cannot be replayed says why."""
    from crux_dask.advice import SCALING_SHAPES

    try:
        table = pag.suggest(run_id=run_id, load=load)
    except ValueError as error:
        return f"No what-if suggestions: {error}"
    advice = table[table["kind"] == "advice"]
    said = "".join(f"* {row.change} ({row.path_share:.0%} of the path): {row.why}"
                   + (f": {row.predicted:.3f} s, saves {row.saved:+.3f} s\n"
                      if row.predicted == row.predicted else "\n")
                   for row in advice.itertuples())
    table = table[table["kind"] == "what-if"]
    table = table.assign(saved_share=(100 * table["saved_share"]).round(1),
                         range=[f"{low:.3f}-{high:.3f}" if high == high else ""
                                for low, high in zip(table["low"], table["high"])])
    columns = ["change", "predicted", *(["range"] * bool(table["high"].notna().any())), "saved",
               "saved_share", "path_then"]
    return ((f"Advice, from the path's stages and the load they ran under:\n{said}\n"
             if said else "")
            + "What if (predicted by replaying the run; most seconds saved first):\n"
            + table[columns].rename(columns={"saved_share": "saved %"})
            .to_string(index=False, float_format=lambda v: f"{v:.3f}")
            + f"\n(an unchanged replay predicts the recorded run "
              f"{table['replay_error'].iloc[0]:+.1%} off)\n\n"
            + format_scaling(pag.scaling(*SCALING_SHAPES, load=load, run_id=run_id)))


def format_scaling(scaling: Scaling) -> str:
    """How many workers are enough, as text: the shapes' predictions and the one named."""
    table = scaling.table.assign(enough=scaling.table["enough"].map({True: "<-", False: ""}))
    return ("How many workers are enough (the run replayed on each shape):\n"
            + table.to_string(index=False, float_format=lambda v: f"{v:.3f}")
            + f"\n{scaling.summary()}")


@main.command(help="Predict a changed run of an exported dataset by replaying it.")
@click.argument("path", type=click.Path())
@click.option("--run", "run_id", default=None, help="Run id (default: the latest).")
@click.option("--workers", default=None, type=int, help="Workers (default: as recorded).")
@click.option("--threads", default=None, type=int,
              help="Threads per worker (default: as recorded).")
@click.option("--speedup", multiple=True, metavar="PREFIX=K",
              help="Make a task prefix K times faster; repeatable.")
@click.option("--transfer-speedup", default=None, type=float,
              help="Make transfers K times faster ('inf': free).")
@click.option("--no-spill", is_flag=True, help="Remove the time spent spilling.")
@click.option("--stragglers-at-median", is_flag=True,
              help="Each straggler computes for its task group's median seconds.")
@click.option("--scaling", "shapes", is_flag=True,
              help="Predict the run on 1-8 workers x 1, 2, 4 threads instead.")
def whatif(path: str, run_id: str | None, workers: int | None, threads: int | None,
           speedup: tuple[str, ...], transfer_speedup: float | None, no_spill: bool,
           stragglers_at_median: bool, shapes: bool) -> None:
    from crux_dask.provenance import read_load

    pag = _load(path, run_id)
    load = read_load(path, run_id)
    if shapes:
        click.echo(format_scaling(pag.scaling(load=load, run_id=run_id)))
        return
    try:
        factors = {}
        for item in speedup:
            prefix, sep, factor = item.rpartition("=")
            if not sep or not prefix:
                raise ValueError(f"--speedup takes PREFIX=K, got {item!r}")
            factors[prefix] = float(factor)
        result = pag.what_if(workers=workers, threads=threads, speedup=factors or None,
                             transfer_speedup=transfer_speedup, spill=not no_spill,
                             run_id=run_id, load=load,
                             stragglers="median" if stragglers_at_median else None)
    except ValueError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(2)
    click.echo(result.summary())
    click.echo("Makespan: from the graph's arrival at the scheduler to the run's end.\n")
    click.echo(format_path(result.path))


@main.command(help="Compare runs side by side: makespan, critical path, variable steps.")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--top", default=5, show_default=True, help="Steps to list.")
def compare(paths: tuple[str, ...], top: int) -> None:
    from crux_dask.compare import compare_runs

    pags = [_load(p) for p in paths]
    summary, steps = compare_runs(pags)
    click.echo(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    click.echo(f"\nSteps whose duration varies most between runs (top {top}):")
    click.echo(steps.head(top).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


@main.command(help="Write a Chrome trace (Perfetto, chrome://tracing) of an exported run.")
@click.argument("path", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(), help="The .json to write.")
@click.option("--run", "run_id", default=None, help="Run id (default: the latest).")
def trace(path: str, output: str, run_id: str | None) -> None:
    import json

    from crux_dask.trace import chrome_trace

    pag = _load(path, run_id)
    events = chrome_trace(pag, run_id)
    with open(output, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    click.echo(f"Wrote {len(events):,} trace events to {output}")
