"""What a Bokeh page costs an event loop that serves it, against one that relays it.

The Crux pages are served by the scheduler's own Bokeh server, on its event
loop: Bokeh builds, encodes and, when the page is closed, collects each
page's document there (see ``page_parts.py`` and ``loop_block.py``).  The
other way is a Bokeh server in another process, whose HTTP requests and
websocket messages the loop only passes on.  This measures both on the same
page, five figures of two renderers of 2,000 points each (about the size of
the ``/crux`` page), opened in headless Chromium:

``served``
    a Bokeh server on the measured process's loop serves the page;
``relayed``
    a Bokeh server in another process serves it, and the measured loop passes
    its HTTP requests and its websocket (with Bokeh's subprotocol, which
    carries the session's token) through, bytes in and bytes out.

For each page the measured process reports the longest stretch of its event
loop, from the request until two seconds after BokehJS shows the document,
and the longest garbage collection in that time.

Usage: ``python benchmarks/bokeh_relay.py [--rounds N]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import numpy as np
import tornado.httpclient
import tornado.web
import tornado.websocket
from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.document import Document
from bokeh.layouts import column
from bokeh.plotting import figure
from bokeh.server.server import Server

SHOWN_FOR = 2.0  # seconds a page stays open once BokehJS shows it


def page(doc: Document) -> None:
    """Five figures of a line and a scatter of 2,000 points each."""
    x = np.arange(2000)
    figures = []
    for _ in range(5):
        plot = figure(height=150, sizing_mode="stretch_width",
                      tools="pan,wheel_zoom,box_zoom,reset,hover")
        plot.line(x, np.random.rand(len(x)))
        plot.scatter(x, np.random.rand(len(x)))
        figures.append(plot)
    doc.add_root(column(*figures, sizing_mode="stretch_width"))


def bokeh_server(port: int) -> Server:
    return Server({"/page": Application(FunctionHandler(page))}, port=port,
                  address="127.0.0.1", allow_websocket_origin=["*"])


# -- the process that serves the page for the relay ---------------------------------
def serve_page(port: int) -> None:
    server = bokeh_server(port)
    server.start()
    server.io_loop.start()


# -- the measured process: serves the page itself, and relays the other -------------
class Relay(tornado.web.RequestHandler):
    """Passes an HTTP request on to the other process, and its answer back."""

    def initialize(self, upstream: int) -> None:
        self.upstream = upstream

    async def get(self, *_: Any) -> None:
        answer = await tornado.httpclient.AsyncHTTPClient().fetch(
            f"http://127.0.0.1:{self.upstream}{self.request.uri}", raise_error=False)
        self.set_status(answer.code)
        if "Content-Type" in answer.headers:
            self.set_header("Content-Type", answer.headers["Content-Type"])
        self.write(answer.body)


class WebSocketRelay(tornado.websocket.WebSocketHandler):
    """Passes a websocket's messages on to the other process's, both ways."""

    def initialize(self, upstream: int) -> None:
        self.upstream = upstream
        self.connection: tornado.websocket.WebSocketClientConnection | None = None

    def check_origin(self, origin: str) -> bool:
        return True  # the other process checks it

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return subprotocols[0] if subprotocols else None

    async def open(self, *_: Any) -> None:
        protocols = [p.strip() for p in
                     self.request.headers.get("Sec-WebSocket-Protocol", "").split(",")
                     if p.strip()]
        self.connection = await tornado.websocket.websocket_connect(
            f"ws://127.0.0.1:{self.upstream}{self.request.uri}", subprotocols=protocols,
            on_message_callback=self.back, max_message_size=1 << 30)

    def on_message(self, message: str | bytes) -> None:
        self.connection.write_message(message, binary=isinstance(message, bytes))

    def back(self, message: str | bytes | None) -> None:
        if message is None:
            self.close()
        else:
            self.write_message(message, binary=isinstance(message, bytes))

    def on_close(self) -> None:
        if self.connection is not None:
            self.connection.close()


def measured(upstream: int, served: int, relayed: int) -> None:
    """Serve the page on ``served``, relay ``upstream``'s on ``relayed``, and answer
    ``/longest`` there: the longest stretch of the loop and collection since the last."""
    longest = {"stretch": 0.0, "gc": 0.0}
    started = [0.0]

    def collection(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            longest["gc"] = max(longest["gc"], time.perf_counter() - started[0])

    gc.callbacks.append(collection)

    class Longest(tornado.web.RequestHandler):
        def get(self) -> None:
            self.write(json.dumps(longest))
            longest.update(stretch=0.0, gc=0.0)

    async def watch() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest["stretch"] = max(longest["stretch"], now - last - 0.001)
            last = now

    async def main() -> None:
        relay = {"upstream": upstream}
        tornado.web.Application([
            (r"/longest", Longest),
            (r"/page/ws", WebSocketRelay, relay),
            (r"/(page.*|static/.*)", Relay, relay),
        ], websocket_max_message_size=1 << 30).listen(relayed, address="127.0.0.1")
        bokeh_server(served).start()
        watcher = asyncio.ensure_future(watch())
        await asyncio.Event().wait()
        watcher.cancel()

    asyncio.run(main())


# -- the driver ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url).read()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    upstream, served, relayed = free_port(), free_port(), free_port()
    me = [sys.executable, __file__]
    processes = [subprocess.Popen([*me, "--serve-page", str(upstream)]),
                 subprocess.Popen([*me, "--measured", str(upstream), str(served), str(relayed)])]
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    longest_url = f"http://127.0.0.1:{relayed}/longest"
    try:
        wait_for(f"http://127.0.0.1:{upstream}/page")
        wait_for(longest_url)
        results: dict[str, list[tuple[float, float]]] = {"served": [], "relayed": []}
        for _ in range(args.rounds):  # interleaved
            for name, port in (("served", served), ("relayed", relayed)):
                json.loads(urllib.request.urlopen(longest_url).read())  # reset
                driver.get(f"http://127.0.0.1:{port}/page")
                for _ in range(300):  # until BokehJS shows the document
                    if driver.execute_script(
                            "return !!(window.Bokeh && Bokeh.documents.length)"):
                        break
                    time.sleep(0.05)
                else:
                    raise TimeoutError(f"the {name} page never showed")
                time.sleep(SHOWN_FOR)
                driver.get("about:blank")
                got = json.loads(urllib.request.urlopen(longest_url).read())
                results[name].append((got["stretch"] * 1e3, got["gc"] * 1e3))
        print("longest stretch of the measured event loop per page (longest collection), "
              f"{args.rounds} rounds, interleaved:")
        for name, rows in results.items():
            print(f"  {name:<8} " + ", ".join(f"{s:.1f} ms ({g:.1f})" for s, g in rows))
    finally:
        driver.quit()
        for process in processes:
            process.terminate()
            process.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-page"]:
        serve_page(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--measured"]:
        measured(*map(int, sys.argv[2:5]))
    else:
        main()
