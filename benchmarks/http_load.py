"""Load on the external-application write API: concurrent writers on loopback.

Starts a scheduler in its own process (``dask scheduler --preload
crux_dask.plugins`` with a write token), then ``--writers`` threads each send
``--requests`` POSTs of new data states through :class:`crux_dask.external.CruxWriter`.
Prints requests per second, errors, and whether every state landed.  Bounded:
the loop stops after the requests or ``--seconds``, whichever comes first.

Usage: ``python benchmarks/http_load.py [--writers 50] [--requests 1000]``
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time

from crux_dask.external import CruxHTTPError, CruxWriter

TOKEN = "load-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=50)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=600)
    args = parser.parse_args()

    port, dashboard = free_port(), free_port()
    env = {**os.environ, "DASK_CRUX_DASK__HTTP__TOKEN": TOKEN}
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--dashboard-address", f"127.0.0.1:{dashboard}",
         "--preload", "crux_dask.plugins"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        writer = CruxWriter(address, TOKEN, timeout=30)
        deadline = time.time() + 60
        while True:
            try:
                before = writer._request("GET", "/stats")["states"]
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)

        errors: list[str] = []
        sent = [0] * args.writers
        stop_at = time.time() + args.seconds

        def write(index: int) -> None:
            client = CruxWriter(address, TOKEN, timeout=30)
            for i in range(args.requests):
                if time.time() > stop_at:
                    return
                try:
                    client.state(f"ext-{index}-{i}", f"file@loader{index}:/data/{i}",
                                 time.time(), 100)
                    sent[index] += 1
                except (CruxHTTPError, OSError) as error:
                    errors.append(repr(error))

        threads = [threading.Thread(target=write, args=(i,)) for i in range(args.writers)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        after = writer._request("GET", "/stats")
        landed = after["states"] - before
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=30)
    total = sum(sent)
    print(f"{args.writers} writers x {args.requests} requests: {total:,} accepted in "
          f"{elapsed:.1f} s = {total / elapsed:,.0f} requests/s; errors: {len(errors)}; "
          f"states landed: {landed:,} (lost: {total - landed})")


if __name__ == "__main__":
    main()
