"""Killed processes lose nothing that was recorded.

The graph process is killed with SIGKILL in the middle of a run on a real
cluster: the process that resumes from the journal builds the graph that the
same entries make without the kill (an engine in this process, fed every entry
the scheduler sent).  A scheduler killed in the middle of a run leaves a
journal that reads back as the graph made durable before the kill.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import time

import dask
import psutil
import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import poll_for

import crux_dask
from crux_dask.graph.builder import PAGBuilder
from crux_dask.pag import PAG
from crux_dask.plugins import CruxSchedulerPlugin
from crux_dask.plugins.engine import PROCESS_SLICE, Engine, recover
from crux_dask.plugins.ingest import Ingest
from crux_dask.plugins.journal import journals
from crux_dask.plugins.spool import Spool
from crux_dask.wcp import critical_path


def nap(*inputs: int, seconds: float = 0.02) -> int:
    time.sleep(seconds)
    return sum(inputs) + 1


def layers(width: int, depth: int) -> list[list]:
    """``depth`` layers of ``width`` naps, each of the two above it: fetches between workers."""
    every = [[dask.delayed(nap)(dask_key_name=f"l0-{i}") for i in range(width)]]
    for d in range(1, depth):
        above = every[-1]
        every.append([dask.delayed(nap)(above[i], above[(i + 1) % width],
                                        dask_key_name=f"l{d}-{i}") for i in range(width)])
    return every


def layered(width: int, depth: int) -> list:
    """The last of :func:`layers`."""
    return layers(width, depth)[-1]


def canonical(pag: PAG) -> tuple[list, list]:
    """States and mutations with their ids replaced by what they are."""
    states = pag.states.set_index("state_id")
    named = states[["key", "location", "time", "size"]].apply(tuple, axis=1)
    rows = sorted(named.tolist())
    edges = sorted(zip(named.loc[pag.mutations["src"]].tolist(),
                       named.loc[pag.mutations["dst"]].tolist(),
                       pag.mutations["kind"].astype(str).tolist(), strict=True))
    return rows, edges


def reference(messages: list[tuple], run_id: str, park_timeout: float) -> PAG:
    """The graph ``messages`` (every ``entries`` message the scheduler sent) make in an
    engine nobody kills."""
    engine = Engine(Ingest(PAGBuilder(run_id=run_id), Spool(None, None), max_pending=10**9,
                           park_timeout=park_timeout, slice_events=PROCESS_SLICE,
                           slice_seconds=None))
    for message in messages:
        engine.take(pickle.dumps(message))
        while engine.busy():
            engine.slice()
    engine.resolve(everything=True)
    builder = engine.ingest.builder
    return PAG([builder.store], [builder.end])


def test_a_graph_process_killed_mid_run_is_resumed_and_loses_nothing(tmp_path):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        # The scheduler's side first, to see every message from the first (attach sends
        # what it recorded so far as soon as the process is up).
        client.register_plugin(CruxSchedulerPlugin())
        host = cluster.scheduler.plugins["crux"].host
        sent: list[tuple] = []
        send = host._send
        host._send = lambda entries: (sent.append(("entries", len(sent), list(entries))),
                                      send(entries))[1]
        crux_dask.attach(client)
        futures = client.compute(layered(8, 40))
        poll_for(lambda: host.remote["pid"] is not None and host.progress().n_states > 40,
                 timeout=30)
        assert not all(future.done() for future in futures)  # mid-run
        pid = host.remote["pid"]
        os.kill(pid, signal.SIGKILL)
        assert sum(client.gather(futures)) > 0
        poll_for(lambda: host.restarts == 1 and host.remote["pid"] != pid, timeout=30)
        client.run(crux_dask.plugins.worker.flush_worker)
        pag = crux_dask.get_pag(client)
        path = crux_dask.get_wcp(client)
        stats = crux_dask.get_stats(client)
        exported = crux_dask.read_parquet(crux_dask.export_parquet(client, tmp_path / "out"))
        messages = list(sent)  # not what closing the cluster sends
        run_id = host.settings["run_id"]
        park_timeout = host.settings["park_timeout"]
    assert stats["graph_process"]["restarts"] == 1
    assert "restarted" in stats["last_error"]
    assert stats["events_dropped"] == 0
    unkilled = reference(messages, run_id, park_timeout)
    assert len(pag.states) == len(unkilled.states) > 8 * 40
    assert canonical(pag) == canonical(unkilled)
    assert canonical(exported) == canonical(unkilled)
    expected = critical_path(unkilled.stores[0], default_end=unkilled.ends[0])
    assert path.to_frame()["key"].tolist() == expected.steps["key"].tolist()
    assert path.length == pytest.approx(expected.length)


#: A scheduler that computes ``layers(8, N)`` a layer at a time, and says which
#: layers are durable: each layer's tasks reported, sent and acknowledged.
SCHEDULER = """
import sys, threading
import dask
from distributed import Client, LocalCluster
from distributed.utils_test import poll_for
import crux_dask
from crux_dask.plugins.worker import flush_worker
from test_crash import layers

if __name__ == "__main__":
    with dask.config.set({"crux-dask.spool-dir": sys.argv[1]}), \\
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \\
            Client(cluster) as client:
        crux_dask.attach(client)
        host = cluster.scheduler.plugins["crux"].host
        held = []  # each layer's results, for the next
        for depth, layer in enumerate(layers(8, int(sys.argv[2]))):
            held.append(client.compute(layer))
            client.gather(held[-1])
            client.run(flush_worker)
            sent = host.received
            poll_for(lambda: host.sent >= sent and not host._unacked, timeout=30)
            print("durable", depth, flush=True)
        threading.Event().wait()  # until it is killed
"""


def test_a_killed_scheduler_leaves_a_journal_that_reads_back_as_what_was_durable(tmp_path):
    script = tmp_path / "scheduler.py"
    script.write_text(SCHEDULER)
    spool = tmp_path / "spool"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, str(script), str(spool), "6"],
                               stdout=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        durable = [line.split()[1] for line in _lines(process, until="durable 3")]
        (child,) = [p for p in psutil.Process(process.pid).children()
                    if "crux_dask.plugins.graph_child" in " ".join(p.cmdline())]
        os.kill(process.pid, signal.SIGKILL)  # the scheduler, nothing else
        process.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its workers and graph process
    assert durable == ["0", "1", "2", "3"]
    child.wait(30)  # the graph process saw the scheduler go, and left its journal
    (journal,) = journals(str(spool))
    pag = recover(str(journal))
    keys = set(pag.states["key"])
    assert {f"l{d}-{i}" for d in range(4) for i in range(8)} <= keys
    # The command line writes the same graph as a dataset.
    out = tmp_path / "recovered"
    result = subprocess.run([sys.executable, "-m", "crux_dask.cli", "recover", str(spool),
                             str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert canonical(crux_dask.read_parquet(out)) == canonical(pag)


def _lines(process: subprocess.Popen, until: str) -> list[str]:
    lines = []
    for line in process.stdout:
        if line.startswith("durable"):
            lines.append(line.strip())
        if line.strip() == until:
            return lines
    raise AssertionError(f"the scheduler ended before {until!r}: {lines}")
