"""Does Crux change what distributed's own test suite sees?

Runs a chosen set of distributed's own test modules twice, without and with
Crux preloaded on every scheduler and worker through dask's configuration
(``DASK_DISTRIBUTED__SCHEDULER__PRELOAD`` and
``DASK_DISTRIBUTED__WORKER__PRELOAD``), and prints, for each module, the tests
passed, failed and skipped and the wall time of both runs, then every test
whose outcome differs.  A test that differs is run again on its own, a few
times in each configuration, to tell a flaky test from one Crux breaks.

distributed's wheel ships without its tests: ``--tests-from DIR`` names a
checkout of distributed's test suite for the installed version, with an
``install`` script that copies it into the installed package; it is run when
the tests are missing.  The TLS certificates the tests use are made with
distributed's own ``make_tls_certs.py`` when they are missing too.

Usage: ``python benchmarks/compat.py --tests-from DIR [--modules M ...]
[--timeout S] [--reruns N] [--json FILE]``

The target: no test that passes without Crux fails with it, and each module's
wall time within +10 %.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

#: The modules run by default: those most likely to notice a plugin.
MODULES = (
    "distributed.tests.test_scheduler",
    "distributed.tests.test_worker",
    "distributed.tests.test_client",
    "distributed.tests.test_nanny",
    "distributed.tests.test_steal",
    "distributed.tests.test_worker_memory",
    "distributed.diagnostics.tests",
    "distributed.shuffle.tests",
)

#: The configuration that preloads Crux on every scheduler and worker.
PRELOAD = {
    "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": '["crux_dask.plugins"]',
    "DASK_DISTRIBUTED__WORKER__PRELOAD": '["crux_dask.plugins"]',
}

CONFIGS = ("without", "with")

#: Outcomes from best to worst; a test reported twice (a teardown error after a
#: pass) keeps the worst.
OUTCOMES = ("passed", "skipped", "failed", "error")
#: Tests printed per module whose time grew most with Crux: what its wall time is made of.
SLOWED_SHOWN = 3


@dataclass
class Run:
    """One pytest run of one module in one configuration.

    Attributes
    ----------
    outcomes : dict of str to str
        Outcome of each test, by node id.
    wall : float
        Wall seconds of the pytest process.
    returncode : int
        pytest's exit status (1 when tests failed; 2 to 5 when it could not run).
    seconds : dict of str to float
        Seconds each test took, by node id, as pytest reports them (its setup
        and teardown included).
    """

    outcomes: dict[str, str] = field(default_factory=dict)
    wall: float = 0.0
    returncode: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def count(self, *outcomes: str) -> int:
        """How many tests had one of ``outcomes``."""
        return sum(1 for o in self.outcomes.values() if o in outcomes)


def environment(config: str) -> dict[str, str]:
    """The environment of a pytest run: Crux preloaded (``"with"``) or not at all."""
    env = {k: v for k, v in os.environ.items() if k not in PRELOAD}
    if config == "with":
        env.update(PRELOAD)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def site_packages(python: str) -> Path:
    """The directory holding the ``distributed`` package ``python`` imports."""
    out = subprocess.run(
        [python, "-c", "import distributed, os; print(os.path.dirname(distributed.__file__))"],
        check=True, capture_output=True, text=True)
    return Path(out.stdout.strip()).parent


def ensure_tests(python: str, tests_from: Path) -> None:
    """Install distributed's tests into the package ``python`` imports, if missing.

    Raises
    ------
    SystemExit
        If they are missing and ``tests_from`` has no ``install`` script.
    """
    probe = ("import importlib.util, sys; "
             "sys.exit(importlib.util.find_spec('distributed.tests.test_worker') is None)")
    if subprocess.run([python, "-c", probe]).returncode == 0:
        return
    install = tests_from / "install"
    if not install.is_file():
        raise SystemExit(f"distributed's tests are not installed and {install} does not exist")
    subprocess.run(["bash", str(install), python], check=True)


def ensure_tls_certificates(python: str) -> None:
    """Make the TLS certificates distributed's tests use, if they are missing.

    A copy of the suite may leave them out; without them
    ``distributed.tests.test_scheduler`` cannot even be collected.  They are
    made by distributed's own ``tests/make_tls_certs.py``, which needs
    ``openssl``.
    """
    tests = site_packages(python) / "distributed" / "tests"
    maker = tests / "make_tls_certs.py"
    if (tests / "tls-ca-cert.pem").exists() or not maker.exists():
        return
    if shutil.which("openssl") is None:
        print("warning: no openssl to make distributed's test certificates: modules that "
              "need them at import cannot be collected", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([python, str(maker)], cwd=scratch, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def parse_junit(path: Path) -> tuple[dict[str, str], dict[str, float]]:
    """Outcome of each test of a JUnit XML report, and its seconds, by pytest node id."""
    outcomes: dict[str, str] = {}
    seconds: dict[str, float] = {}
    if not path.exists():
        return outcomes, seconds
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        node = node_id(case.get("classname", ""), case.get("name", ""))
        tags = {child.tag for child in case}
        outcome = ("error" if "error" in tags else "failed" if "failure" in tags
                   else "skipped" if "skipped" in tags else "passed")
        previous = outcomes.get(node)
        if previous is None or OUTCOMES.index(outcome) > OUTCOMES.index(previous):
            outcomes[node] = outcome
        seconds[node] = seconds.get(node, 0.0) + float(case.get("time") or 0.0)
    return outcomes, seconds


def node_id(classname: str, name: str) -> str:
    """The node id ``pkg/mod.py::[Class::]name`` of a JUnit ``classname`` and ``name``.

    The class part is told from the module part by the files that exist under
    the ``--rootdir`` the run used (the directory holding ``distributed``).
    """
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        module = "/".join(parts[:i]) + ".py"
        if (ROOT / module).is_file():
            return "::".join([module, *parts[i:], name])
    return f"{classname}::{name}"


#: The directory holding the ``distributed`` package (set in :func:`main`).
ROOT = Path()


def target_path(name: str) -> str:
    """The file or directory of a dotted test module or package under :data:`ROOT`.

    Found by path rather than with ``--pyargs``: distributed's test packages
    may have no ``__init__.py`` (``distributed.diagnostics.tests`` has none).
    """
    path = ROOT / name.replace(".", "/")
    if path.with_suffix(".py").is_file():
        return str(path.with_suffix(".py"))
    if path.is_dir():
        return str(path)
    raise SystemExit(f"no test module or package {name} under {ROOT}")


def run_pytest(python: str, config: str, targets: list[str], timeout: float,
               workdir: Path, tag: str, extra: tuple[str, ...] = ()) -> Run:
    """Run pytest on ``targets`` (paths) in ``config``; return every test's outcome.

    ``extra`` are more pytest arguments (``--deselect`` ...).
    """
    report = workdir / f"{tag}-{config}.xml"
    report.unlink(missing_ok=True)
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\n")
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ini),
               "--rootdir", str(ROOT), f"--timeout={timeout:g}", "--junitxml", str(report),
               "-o", "junit_family=xunit1", "-W", "ignore::pytest.PytestUnknownMarkWarning"]
    command += [*extra, *targets]
    log = workdir / f"{tag}-{config}.log"
    started = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(command, cwd=workdir, env=environment(config), stdout=out,
                                stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    outcomes, seconds = parse_junit(report)
    return Run(outcomes, wall, result.returncode, seconds)


def passing(outcome: str | None) -> bool:
    """Whether an outcome counts as a pass (``skipped`` counts with it: nothing failed)."""
    return outcome in ("passed", "skipped")


def differing(without: Run, with_: Run) -> list[tuple[str, str, str]]:
    """Tests whose outcome differs between the runs: ``(node id, without, with)``."""
    rows = []
    for node in sorted(set(without.outcomes) | set(with_.outcomes)):
        a = without.outcomes.get(node, "missing")
        b = with_.outcomes.get(node, "missing")
        if a != b:
            rows.append((node, a, b))
    return rows


def grown_most(without: Run, with_: Run, count: int = SLOWED_SHOWN
               ) -> list[tuple[str, float, float]]:
    """The ``count`` tests whose seconds grew most with Crux: ``(node id, without, with)``."""
    both = set(without.seconds) & set(with_.seconds)
    grown = [(node, without.seconds[node], with_.seconds[node]) for node in both
             if with_.seconds[node] > without.seconds[node]]
    return sorted(grown, key=lambda row: row[1] - row[2])[:count]


def rerun(python: str, node: str, reruns: int, timeout: float,
          workdir: Path) -> dict[str, int]:
    """Run one test ``reruns`` times in each configuration, alternating; passes in each."""
    passes = dict.fromkeys(CONFIGS, 0)
    for i in range(reruns):
        for config in (CONFIGS if i % 2 == 0 else CONFIGS[::-1]):
            run = run_pytest(python, config, [str(ROOT / node)], timeout, workdir, "rerun")
            passes[config] += passing(run.outcomes.get(node))
    return passes


def print_table(runs: dict[str, dict[str, Run]]) -> None:
    """Passed, failed, skipped and wall time per module, without and with Crux."""
    head = (f"{'module':<38} {'':>7} {'passed':>6} {'failed':>6} {'skipped':>7} "
            f"{'wall s':>7}")
    print(head + f" {'wall with/without':>17}")
    print("-" * (len(head) + 18))
    totals = {c: Run() for c in CONFIGS}
    for module, pair in runs.items():
        for config in CONFIGS:
            run = pair[config]
            ratio = ""
            if config == "with" and pair["without"].wall > 0:
                ratio = f"{run.wall / pair['without'].wall:.3f}"
            name = module.removeprefix("distributed.") if config == "without" else ""
            print(f"{name:<38} {config:>7} {run.count('passed'):>6} "
                  f"{run.count('failed', 'error'):>6} {run.count('skipped'):>7} "
                  f"{run.wall:>7.1f} {ratio:>17}")
            totals[config].outcomes.update({f"{module}:{k}": v
                                            for k, v in run.outcomes.items()})
            totals[config].wall += run.wall
    print("-" * (len(head) + 18))
    for config in CONFIGS:
        run = totals[config]
        ratio = (f"{run.wall / totals['without'].wall:.3f}"
                 if config == "with" and totals["without"].wall else "")
        print(f"{'total' if config == 'without' else '':<38} {config:>7} "
              f"{run.count('passed'):>6} {run.count('failed', 'error'):>6} "
              f"{run.count('skipped'):>7} {run.wall:>7.1f} {ratio:>17}")


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; exit status 1 if a test passes without Crux and fails with it."""
    global ROOT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests-from", type=Path, required=True, metavar="DIR",
                        help="a checkout of distributed's test suite for the installed "
                             "version (with its install script)")
    parser.add_argument("--modules", nargs="+", default=list(MODULES), metavar="M",
                        help="dotted test modules or packages (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a single test may take (default: %(default)s)")
    parser.add_argument("--reruns", type=int, default=2,
                        help="runs of each differing test in each configuration, to tell "
                             "flaky tests apart; 0: none (default: %(default)s)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter to test (default: this one)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--keep", action="store_true",
                        help="keep the logs and reports (their directory is printed)")
    args = parser.parse_args(argv)

    ensure_tests(args.python, args.tests_from)
    ensure_tls_certificates(args.python)
    ROOT = site_packages(args.python)
    if importlib.util.find_spec("crux_dask") is None:
        print("warning: crux_dask is not importable by this interpreter", file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="crux-compat-"))
    runs: dict[str, dict[str, Run]] = {}
    for i, module in enumerate(args.modules):
        order = CONFIGS if i % 2 == 0 else CONFIGS[::-1]
        pair = {}
        for config in order:
            tag = module.replace(".", "_")
            pair[config] = run_pytest(args.python, config, [target_path(module)],
                                      args.timeout, workdir, tag)
            run = pair[config]
            print(f"  {module} {config} crux: {run.count('passed')} passed, "
                  f"{run.count('failed', 'error')} failed, {run.count('skipped')} skipped "
                  f"in {run.wall:.0f} s (exit {run.returncode})", file=sys.stderr, flush=True)
            if not run.outcomes:
                print(f"  no report: see {workdir / tag}-{config}.log", file=sys.stderr)
        runs[module] = {config: pair[config] for config in CONFIGS}

    print()
    print_table(runs)
    print(f"\nThe {SLOWED_SHOWN} tests of each module whose time grew most with crux "
          "(seconds without -> with):")
    for module, pair in runs.items():
        grown = ", ".join(f"{node.rsplit('::', 1)[-1]} {a:.1f} -> {b:.1f}"
                          for node, a, b in grown_most(pair["without"], pair["with"]))
        print(f"  {module.removeprefix('distributed.')}: {grown or 'none'}")
    rows = [(module, *row) for module, pair in runs.items()
            for row in differing(pair["without"], pair["with"])]
    print()
    broken = []
    if not rows:
        print("No test's outcome differs.")
    else:
        print(f"{len(rows)} tests differ (without -> with crux"
              + (f"; then passes in {args.reruns} reruns each)" if args.reruns else ")"))
        for _module, node, a, b in rows:
            verdict = ""
            if args.reruns and "missing" not in (a, b) and passing(a) != passing(b):
                passes = rerun(args.python, node, args.reruns, args.timeout, workdir)
                verdict = (f"  reruns passed: without {passes['without']}/{args.reruns}, "
                           f"with {passes['with']}/{args.reruns}")
                if passes["with"] < passes["without"]:
                    broken.append(node)
            elif passing(a) and not passing(b):
                broken.append(node)
            print(f"  {node}: {a} -> {b}{verdict}")
    slow = [m for m, pair in runs.items()
            if pair["without"].wall and pair["with"].wall > 1.10 * pair["without"].wall]
    print()
    print("Target: no test that passes without crux fails with it; wall time within +10 %.")
    print(f"  tests broken by crux (reproduced in reruns): {len(broken)}"
          + (f" {broken}" if broken else ""))
    print(f"  modules over +10 % wall time: {len(slow)}" + (f" {slow}" if slow else ""))
    if args.json:
        args.json.write_text(json.dumps({
            "modules": {m: {c: {"outcomes": r.outcomes, "wall": r.wall,
                                "returncode": r.returncode} for c, r in pair.items()}
                        for m, pair in runs.items()},
            "differing": rows, "broken": broken, "slow": slow}, indent=1))
    if args.keep:
        print(f"logs and reports: {workdir}")
    else:
        for path in workdir.iterdir():
            path.unlink()
        workdir.rmdir()
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
