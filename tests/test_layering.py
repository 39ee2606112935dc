"""Layers: a worker loads what it sends and nothing of the scheduler's analysis."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

#: What a worker must never load: the builder, the analyses, the dashboard, and
#: the scheduler side of the plugins.
SCHEDULER_ONLY = ("crux_dask.graph", "crux_dask.pag", "crux_dask.wcp", "crux_dask.provenance",
                  "crux_dask.dashboard", "crux_dask.plugins.scheduler",
                  "crux_dask.plugins.ingest", "crux_dask.plugins.joins",
                  "crux_dask.plugins.time_order", "crux_dask.plugins.recorder",
                  "crux_dask.plugins.entries",
                  "crux_dask.plugins.engine", "crux_dask.plugins.journal",
                  "crux_dask.plugins.spool",
                  "crux_dask.plugins.api")


def modules_after(statements: str) -> list[str]:
    """The modules loaded by a fresh interpreter after running ``statements``."""
    code = f"import json, sys\n{statements}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    return json.loads(done.stdout.splitlines()[-1])


def scheduler_only(modules: list[str]) -> list[str]:
    return [name for name in modules
            if any(name == layer or name.startswith(layer + ".") for layer in SCHEDULER_ONLY)]


@pytest.mark.parametrize("statements", [
    "import crux_dask.plugins.worker",
    "from crux_dask.plugins import CruxWorkerPlugin",
    "import crux_dask.plugins",
])
def test_the_worker_side_loads_no_builder_nor_dashboard(statements):
    modules = modules_after(statements)
    assert scheduler_only(modules) == []
    assert "crux_dask.plugins.config" in modules  # the defaults are registered


def test_a_scheduler_loads_pandas_only_for_what_needs_it():
    """pandas and pyarrow are a quarter of a second to import and a fifth more objects for
    every full garbage collection of the scheduler: a scheduler with Crux, its dashboard
    and a computation done loads neither until a Crux page or an analysis asks for it."""
    modules = modules_after(
        "import asyncio, dask, distributed\n"
        "from distributed import Client, Scheduler, Worker\n"
        "async def main():\n"
        "    with dask.config.set({'distributed.scheduler.preload': ['crux_dask.plugins'],\n"
        "                          'distributed.worker.preload': ['crux_dask.plugins']}):\n"
        "        async with Scheduler(port=0, dashboard_address=':0') as s, \\\n"
        "                Worker(s.address, nthreads=1) as w, \\\n"
        "                Client(s.address, asynchronous=True) as c:\n"
        "            assert 'crux' in s.plugins\n"
        "            xs = [dask.delayed(sum)([i, 1]) for i in range(20)]\n"
        "            assert await c.compute(dask.delayed(sum)(xs)) == 210\n"
        "            from crux_dask.plugins.worker import flush_worker\n"
        "            assert await flush_worker(w)\n"
        "            await s.plugins['crux'].host.drain()\n"
        "            assert s.plugins['crux'].stats()['states'] > 21  # the tasks' states\n"
        "asyncio.run(main())")
    assert "crux_dask.dashboard.pages" in modules  # the Crux tab is installed
    assert [name for name in ("pandas", "pyarrow") if name in modules] == []


def test_the_client_api_loads_no_pandas_into_the_scheduler(tmp_path):
    """A function a client runs on the scheduler is imported there, on its event loop:
    flushing, stats, the graph and its path leave pandas out of a scheduler process.  So
    do the Crux pages, whose contents its graph process computes."""
    import dask
    from distributed import Client

    import crux_dask

    scheduler_file = tmp_path / "scheduler.json"
    command = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
               "--host", "127.0.0.1", "--dashboard-address", ":0", "--preload",
               "crux_dask.plugins", "--scheduler-file", str(scheduler_file)]
    with subprocess.Popen(command, stderr=subprocess.DEVNULL) as scheduler:
        worker = None
        try:
            # The worker and the client each wait for the scheduler to write its file.
            address = str(scheduler_file)
            worker = subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                 address, "--nthreads", "1", "--no-nanny", "--dashboard-address", ":0",
                 "--preload", "crux_dask.plugins"], stderr=subprocess.DEVNULL)
            with Client(scheduler_file=address) as client:
                client.wait_for_workers(1, timeout=60)
                loaded = lambda name: name in sys.modules  # noqa: E731 (sent by value)
                assert client.run_on_scheduler(loaded, "crux_dask.plugins.scheduler")
                xs = [dask.delayed(sum)([i, 1]) for i in range(5)]
                assert dask.compute(dask.delayed(sum)(xs))[0] == 15
                crux_dask.flush(client)
                assert crux_dask.get_stats(client)["states"] > 6
                assert len(crux_dask.get_pag(client).states) > 6
                assert len(crux_dask.get_wcp(client)) >= 2
                dashboard = client.dashboard_link.rsplit("/", 1)[0]
                for page in ("/crux", "/individual-crux-suggestions"):
                    with urllib.request.urlopen(dashboard + page, timeout=60) as answer:
                        assert answer.status == 200
                assert not client.run_on_scheduler(loaded, "pandas")
        finally:
            for process in (worker, scheduler):
                if process is not None:
                    process.terminate()
                    process.wait(30)


def test_importing_the_plugins_registers_the_configuration():
    modules_after("import crux_dask.plugins, dask\n"
                  "assert dask.config.get('crux-dask.batch-size') == 5000")


def test_the_package_still_exports_everything():
    import crux_dask.plugins as plugins
    from crux_dask.plugins import CruxSchedulerPlugin, CruxWorkerPlugin, config, dask_setup

    assert CruxSchedulerPlugin.name == CruxWorkerPlugin.name == "crux"
    assert callable(dask_setup) and config.get("batch-size") == 5000
    for name in plugins.__all__:
        assert getattr(plugins, name) is not None
    assert not hasattr(plugins, "dask_teardown")  # what a preload looks for, and is absent



def test_every_package_of_the_repository_is_installed():
    # A package missing from pyproject's list works in an editable install and
    # is left out of a wheel.
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    homes = setup["package-dir"]
    found = set()
    for package, home in homes.items():
        for init in (root / home).rglob("__init__.py"):
            parts = init.parent.relative_to(root / home).parts
            name = ".".join((package, *parts))
            # A folder that is the home of another package is counted under that one.
            if not any(str(init.parent.relative_to(root)) == h for p, h in homes.items()
                       if p != package):
                found.add(name)
    assert found - set(setup["packages"]) == set()


#: Each folder of the repository: the package it installs as, and its layer (a layer
#: imports only from layers below it).
FOLDERS = {"crux_dask": ("crux_dask", 0), "plugins": ("crux_dask.plugins", 1),
           "dashboard": ("crux_dask.dashboard", 2), "cli": ("crux_dask.cli", 3)}
#: What the core never imports at module level.
HEAVY = ("distributed", "bokeh", "tornado", "pyarrow")


def _imports() -> list[tuple[str, str, bool]]:
    """``(module, imported, at_module_level)`` for every import of every product module."""
    import ast
    from pathlib import Path

    top = Path(__file__).resolve().parent.parent
    found = []
    for folder, (package, _) in FOLDERS.items():
        for path in sorted((top / folder).rglob("*.py")):
            parts = path.relative_to(top / folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            if folder == "crux_dask" and parts[0] in ("plugins", "dashboard", "cli"):
                continue
            tree = ast.parse(path.read_text())
            top_level = {id(node) for node in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                else:
                    continue
                found += [(name, imported, id(node) in top_level) for imported in names]
    return found


def _layer(module: str) -> int:
    for package, layer in sorted(FOLDERS.values(), key=lambda folder: -len(folder[0])):
        if module == package or module.startswith(package + "."):
            return layer
    return -1  # not ours


def test_each_layer_imports_only_the_layers_below_it():
    """crux_dask's core ← plugins ← dashboard ← cli, never back (also inside functions);
    the core imports neither distributed, bokeh, tornado nor pyarrow at module level."""
    upward = [(module, imported) for module, imported, _ in _imports()
              if _layer(imported) > _layer(module)]
    assert upward == []
    heavy = [(module, imported) for module, imported, top in _imports()
             if top and _layer(module) == 0 and imported.split(".")[0] in HEAVY]
    assert heavy == []


def test_no_module_imports_itself_back_at_module_level():
    """No import circle among the product's modules, counting module-level imports."""
    import networkx as nx

    graph = nx.DiGraph((module, imported) for module, imported, top in _imports()
                       if top and _layer(imported) >= 0 and imported != module)
    assert list(nx.simple_cycles(graph)) == []
