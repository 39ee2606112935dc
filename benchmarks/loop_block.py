"""How long Crux holds the scheduler's event loop at a stretch, on a graph of a million states.

A scheduler with Crux preloaded runs in its own process (``dask scheduler``,
no workers).  A watcher on its event loop wakes every millisecond and keeps
the longest delay past that.  Each phase is measured apart:

``ingest``
    a synthetic layered workflow's events (``core_scale.workflow_events``),
    encoded in batches of 5,000 as workers send them, sent to Crux's handler
    and applied (by the graph process, and the rows it made appended to the
    scheduler's copy);
``get_pag``, ``get_wcp``, ``export``
    the whole graph to the client, its critical path, and ``export_parquet``,
    three times each (the worst is kept);
``dashboard``
    the Crux tab's pages fetched over HTTP, each building its components and,
    within a few seconds, showing the graph's critical path (served by the
    graph process and relayed by the scheduler, the default; served by the
    scheduler itself with ``--graph-process false``); beside them,
    for reference, pages of distributed's own dashboard (``/status``, the
    task stream, the progress bars): making a Bokeh document of a page
    holds the loop whatever the page shows.  With ``--browser``, the pages
    are opened in headless Chromium instead, which also pulls each page's
    models and follows its changes over a websocket.  A page of distributed's
    is served first, unmeasured: the first page a scheduler serves hashes
    Bokeh's static files on the event loop.

It first watches the scheduler for ten seconds with nothing asked of it:
what distributed's own periodic work holds the loop for.  Beside each
stretch it prints the longest garbage collection of the scheduler's
interpreter in the same phase (a collection, in whatever thread it starts,
holds every thread, the event loop's too), and the longest of those Bokeh
asks for itself: when its server discards the session of a page that was
closed (distributed checks every half second), ``Document.destroy`` calls
``gc.collect()``, on the loop, whoever's page it was: the route of that page
is printed with it.  A stretch that holds such a collection for a page of
distributed's (the warm-up page's session is discarded a quarter of a
minute after it closed, during whichever phase runs then) is printed apart
and not counted.

Target: no stretch above 10 ms because of Crux, and never distributed's
"event loop was unresponsive" warning.

With ``--max-states N``, the scheduler spools its graph to disk past ``N``
states (``crux-dask.max-states``): the export then reads the spooled segments
back too.

Usage: ``python benchmarks/loop_block.py [--tasks N] [--browser] [--max-states N]
[--graph-process false]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from distributed import Client

import crux_dask
from crux_dask.plugins.protocol import EVENTS_HANDLER

sys.path.insert(0, str(Path(__file__).parent))
from core_scale import encode

TARGET = 0.010
REPEATS = 3  # of the phases after the ingest: the worst is reported
PAGES = ["/individual-crux-timeline", "/individual-crux-breakdown", "/individual-crux-steps",
         "/individual-crux-overview", "/individual-crux-prefixes", "/crux"]
#: Pages of distributed's own dashboard, for reference: what making a Bokeh page
#: costs the event loop anyway.
REFERENCE_PAGES = ["/status", "/individual-task-stream", "/individual-progress"]
WARM_UP = "/individual-workers"
IDLE = 10.0  # seconds the scheduler is watched before anything is asked of it
#: Seconds left to each page to compute what it shows (off the event loop) and show it.
SHOWN_WITHIN = 3.0


def _asked_by_bokeh_discard() -> str | None:
    """If the collection starting now was asked for by Bokeh's ``Document.destroy``, which
    calls ``gc.collect()`` when the server discards the session of a closed page, the
    route of that page (else ``None``)."""
    frame = sys._getframe(2)
    asked = False
    while frame is not None:
        code = frame.f_code
        if "bokeh" in code.co_filename:
            if code.co_name == "destroy" and code.co_filename.endswith("document.py"):
                asked = True
            elif asked and code.co_name == "do_discard":  # in ApplicationContext
                return str(getattr(frame.f_locals.get("self"), "url", "?"))
        frame = frame.f_back
    return "?" if asked else None


async def start_watch(dask_scheduler) -> None:
    """A task on the scheduler's loop that notes its longest delay past a 1 ms sleep, and
    a timer of the interpreter's garbage collections (in any thread: one holds them all),
    which tells apart those Bokeh asks for when it discards a closed page's session."""
    import gc

    state = dask_scheduler._crux_loop_watch = {"longest": 0.0, "gc": 0.0, "discard": 0.0,
                                               "discarded": "", "others": 0.0,
                                               "excused": False, "stop": False}
    started, asked = [0.0], [None]

    def collection(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            asked[0] = _asked_by_bokeh_discard()
        else:
            seconds = time.perf_counter() - started[0]
            state["gc"] = max(state["gc"], seconds)
            if asked[0] is not None and seconds > state["discard"]:
                state["discard"], state["discarded"] = seconds, asked[0]
            if asked[0] is not None and not _is_crux_page(asked[0]):
                state["excused"] = True  # the stretch it is in is distributed's page's

    gc.callbacks.append(collection)

    async def watch() -> None:
        last = time.perf_counter()
        while not state["stop"]:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            if state["excused"]:
                state["excused"] = False
                state["others"] = max(state["others"], now - last - 0.001)
            else:
                state["longest"] = max(state["longest"], now - last - 0.001)
            last = now

    state["task"] = asyncio.ensure_future(watch())


def _is_crux_page(route: str) -> bool:
    return route.rstrip("/").rsplit("/", 1)[-1].startswith(("crux", "individual-crux"))


def longest_since_reset(dask_scheduler) -> tuple[float, float, float, str, float]:
    """Since the last reset (and reset them): the longest delay, the longest garbage
    collection, the longest one Bokeh asked for and the route of the page whose session it
    discarded, and the longest delay that held a collection Bokeh asked for to discard a
    page of distributed's (not counted in the first)."""
    state = dask_scheduler._crux_loop_watch
    longest = (state["longest"], state["gc"], state["discard"], state["discarded"],
               state["others"])
    state["longest"] = state["gc"] = state["discard"] = state["others"] = 0.0
    state["discarded"] = ""
    return longest


def states(dask_scheduler) -> int:
    return dask_scheduler.plugins["crux"].builder.store.n_states


def export(client: Client) -> None:
    with tempfile.TemporaryDirectory() as out:
        crux_dask.export_parquet(client, out)


def fetch(url: str) -> None:
    with urllib.request.urlopen(url, timeout=300) as response:
        response.read()


def open_in_chromium() -> Callable[[str], None]:
    """A function that opens a page in headless Chromium (which stays open until exit)."""
    import atexit

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    atexit.register(driver.quit)
    return driver.get


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=400_000)
    parser.add_argument("--browser", action="store_true",
                        help="open the pages in headless Chromium (with chromedriver)")
    parser.add_argument("--max-states", type=int, default=None,
                        help="spool the graph to disk past this many states")
    parser.add_argument("--graph-process", choices=["true", "false"], default="true",
                        help="build the graph, and serve the pages, in a process of its own")
    args = parser.parse_args()
    batches, n_events, _ = encode(args.tasks)
    environment = dict(os.environ, DASK_CRUX_DASK__GRAPH_PROCESS=args.graph_process)
    if args.max_states is not None:
        environment["DASK_CRUX_DASK__MAX_STATES"] = str(args.max_states)
    with tempfile.TemporaryDirectory() as directory, \
            open(Path(directory) / "scheduler.log", "w+") as log:
        scheduler_file = Path(directory) / "scheduler.json"
        scheduler = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", "0", "--dashboard-address", "127.0.0.1:0", "--scheduler-file",
             str(scheduler_file), "--preload", "crux_dask.plugins"], stderr=log,
            env=environment)
        try:
            while not scheduler_file.exists():
                time.sleep(0.1)
            with Client(scheduler_file=str(scheduler_file)) as client:
                run(client, batches, n_events, args.browser)
        finally:
            scheduler.terminate()
            scheduler.wait()
            log.seek(0)
            warnings = [line for line in log if "unresponsive" in line]
            print(f"'event loop unresponsive' warnings in the scheduler's log: {len(warnings)}")
            for line in warnings:
                print("   ", line.strip())


