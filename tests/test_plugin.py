"""The suite's pytest plugin, driven by pytest's own ``pytester`` (``tests/plugin_runs.py``): a run of made-up claim
tests in a temporary directory, in this process, and what the plugin made of it (its exit code, its lines, its record).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cheapinfer.harness import registry
from plugin_runs import errors, run

ROOT = Path(__file__).resolve().parent.parent


# the markers a claim test takes from the registry
# ------------------------------------------------------------------------------------------------

_TESTS = '''
import pytest
from time import perf_counter as tick  # a clock by another name: the registry, not the source, says what is clocked


@pytest.mark.claim("BAT-TRADEOFF")
def test_clocked(claim):
    tick()


@pytest.mark.claim("EVAL-TABLE")
def test_slow(claim):
    pass


@pytest.mark.claim("KV-MACS")
def test_counted(claim):
    pass
'''


@pytest.mark.parametrize("expr,selected", [("clocked", ["test_clocked"]), ("slow", ["test_slow"]),
                                           ("not slow and not clocked", ["test_counted"])])
def test_the_clocked_and_slow_markers_come_from_the_registry(pytester, expr, selected):
    """A renamed clock call moves no claim: ``clocked`` is the registry's ``timing``, ``slow`` its ``slow``."""
    assert "BAT-TRADEOFF" in registry.clocked_claims() and "EVAL-TABLE" in registry.slow_claims()
    pytester.makepyfile(test_claims=_TESTS)
    result = run(pytester, "--co", "-q", "-m", expr)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert [line.split("::")[1] for line in result.outlines if "::" in line] == selected


def test_a_timer_under_a_counted_claim_is_refused_at_collection(pytester):
    pytester.makepyfile(test_counted='''
import pytest


@pytest.mark.claim("KV-MACS")
def test_counted(claim, timed):
    pass
''')
    result = run(pytester, "--co", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR == 4
    assert errors(result) == ["ERROR: test_counted.py::test_counted: claim KV-MACS is counted (timing = 'counted' in the registry), but "
                              "its test reads a clock (fixture 'timed'): declare timing = \"clocked\" or leave the timer out"]


@pytest.mark.parametrize("mark", ["slow", "clocked"])
def test_a_claim_test_marked_slow_or_clocked_by_hand_is_refused(pytester, mark):
    pytester.makepyfile(test_marked=f'''
import pytest


@pytest.mark.claim("KV-MACS")
@pytest.mark.{mark}
def test_marked(claim):
    pass
''')
    result = run(pytester, "--co", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert errors(result) == [f"ERROR: test_marked.py::test_marked: marked '{mark}' by hand; a claim test's {mark} comes from the registry (KV-MACS)"]


# how the plugin is registered: once, whichever way it is loaded
# ------------------------------------------------------------------------------------------------

_REGISTERED = '''
import fixtures.plugin


def test_registered(request):
    manager = request.config.pluginmanager
    assert manager.get_plugin("cheapinfer") is fixtures.plugin and manager.get_name(fixtures.plugin) == "cheapinfer"
'''


@pytest.mark.parametrize("conftest", [False, True], ids=["elsewhere", "with-the-checkouts-conftest"])
@pytest.mark.parametrize("autoload,extra", [(True, ()), (False, ("-p", "cheapinfer")), (False, ())],
                         ids=["entry-point", "no-autoload:-p cheapinfer", "no-autoload"])
def test_the_plugin_is_registered_once_whichever_way_it_is_loaded(pytester, monkeypatch, conftest, autoload, extra):
    """The entry point loads it; with autoloading off, ``-p cheapinfer`` or the checkout's conftest.py does, under the same
    name; never twice (pluggy would refuse the second), and its options are added once."""
    if conftest:
        pytester.makeconftest((ROOT / "conftest.py").read_text(encoding="utf-8"))
    if not autoload:
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_registered=_REGISTERED)
    args = ("-p", "no:cacheprovider", *extra, f"--report-dir={pytester.path / 'reports'}")
    if autoload or extra or conftest:
        assert pytester.runpytest(*args, "-q").ret == 0
        shown = pytester.runpytest(*args, "--fault", "kv-bytes-counts-query-heads", "--help")
        assert shown.ret == 0 and shown.stdout.str().count("--report-dir=DIR") == 1 and shown.stdout.str().count("chapter claims:") == 1
    else:  # nothing loads it: not installed as far as pytest knows, and no checkout
        assert pytester.runpytest(*args).ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.parametrize("conftest", [False, True], ids=["elsewhere", "with-the-checkouts-conftest"])
def test_no_cheapinfer_leaves_the_plugin_out(pytester, conftest):
    if conftest:
        pytester.makeconftest((ROOT / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    shown = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:cheapinfer", "--help")
    assert shown.ret == 0 and "chapter claims:" not in shown.stdout.str()
    assert pytester.runpytest("-p", "no:cacheprovider", "-p", "no:cheapinfer", "-q").ret == 0
