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
    three times each (the worst is kept); each call's wall time is printed,
    and how far the scheduler's resident memory rose above where it was;
``dashboard``
    the Crux tab's pages fetched over HTTP, each building its components and,
    within a few seconds, showing the graph's critical path (served by the
    scheduler, what they show computed in the graph process, the default, or
    in a thread of the scheduler with ``--graph-process false``); beside them,
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

For the longest stretch of each phase it also prints how long the event
loop's thread ran in it and how long it waited for a core (the kernel's
``schedstat`` of that thread): a stretch spent waiting for a core is the
machine's other work (the client, the graph process, whatever else runs); the
rest, neither running nor queued, is waiting for the interpreter's lock, held
by another thread of the scheduler, or for a call that blocks.

Target: no stretch above 10 ms because of Crux, and never distributed's
"event loop was unresponsive" warning.

With ``--max-states N``, the scheduler spools its graph to disk past ``N``
states (``crux-dask.max-states``): the export then reads the spooled segments
back too.

Each callback the scheduler's event loop runs is timed: those of over 0.2 ms
run in the longest stretch of each phase are printed with it, and so is the
longest callback of the phase (a stretch can be one callback, or several run
in the same turn of the loop).  With ``--why``, a thread of the scheduler also
notes where the loop's thread is every half millisecond (holding the
interpreter itself, which makes stretches longer), and the places seen most
often in the longest stretch of each phase are printed with it.

Usage: ``python benchmarks/loop_block.py [--tasks N] [--browser] [--max-states N]
[--graph-process false] [--why]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
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
MEMORY_EVERY = 0.005  # seconds between two looks at the scheduler's memory
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


_RESET = {"longest": 0.0, "ran": 0.0, "queued": 0.0, "gc": 0.0, "discard": 0.0,
          "discarded": "", "others": 0.0, "where": "", "callback": 0.0, "callback_of": "",
          "faults": 0, "callbacks": ""}
#: Seconds between two looks at where the event loop's thread is (``--why``).
SAMPLE_EVERY = 0.0005


def _sampler(loop_thread: int, samples: collections.deque) -> None:
    """Note, every :data:`SAMPLE_EVERY` seconds, the time and the innermost frames of the
    event loop's thread (a thread of the scheduler's process; ``--why``)."""
    while True:
        frame = sys._current_frames().get(loop_thread)
        where = []
        while frame is not None and len(where) < 4:
            code = frame.f_code
            where.append(f"{Path(code.co_filename).name}:{code.co_name}")
            frame = frame.f_back
        samples.append((time.perf_counter(), " < ".join(where)))
        time.sleep(SAMPLE_EVERY)


def _where(samples: collections.deque, since: float) -> str:
    """The places the loop's thread was seen most often since ``since``, with their count."""
    seen = collections.Counter(where for at, where in list(samples) if at >= since)
    return "; ".join(f"{count}x {where}" for where, count in seen.most_common(3))


def _name(callback: Any) -> str:
    """What a callback of the loop runs: a task's coroutine, or the function."""
    task = getattr(callback, "__self__", None)
    coroutine = task.get_coro() if isinstance(task, asyncio.Task) else None
    named = coroutine if coroutine is not None else callback
    return getattr(named, "__qualname__", type(named).__name__)


def _callbacks(callbacks: collections.deque, since: float) -> str:
    """The callbacks of over 0.2 ms run since ``since``, by name: how many, how long."""
    seconds: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for started, took, callback in list(callbacks):
        if started >= since:
            seconds[_name(callback)] += took
            counts[_name(callback)] += 1
    return "; ".join(f"{counts[name]}x {name} {took * 1e3:.1f} ms"
                     for name, took in seconds.most_common(4)) or "none over 0.2 ms"


async def start_watch(dask_scheduler, why: bool = False) -> None:
    """A task on the scheduler's loop that notes its longest delay past a 1 ms sleep, how
    long the loop's thread ran and waited for a core in that delay (the kernel's
    ``schedstat`` of the thread), and a timer of the interpreter's garbage collections (in
    any thread: one holds them all), which tells apart those Bokeh asks for when it
    discards a closed page's session."""
    import gc

    state = dask_scheduler._crux_loop_watch = {**_RESET, "excused": False, "stop": False}
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
    schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    stat = os.open("/proc/thread-self/stat", os.O_RDONLY)

    def ran_and_queued() -> tuple[int, int, int]:
        """Nanoseconds the loop's thread ran, and waited on a run queue, so far, and the
        page faults it took that read no disk (``minflt``; with ``--why`` only)."""
        ran, queued, _ = os.pread(schedstat, 128, 0).split()
        faults = int(os.pread(stat, 512, 0).rsplit(b")", 1)[1].split()[7]) if why else 0
        return int(ran), int(queued), faults

    samples: collections.deque = collections.deque(maxlen=20_000)
    callbacks: collections.deque = collections.deque(maxlen=20_000)
    if why:
        threading.Thread(target=_sampler, args=(threading.get_ident(), samples),
                         daemon=True, name="loop-sampler").start()
    run = asyncio.events.Handle._run

    def timed(handle: asyncio.Handle) -> None:  # every callback the loop runs
        started = time.perf_counter()
        run(handle)
        seconds = time.perf_counter() - started
        if seconds > 0.0002:
            callbacks.append((started, seconds, handle._callback))
        if seconds > state["callback"]:
            state["callback"], state["callback_of"] = seconds, _name(handle._callback)

    asyncio.events.Handle._run = timed

    async def watch() -> None:
        last, last_times = time.perf_counter(), ran_and_queued()
        while not state["stop"]:
            await asyncio.sleep(0.001)
            now, times = time.perf_counter(), ran_and_queued()
            delay = now - last - 0.001
            if state["excused"]:
                state["excused"] = False
                state["others"] = max(state["others"], delay)
            elif delay > state["longest"]:
                state["longest"] = delay
                state["ran"] = (times[0] - last_times[0]) / 1e9
                state["queued"] = (times[1] - last_times[1]) / 1e9
                state["faults"] = times[2] - last_times[2]
                state["where"] = _where(samples, last) if why else ""
                state["callbacks"] = _callbacks(callbacks, last)
            last, last_times = now, times

    state["task"] = asyncio.ensure_future(watch())


