"""The suite's pytest plugin, driven by pytest's own ``pytester``: a run of made-up claim tests in a temporary
directory, in this process, and what the plugin made of it (its exit code, its lines, its record).

Each run names its report directory, so that none writes the checkout's ``reports/``.
"""

from __future__ import annotations

import pytest

from cheapinfer.harness import registry

#: What every run gives: the plugin, no cache folder in the test's directory.
PLUGIN = ("-p", "fixtures.plugin", "-p", "no:cacheprovider")


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*PLUGIN, f"--report-dir={pytester.path / 'reports'}", *args)


def errors(result: pytest.RunResult) -> list[str]:
    return [line for line in result.errlines if line.strip()]


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
