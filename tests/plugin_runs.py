"""Runs of the suite's pytest plugin on made-up claim tests, with pytest's ``pytester`` (``tests/test_plugin.py`` and the
other tests that check what the plugin makes of a run): in this process, in a temporary directory, each with its own
report directory, so that none writes the checkout's ``reports/``.
"""

from __future__ import annotations

import pytest

# The plugin's modules, imported before any run: pytester takes back what a run imported, and torch, which they
# import, cannot be imported twice in one process (a run of the tests with -p no:cheapinfer loads no plugin first).
import fixtures.plugin  # noqa: F401
from fixtures import batch_curve, evaluation, options, profiles, quant, recording, selection  # noqa: F401

#: What every run gives: the plugin (by its entry point's name: loaded once, also where autoloading is off), no cache folder.
PLUGIN = ("-p", "cheapinfer", "-p", "no:cacheprovider")


def run(pytester: pytest.Pytester, *args: str, **kwargs) -> pytest.RunResult:
    """pytest with the plugin in ``pytester.path``, its report directory ``reports/`` there, as a user's run: pytest's
    installed plugins (pytest-benchmark, Hypothesis) loaded also where the outer run turned autoloading off, and no
    pytest-xdist worker's variables (pytest-benchmark would time nothing in a worker of ``pytest -n``).
    ``kwargs`` go to pytester (``no_reraise_ctrlc=True``: a run interrupted by Ctrl-C returns, its exit code 2)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):
            mp.delenv(name, raising=False)
        return pytester.runpytest(*PLUGIN, f"--report-dir={pytester.path / 'reports'}", *args, **kwargs)


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