def _is_crux_page(route: str) -> bool:
    return route.rstrip("/").rsplit("/", 1)[-1].startswith(("crux", "individual-crux"))


def longest_since_reset(dask_scheduler) -> dict:
    """Since the last reset (and reset them): the longest delay (``longest``), how long the
    loop's thread ran and waited for a core in it (``ran``, ``queued``), the longest
    garbage collection, the longest one Bokeh asked for (``discard``) and the route of the
    page whose session it discarded, and the longest delay that held a collection Bokeh
    asked for to discard a page of distributed's (``others``, not counted in the first)."""
    state = dask_scheduler._crux_loop_watch
    longest = {name: state[name] for name in _RESET}
    state.update(_RESET)
    return longest


def states(dask_scheduler) -> int:
    return dask_scheduler.plugins["crux"].stats()["states"]  # reading the store appends it


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
    parser.add_argument("--why", action="store_true",
                        help="sample where the event loop's thread is, every half "
                             "millisecond, and print it for the longest stretches (the "
                             "sampling thread holds the interpreter itself: longer "
                             "stretches)")
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
                run(client, batches, n_events, args.browser, args.why, scheduler.pid)
        finally:
            scheduler.terminate()
            scheduler.wait()
            log.seek(0)
            warnings = [line for line in log if "unresponsive" in line]
            print(f"'event loop unresponsive' warnings in the scheduler's log: {len(warnings)}")
            for line in warnings:
                print("   ", line.strip())


class MemoryPeak:
    """How far a process's resident memory rose above where it was, in a ``with`` block
    (looked at every :data:`MEMORY_EVERY` seconds by a thread)."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self._done = threading.Event()
        self.grown = 0

    def __enter__(self) -> MemoryPeak:
        start = self._process.memory_info().rss

        def watch() -> None:
            while not self._done.wait(MEMORY_EVERY):
                self.grown = max(self.grown, self._process.memory_info().rss - start)

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def run(client: Client, batches: list[bytes], n_events: int, browser: bool,
        why: bool, scheduler_pid: int) -> None:
    client.run_on_scheduler(start_watch, why=why)
    client.run_on_scheduler(longest_since_reset)
    results: dict[str, dict] = {}

    def note(phase: str, measured: dict, name: str) -> None:
        if measured["longest"] >= results.get(phase, {"longest": -1.0})["longest"]:
            results[phase] = measured
        print(f"  {name}: {describe(measured)}", flush=True)

    # What the loop holds with nothing asked of it (distributed's own periodic work).
    time.sleep(IDLE)
    note("idle", client.run_on_scheduler(longest_since_reset), f"idle {IDLE:.0f} s")
    started = time.perf_counter()
    for batch in batches:
        client.sync(getattr(client.scheduler, EVENTS_HANDLER), batch=batch, source="benchmark")
    crux_dask.flush(client)
    note("ingest", client.run_on_scheduler(longest_since_reset), "ingest")
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
        with MemoryPeak(scheduler_pid) as memory:
            started = time.perf_counter()
            call()
            took = time.perf_counter() - started
        note(phase, client.run_on_scheduler(longest_since_reset), phase)
        print(f"      {took:.2f} s; the scheduler's memory (RSS) peaked "
              f"{memory.grown / 2**20:.0f} MB above where it was", flush=True)
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
          f"({n_states:,} states; target <= {TARGET * 1e3:.0f} ms):")
    for phase, measured in results.items():
        mark = "" if measured["longest"] <= TARGET else "   NOT met"
        print(f"  {phase:<24} {describe(measured)}{mark}")


def describe(measured: dict) -> str:
    """A stretch, what the loop's thread did in it, and the collections of its phase."""
    whose = f" of {measured['discarded']}" if measured["discarded"] else ""
    others = (f"; a stretch holding one of distributed's pages' "
              f"{measured['others'] * 1e3:.1f} ms, not counted" if measured["others"] else "")
    return (f"{measured['longest'] * 1e3:6.1f} ms (the loop's thread ran "
            f"{measured['ran'] * 1e3:.1f} ms of it and waited for a core "
            f"{measured['queued'] * 1e3:.1f} ms); longest garbage collection "
            f"{measured['gc'] * 1e3:.1f} ms, Bokeh's when it discarded a closed page's "
            f"session {measured['discard'] * 1e3:.1f} ms{whose}{others}"
            + (f"\n      page faults of the loop's thread in it: {measured['faults']}; "
               f"where: {measured['where']}" if measured["where"] else "")
            + (f"\n      callbacks run in it: {measured['callbacks']}"
               if measured["callbacks"] else "")
            + (f"\n      longest callback {measured['callback'] * 1e3:.1f} ms: "
               f"{measured['callback_of']}" if measured["callback_of"] else ""))


if __name__ == "__main__":
    main()