def run(client: Client, batches: list[bytes], n_events: int, browser: bool) -> None:
    client.run_on_scheduler(start_watch)
    client.run_on_scheduler(longest_since_reset)
    results: dict[str, tuple] = {}

    def note(phase: str, measured: tuple, name: str) -> None:
        results[phase] = max(results.get(phase, (0.0, 0.0, 0.0, "", 0.0)), tuple(measured))
        whose = f" of {measured[3]}" if measured[3] else ""
        others = (f"; a stretch holding one of distributed's pages' {measured[4] * 1e3:.1f} "
                  "ms, not counted" if measured[4] else "")
        print(f"  {name}: {measured[0] * 1e3:.1f} ms (longest garbage collection "
              f"{measured[1] * 1e3:.1f} ms; asked for by Bokeh discarding a closed page's "
              f"session {measured[2] * 1e3:.1f} ms{whose}{others})", flush=True)

    # What the loop holds with nothing asked of it (distributed's own periodic work).
    time.sleep(IDLE)
    note("idle", client.run_on_scheduler(longest_since_reset), f"idle {IDLE:.0f} s")
    started = time.perf_counter()
    for batch in batches:
        client.sync(getattr(client.scheduler, EVENTS_HANDLER), batch=batch, source="benchmark")
    crux_dask.flush(client)
    results["ingest"] = tuple(client.run_on_scheduler(longest_since_reset))
    n_states = client.run_on_scheduler(states)
    stats = crux_dask.get_stats(client)
    if stats["segments_spooled"]:
        print(f"spooled: {stats['segments_spooled']} segments, "
              f"{stats['states_spooled']:,} states")
    print(f"ingest: {n_events:,} events, {n_states:,} states in "
          f"{time.perf_counter() - started:.1f} s; the longest stretch of Crux's own "
          f"account (applying, or appending what its graph process sent) "
          f"{stats['longest_slice_seconds'] * 1e3:.1f} ms")

    for phase, call in [("get_pag", lambda: crux_dask.get_pag(client)),
                        ("get_wcp", lambda: crux_dask.get_wcp(client)),
                        ("export", lambda: export(client))] * REPEATS:
        call()
        note(phase, client.run_on_scheduler(longest_since_reset), phase)
    address = client.dashboard_link.rsplit("/", 1)[0]
    open_page = open_in_chromium() if browser else fetch
    # The first page a scheduler serves hashes Bokeh's static files, on the event loop
    # (a fifth of a second, once): whichever page comes first pays it, so none measured.
    open_page(address + WARM_UP)
    time.sleep(SHOWN_WITHIN)
    note("warm-up", client.run_on_scheduler(longest_since_reset), f"{WARM_UP} (warm-up)")
    for page in PAGES + REFERENCE_PAGES:
        open_page(address + page)
        time.sleep(SHOWN_WITHIN)  # what the page computes in a thread is shown meanwhile
        phase = "dashboard" if page in PAGES else "distributed's own pages"
        note(phase, client.run_on_scheduler(longest_since_reset), page)

    print(f"\nlongest stretch the scheduler's event loop was held, per phase "
          f"({n_states:,} states; target <= {TARGET * 1e3:.0f} ms), and the longest "
          f"garbage collection of the interpreter in it (and of those Bokeh asked for "
          f"when it discarded a closed page's session):")
    for phase, (seconds, collection, discard, whose, _) in results.items():
        mark = "" if seconds <= TARGET else "   NOT met"
        whose = f" of {whose}" if whose else ""
        print(f"  {phase:<24} {seconds * 1e3:8.1f} ms   gc {collection * 1e3:6.1f} ms "
              f"(Bokeh's {discard * 1e3:6.1f} ms{whose}){mark}")


if __name__ == "__main__":
    main()
