"""The command line: the demo as a new user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path


def test_demo_prints_its_path_writes_a_report_and_serves_the_dashboard(tmp_path: Path):
    report = tmp_path / "report.html"
    demo = subprocess.Popen(
        [sys.executable, "-m", "crux_dask.cli", "demo", "--slow", "0.3", "--report",
         str(report), "--serve"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # Ctrl-C as a terminal sends it: a shell's background job would inherit SIGINT
        # ignored, and Python then never raises KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = []
        for line in demo.stdout:  # synchronised on what it prints
            lines.append(line)
            if line.startswith("Dashboard:"):
                break
        text = "".join(lines)
        assert "Workflow critical path (observed)" in text
        assert "load" in text and "report" in text
        header = next(line.split() for line in lines if line.split()[:1] == ["step"])
        assert header[-9:] == ["busy", "client", "report", "scheduler", "rescheduled",
                               "dispatch", "worker", "sched", "wait"]  # each step's parts
        assert report.stat().st_size > 100_000  # Bokeh inlined: no server needed
        assert "crux-timeline" in report.read_text()
        url = line.split()[1]
        with urllib.request.urlopen(url, timeout=30) as page:  # the tab is up
            assert page.status == 200
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
