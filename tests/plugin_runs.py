"""Runs of the suite's pytest plugin with pytest's ``pytester``: on made-up claim tests (``tests/test_plugin.py`` and the
other tests that check what the plugin makes of a run), in this process, in a temporary directory, each with its own
report directory, so that none writes the checkout's ``reports/``; and on the checkout's own tests (:func:`suite`),
from the checkout, as a user runs ``pytest`` there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import _pytest.pytester
import pytest
from hypothesis import settings

# The plugin's modules, imported before any run: pytester takes back what a run imported, and torch, which they
# import, cannot be imported twice in one process (a run of the tests with -p no:cheapinfer loads no plugin first).
import fixtures.plugin  # noqa: F401
from fixtures import batch_curve, evaluation, options, profiles, quant, recording, selection  # noqa: F401

#: What every run gives: the plugin (by its entry point's name: loaded once, also where autoloading is off), no cache folder.
PLUGIN = ("-p", "cheapinfer", "-p", "no:cacheprovider")
#: The checkout (its ``claims/``, ``tests/`` and ``pyproject.toml``).
ROOT = Path(__file__).resolve().parent.parent
#: The variables a run must not inherit from the outer one: autoloading turned off, and those of a pytest-xdist worker
#: (pytest-benchmark would time nothing in a worker of ``pytest -n``).
_OUTER = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


def run(pytester: pytest.Pytester, *args: str, **kwargs) -> pytest.RunResult:
    """pytest with the plugin in ``pytester.path``, its report directory ``reports/`` there, as a user's run: pytest's
    installed plugins (pytest-benchmark, Hypothesis) loaded also where the outer run turned autoloading off, and no
    pytest-xdist worker's variables (pytest-benchmark would time nothing in a worker of ``pytest -n``).
    ``kwargs`` go to pytester (``no_reraise_ctrlc=True``: a run interrupted by Ctrl-C returns, its exit code 2)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in _OUTER:
            mp.delenv(name, raising=False)
        return pytester.runpytest(*PLUGIN, f"--report-dir={pytester.path / 'reports'}", *args, **kwargs)


#: The two internals of pytest's pytester that an in-process run of the checkout's claims relies on (pytest has no public
#: way to keep a run's imports): the class each run's snapshot of ``sys.modules`` is made from, and the fixture's own
#: snapshot. Pinned with pytest in ``pyproject.toml``; :func:`pytester_internals_missing` names what a new pytest moved.
PYTESTER_INTERNALS = ("_pytest.pytester.SysModulesSnapshot", "Pytester._sys_modules_snapshot")


def pytester_internals_missing(pytester: pytest.Pytester | None = None) -> list[str]:
    """The names of :data:`PYTESTER_INTERNALS` this pytest lacks (with ``pytester``: the fixture's attribute too)."""
    missing = [] if isinstance(getattr(_pytest.pytester, "SysModulesSnapshot", None), type) else [PYTESTER_INTERNALS[0]]
    if pytester is not None and not hasattr(pytester, "_sys_modules_snapshot"):
        missing.append(PYTESTER_INTERNALS[1])
    return missing


class _KeepLibraries(getattr(_pytest.pytester, "SysModulesSnapshot", object)):
    """pytester's snapshot of ``sys.modules``, which an in-process run (and the fixture, after its test) takes back, keeping what the run imported
    from outside the checkout's test folders: torch's modules register their operators once per process, and the
    extensions of safetensors and tokenizers initialize once, so that a second import of either fails. The test
    modules (``claims/``, ``tests/``, ``conftest.py``) go, as pytester would have them go."""

    def __init__(self, preserve=None) -> None:
        super().__init__(preserve=lambda name: not _test_module(name) or bool(preserve and preserve(name)))


def _test_module(name: str) -> bool:
    where = str(getattr(sys.modules.get(name), "__file__", None) or "")
    return name == "conftest" or where.startswith((str(ROOT / "claims"), str(ROOT / "tests"), str(ROOT / "conftest.py")))


def suite(pytester: pytest.Pytester, *args: str, cwd: Path = ROOT, separate: bool = False) -> subprocess.CompletedProcess:
    """``pytest args`` from ``cwd`` (default: the checkout, so that ``claims/...`` and its ``pyproject.toml`` are found),
    the plugin by its entry point's name, no cache folder: (exit status, standard output, standard error).

    In this process (``runpytest_inprocess``) unless ``separate``: then in an interpreter of its own
    (``runpytest_subprocess``), for a run whose plugins (``-p fake_cuda``, a broken registry, a full disk) patch
    what this process uses, or that tests the interpreter itself. The environment is this process's (set with
    ``monkeypatch.setenv``), less the outer run's autoload switch and pytest-xdist worker. What a run in this process
    leaves behind is taken back: the modules it imported from the test folders, the Hypothesis profile it loaded."""
    with pytest.MonkeyPatch.context() as mp:
        for name in _OUTER:
            mp.delenv(name, raising=False)
        mp.chdir(cwd)
        if not separate and (missing := pytester_internals_missing(pytester)):
            pytest.fail(f"pytest {pytest.__version__} lacks {', '.join(missing)}, which an in-process run keeps its libraries "
                        "with: update tests/plugin_runs.py to this pytest, or pin the pytest it was written for", pytrace=False)
        mp.setattr(_pytest.pytester, "SysModulesSnapshot", _KeepLibraries)  # the one each run takes
        pytester._sys_modules_snapshot = _KeepLibraries()  # and the one the fixture takes back after the test
        go = pytester.runpytest_subprocess if separate else pytester.runpytest_inprocess
        profile = settings.get_current_profile_name()
        try:
            result = go(*PLUGIN, *args)
        finally:
            settings.load_profile(profile)  # a run loads its own Hypothesis profile (or fails to: --hypothesis-profile nope)
    return subprocess.CompletedProcess(["pytest", *args], result.ret, "\n".join(result.outlines), "\n".join(result.errlines))



def record(pytester: pytest.Pytester, latest: bool = True) -> dict:
    """The record the run wrote: the latest ``run.json``, or (``latest=False``) the one it kept in ``runs/``."""
    from cheapinfer.harness import schema, store

    reports = pytester.path / "reports"
    if latest:
        return schema.read_record(reports / "run.json")
    [kept] = [p for p in (reports / store.RUNS_DIR).glob("*.json") if not p.name.endswith(store.BENCHMARKS_SUFFIX)]
    return schema.read_record(kept)


def errors(result: pytest.RunResult) -> list[str]:
    """The run's standard error, without blank lines."""
    return [line for line in result.errlines if line.strip()]
