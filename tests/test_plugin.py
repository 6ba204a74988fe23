"""The suite's pytest plugin, driven by pytest's own ``pytester`` (``tests/plugin_runs.py``): a run of made-up claim
tests in a temporary directory, in this process, and what the plugin made of it (its exit code, its lines, its record).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from plugin_runs import errors, record, run

from cheapinfer.harness import registry, vocabulary

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


# what the run record keeps (issue 46: a benchmark file that could not be written; a run interrupted mid-test)
# ------------------------------------------------------------------------------------------------

_ONE_CLAIM = '''
@pytest.mark.claim("KV-BYTES-FORMULA")
def test_claim(claim):
    from cheapinfer.chapter.kv_cache import kv
    from cheapinfer.runtime.arch import QWEN25_05B

    claim.verify("arithmetic", bytes_per_token=kv.arch_kv_bytes_per_token(QWEN25_05B, 2))
'''


def test_a_benchmark_file_that_cannot_be_written_is_a_warning_in_the_record(pytester):
    """pytest-benchmark writes its JSON after the last test; its folder gone by then (a file in its place: refused even
    to root) is one warning, in the record and on standard error, never a lost record or a red claim."""
    slot = pytester.path / "timings"
    pytester.makepyfile(test_timed=f'''
import pathlib
import shutil

import pytest


def test_timed(benchmark):
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    shutil.rmtree(r"{slot}")
    pathlib.Path(r"{slot}").write_text("a file where the timings' folder was")
''' + _ONE_CLAIM)
    result = run(pytester, "-q", f"--benchmark-json={slot / 'benchmarks.json'}")
    assert result.ret == 0, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]
    said = (f"the benchmark timings could not be written to {slot / 'benchmarks.json'} (Not a directory); nothing was written")
    run_info = record(pytester)["run"]
    assert run_info["warnings"] == [said] and run_info["benchmarks"] is None
    assert record(pytester)["claims"]["KV-BYTES-FORMULA"]["verdict"] == vocabulary.REPRODUCED
    assert [line for line in errors(result) if "benchmark" in line] == [f"WARNING: {said}"]


def test_a_claim_test_interrupted_mid_run_is_recorded_as_interrupted(pytester):
    """Ctrl-C during a claim's test: that claim and the selected ones after it are *interrupted*, never "not selected";
    the finished one keeps its verdict; the record is kept in runs/, and the latest run.json is not replaced."""
    from cheapinfer.harness import record as records

    pytester.makepyfile(test_interrupted='''
import pytest
''' + _ONE_CLAIM + '''

@pytest.mark.claim("KV-MHA-7X")
def test_stopped(claim):
    raise KeyboardInterrupt  # Ctrl-C, halfway through this claim's measurement


@pytest.mark.claim("KV-MACS")
def test_never_started(claim):
    pass
''')
    result = run(pytester, "-q", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()[-2000:]
    kept = record(pytester, latest=False)
    assert kept["run"]["interrupted"] is True and not (pytester.path / "reports" / "run.json").exists()
    reasons = {cid: [r.get("reason") for r in kept["claims"][cid]["results"]] for cid in ("KV-MHA-7X", "KV-MACS", "KV-IDENTITY")}
    assert reasons == {"KV-MHA-7X": [records.INTERRUPTED_REASON], "KV-MACS": [records.INTERRUPTED_REASON],
                       "KV-IDENTITY": ["its test was not selected in this run"]}
    assert kept["claims"]["KV-BYTES-FORMULA"]["verdict"] == vocabulary.REPRODUCED
    assert "(interrupted)" in result.stdout.str()


def test_a_plugin_from_another_copy_than_the_checkout_is_refused(tmp_path):
    """A non-editable install, or another checkout's plugin, would judge this checkout's claims with code it did not ship."""
    from fixtures.options import plugin_elsewhere

    (tmp_path / "fixtures").mkdir()
    (tmp_path / "fixtures" / "plugin.py").write_text("")
    said = plugin_elsewhere(tmp_path)
    assert said == (f"the suite's pytest plugin is imported from {ROOT / 'fixtures'}, not from this checkout ({tmp_path / 'fixtures'}): "
                    "install the checkout editable (pip install -e '.[test]'), so that the plugin and claims/ are the same version")
    assert plugin_elsewhere(ROOT) is None and plugin_elsewhere(tmp_path / "elsewhere") is None  # not a checkout: nothing to mix up


def test_the_pytester_internals_the_in_process_runs_rely_on_are_there(pytester):
    """A pytest update that moves them fails here, by name, not as torch's operators registered twice in a later run."""
    from plugin_runs import pytester_internals_missing

    assert pytester_internals_missing(pytester) == []
