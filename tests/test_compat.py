"""distributed's own tests most likely to notice Crux pass with Crux preloaded.

A fast subset of ``make compat`` (``benchmarks/compat.py``): the tests that
once failed only with Crux, distributed's plugin tests, and tests of the
worker's data transfers and closing, run with Crux preloaded on every
scheduler and worker through dask's configuration, in a subprocess.  A test
that fails is run again without Crux: only a test that passes without Crux
and fails with it is a failure here.

distributed's wheel leaves its tests out: ``make test`` installs the files
this runs from ``third_party/distributed-tests`` unless a copy of the suite is
installed already, and the test is skipped where neither was done.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "crux_compat", Path(__file__).parents[1] / "benchmarks" / "compat.py")
compat = importlib.util.module_from_spec(_spec)
sys.modules["crux_compat"] = compat
_spec.loader.exec_module(compat)

#: distributed's tests, as node ids under the directory holding ``distributed``.
NODES = [
    # Once failed only with Crux: a get_data wrapper without `serializers`,
    # and a worker plugin's teardown waiting for a scheduler already gone.
    "distributed/tests/test_client.py::test_turn_off_pickle",
    "distributed/tests/test_worker.py::test_upload_file",
    # distributed's contract with plugins.
    "distributed/diagnostics/tests/test_worker_plugin.py",
    "distributed/diagnostics/tests/test_scheduler_plugin.py",
    # What the worker plugin watches: data handed out, fetched, spilled; closing.
    "distributed/tests/test_worker.py::test_gather",
    "distributed/tests/test_worker.py::test_gather_missing_keys",
    "distributed/tests/test_worker.py::test_get_data_cancelled_error",
    "distributed/tests/test_worker.py::test_gather_many_small",
    "distributed/tests/test_worker.py::test_multiple_transfers",
    "distributed/tests/test_worker.py::test_close_gracefully",
    "distributed/tests/test_worker.py::test_close_on_disconnect",
    "distributed/tests/test_worker.py::test_shutdown_on_scheduler_comm_closed",
    "distributed/tests/test_worker.py::test_gather_dep_one_worker_always_busy",
]


#: Run with them: Crux really is on the scheduler and the workers of a gen_cluster.
PRELOADED = textwrap.dedent("""
    from distributed.utils_test import gen_cluster

    @gen_cluster(client=True)
    async def test_crux_is_preloaded(c, s, a, b):
        assert "crux" in s.plugins
        assert "crux" in a.plugins and "crux" in b.plugins
""")


def installed_root() -> Path | None:
    """The directory holding ``distributed``, if its tests are installed there."""
    try:
        if importlib.util.find_spec("distributed.tests.test_worker") is None:
            return None
    except ModuleNotFoundError:  # not even the package of distributed's tests
        return None
    return compat.site_packages(sys.executable)


def installed(nodes: list[str]) -> Path:
    """The directory holding ``distributed``; skip the test if ``nodes`` are not there."""
    root = installed_root()
    if root is None:
        pytest.skip("distributed's tests are not installed (see benchmarks/compat.py)")
    missing = [n for n in nodes if not (root / n.split("::")[0]).exists()]
    if missing:
        pytest.skip(f"not in this copy of distributed's tests: {missing}")
    compat.ROOT = root
    return root


def test_distributed_tests_pass_with_crux_preloaded(tmp_path):
    root = installed(NODES)
    check = tmp_path / "test_preloaded.py"
    check.write_text(PRELOADED)
    targets = [str(root / n) for n in NODES] + [str(check)]
    with_crux = compat.run_pytest(sys.executable, "with", targets, 60, tmp_path, "subset")
    assert with_crux.returncode in (0, 1), (tmp_path / "subset-with.log").read_text()[-3000:]
    assert with_crux.count("passed") >= 40
    preloaded = [o for n, o in with_crux.outcomes.items() if n.endswith("crux_is_preloaded")]
    assert preloaded == ["passed"]
    failed = sorted(n for n, o in with_crux.outcomes.items() if not compat.passing(o))
    if not failed:
        return
    without = compat.run_pytest(sys.executable, "without", [str(root / n) for n in failed], 60,
                                tmp_path, "subset")
    broken = [n for n in failed if compat.passing(without.outcomes.get(n))]
    assert not broken, (f"pass without Crux, fail with it: {broken}\n"
                        + (tmp_path / "subset-with.log").read_text()[-5000:])

