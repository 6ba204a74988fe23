"""The fault catalogue itself: every fault patches something real, and the runner tells caught from missed.

The sweep of the whole catalogue is ``python -m cheapinfer faults`` (every claim each fault names:
``--all-targets``) or ``pytest -m faults tests/test_faults.py``; it takes minutes, so plain ``pytest``
runs it only for one cheap fault, end to end.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from commands import cheapinfer
from plugin_runs import suite

from cheapinfer.audits import faults
from cheapinfer.audits import forks as child
from cheapinfer.faults import core
from cheapinfer.harness import registry, schema, vocabulary

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", list(faults.catalogue()), ids=str)
def test_every_fault_patches_existing_code_and_restores_it(name):
    """A fault whose target was renamed would be silently inert: entering it must patch a real attribute."""
    f = faults.catalogue()[name]
    assert f.kind in core.KINDS and f.what.strip()
    assert set(f.targets) <= set(registry.load()), f"{name} names claims the registry lacks"
    with f.activate():
        pass


def test_each_fault_lives_in_the_catalogue_module_of_its_section():
    """A fault's section is a registry section, and the fault is written in that section's module (the catalogue's
    modules are named as the registry names the sections: tests/test_layout.py)."""
    for f in faults.catalogue().values():
        assert f.section in registry.SECTIONS, f"{f.name}: section {f.section!r}"
        assert f.activate.__module__ == f"cheapinfer.faults.catalogue.{f.section}", f"{f.name} ({f.section}) is in {f.activate.__module__}"


def test_faults_cover_every_section_of_the_chapter():
    sections = {f.section for f in faults.catalogue().values()}
    wanted = {c.section for c in registry.load().values()}
    assert wanted <= sections, f"sections without a fault: {sorted(wanted - sections)}"


def test_the_runner_reports_a_fault_that_turns_nothing_red(monkeypatch, tmp_path):
    """A missed fault is an exit-1 finding, with the claim's verdict beside it."""
    some = next(iter(faults.catalogue()))
    monkeypatch.setattr(faults, "declared_checks", dict)
    monkeypatch.setattr(faults, "_run_one", lambda f, claims, outdir, timeout, threads=None, stop=False: faults.FaultRun({cid: vocabulary.REPRODUCED for cid in claims}, {}))
    result = faults.run([some], 2, tmp_path, echo=lambda line: None)
    assert result["faults"][some]["caught"] == 0
    assert any("red 0/2" in row and "reproduced" in row for row in faults.table(result))


def test_clocked_claims_are_the_ones_the_registry_declares_clocked():
    clocked = registry.clocked_claims()
    assert {"KV-SPEEDUP-48", "BAT-TRADEOFF", "BAT-STATIC-CONT", "Q-BYTES-SPEED", "SPEC-REAL-SLOWDOWN", "KV-HEAD-TIMING"} <= clocked
    # PAGE-* set a thread count (timing.cpu_threads) but read no clock.
    assert not clocked & {"KV-IDENTITY", "KV-BYTES-FORMULA", "Q-ABSMAX", "EVAL-TABLE", "SPEC-EXACT-GREEDY", "KV-MEMORY-8.3X", "PAGE-WASTE", "PAGE-PREFIX"}


def test_faults_on_slow_claims_start_first_when_there_is_no_last_run(monkeypatch, tmp_path):
    """Without a previous faults.json, the faults whose claims have a slow test (EVAL-TABLE's seven rows,
    SPEC-EXACT-GREEDY's six drafts) must not start last, or a long one runs alone at the end."""
    assert {"EVAL-TABLE", "SPEC-EXACT-GREEDY"} <= registry.slow_claims()
    cat = faults.catalogue()
    names = list(cat)
    log = _logging_runner(monkeypatch, red=lambda cid: True)
    faults.run(names, 1, tmp_path, echo=lambda line: None, workers=1)
    order = [name for name, *_ in log]
    # the counted phase runs each fault's claims that read no clock: a slow clocked claim (KV-SPEEDUP-48) runs alone later
    slow = [n for n in names if (set(cat[n].targets) - registry.clocked_claims()) & registry.slow_claims()]
    assert slow and set(order[: len(slow)]) == set(slow), order


def _logging_runner(monkeypatch, red, declared=None, failed=lambda cid: ["q == 1"]):
    """A fake ``_run_one`` that logs who ran beside whom, and turns red the claims ``red(claim)`` picks; a red claim
    fails the checks ``failed(claim)`` names. ``declared``: the checks that name their fault (none unless given)."""
    import threading
    import time

    monkeypatch.setattr(faults, "declared_checks", lambda: declared or {})

    active, log = [], []
    lock = threading.Lock()

    def fake(f, claims, outdir, timeout, threads=None, stop=False):
        with lock:
            active.append(f.name)
            log.append((f.name, tuple(claims), tuple(active), threads, stop))
        time.sleep(0.05)
        with lock:
            active.remove(f.name)
        out, checks = {}, {}
        for cid in claims:
            out[cid] = vocabulary.RED if red(cid) else vocabulary.SHAPE_HOLDS
            checks[cid] = {"failed": failed(cid) if red(cid) else [], "held": [] if red(cid) else failed(cid)}
            if stop and out[cid] == vocabulary.RED:
                break
        return faults.FaultRun(out, checks)

    monkeypatch.setattr(faults, "_run_one", fake)
    return log


@pytest.mark.parametrize("all_targets", [False, True], ids=["sweep", "all-targets"])
def test_clocked_claims_never_run_beside_another_fault(monkeypatch, tmp_path, all_targets):
    """A neighbour's load must never be what turned a timing claim red: clocked claims run alone, after the rest."""
    cat, clocked = faults.catalogue(), registry.clocked_claims()
    mixed = next(n for n, f in cat.items() if set(f.targets) & clocked and set(f.targets) - clocked)
    only_clocked = next(n for n, f in cat.items() if set(f.targets) <= clocked)
    counted = [n for n, f in cat.items() if not set(f.targets) & clocked][:3]
    log = _logging_runner(monkeypatch, red=lambda cid: cid in clocked)  # only timing claims see these faults
    result = faults.run([mixed, only_clocked, *counted], 1, tmp_path, echo=lambda line: None, all_targets=all_targets)
    assert result["faults"][mixed]["caught"] == result["faults"][only_clocked]["caught"] == 1, result
    for name, claims, beside, threads, stop in log:
        assert stop is not all_targets
        if set(claims) & clocked:
            assert beside == (name,) and threads is None, log
        else:
            assert threads == 1
    assert max(len(beside) for *_, beside, _, _ in log) == 2
    first_clocked = next(i for i, e in enumerate(log) if set(e[1]) & clocked)
    assert all(set(e[1]) & clocked for e in log[first_clocked:]), "an unclocked run came after the quiet phase began"


def test_the_sweep_stops_at_the_first_red_claim(monkeypatch, tmp_path):
    """Caught by an unclocked claim, a fault never runs its clocked claims; those are reported as not reached."""
    cat, clocked = faults.catalogue(), registry.clocked_claims()
    mixed = next(n for n, f in cat.items() if set(f.targets) & clocked and set(f.targets) - clocked)
    log = _logging_runner(monkeypatch, red=lambda cid: True)
    result = faults.run([mixed], 2, tmp_path, echo=lambda line: None)
    assert [set(claims) & clocked for _, claims, *_ in log] == [set(), set()]
    for run in result["faults"][mixed]["runs"]:
        assert sorted(v for v in run.values() if v == vocabulary.RED) == [vocabulary.RED]
        assert all(v == vocabulary.RED or v.startswith(vocabulary.NOT_REACHED) for v in run.values())


def test_a_fault_turns_its_claim_red_end_to_end(tmp_path, capfd):
    """One cheap fault through the real path: pytest --fault --stop-on-red, the registry, the record, the table."""
    name = "kv-bytes-counts-query-heads"
    proc = cheapinfer(capfd, "faults", name, "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = faults.last_run(tmp_path)["faults"][name]
    assert run["caught"] == 1
    verdicts = run["runs"][0]
    red = [cid for cid, v in verdicts.items() if v == vocabulary.RED]
    assert len(red) == 1 and f"| {name} | wrong constant | {red[0]} | red 1/1 |" in proc.stdout, proc.stdout
    assert all(v.startswith(f"{vocabulary.NOT_REACHED}: caught by {red[0]}") for cid, v in verdicts.items() if cid != red[0]), verdicts


def test_pytest_with_a_fault_keeps_its_own_record_and_replaces_neither_the_record_nor_the_errata(tmp_path, pytester):
    """README's ``pytest --fault NAME``: the run measures a broken system on purpose. Its red claims are the fault's,
    not the book's errata, so the chapter's latest run.json and errata.md stay; its own record is kept, marked."""
    name = "kv-bytes-counts-query-heads"
    latest = {n: tmp_path / n for n in ("run.json", "errata.md")}
    for n, path in latest.items():
        path.write_text(f"the chapter's last {n}\n")
    # in an interpreter of its own: the fault patches the code it runs
    proc = suite(pytester, "-q", "--fault", name, "--claims", "KV-BYTES-FORMULA", "--report-dir", str(tmp_path), separate=True)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert {n: p.read_text() for n, p in latest.items()} == {n: f"the chapter's last {n}\n" for n in latest}
    (kept,) = [p for p in (tmp_path / "runs").glob("*.json") if not p.name.endswith(".benchmarks.json")]
    rec = schema.read_record(kept)
    assert rec["run"]["fault"] == name and rec["claims"]["KV-BYTES-FORMULA"]["verdict"] == vocabulary.DEVIATES
    assert f"record of this run with the fault {name} injected: {kept}" in proc.stdout, proc.stdout[-3000:]
    assert "were not replaced" in proc.stdout


@pytest.mark.parametrize("fork", [True, False], ids=["fork-server", "fresh-interpreter"])
def test_a_fault_run_starts_pytest_from_the_fork_server_or_a_fresh_interpreter(monkeypatch, tmp_path, fork):
    """Both ways of starting a fault's pytest give its exit status and its output's last line; a timeout is None."""
    if not fork:
        monkeypatch.setattr(child, "_fork_context", lambda: None)
    code, tail = child.pytest_run(["--version"], ROOT, 1, 120, tmp_path / "pytest.log")
    assert code == 0 and tail.startswith("pytest "), (code, tail)
    code, _ = child.pytest_run(["claims/test_budget.py", "-q", "-p", "no:cacheprovider", "--report-dir", str(tmp_path)], ROOT, 1, 0.01, tmp_path / "slow.log")
    assert code is None


@pytest.mark.faults
def test_every_known_fault_turns_a_claim_red_in_every_run(tmp_path, capfd):
    """The whole catalogue (minutes): every fault turns at least one of its claims red, in each of 3 runs."""
    proc = cheapinfer(capfd, "faults", "--runs", "3", "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("args, message", [(["--fault", "no-such-fault"], "no such fault"), (["--claims", "NOPE-1"], "no such claim ID"),
                                           (["--fault", ""], "--fault: the value is empty")])
def test_unknown_fault_or_claim_is_a_usage_error(args, message, pytester):
    proc = suite(pytester, "claims/test_budget.py", "-q", *args)
    assert proc.returncode == 4 and message in proc.stderr, proc.stderr


def _processes_with(marker: str) -> list[int]:
    """The processes whose environment carries ``marker`` (the runner and everything it started)."""
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in env.read_bytes():
                found.append(int(env.parent.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the runner's processes through /proc")
def test_sigterm_stops_the_fault_runs_and_removes_their_temporary_directory(tmp_path):
    """SIGTERM during a fault run: its pytest is stopped, cheapinfer-faults-* is removed, one line, exit 143."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    marker = f"CHEAPINFER_TEST_MARK={tmp_path.name}"
    env = {**os.environ, "TMPDIR": str(temp), "CHEAPINFER_TEST_MARK": tmp_path.name}
    # EVAL-TABLE's fault runs for a minute and more: long enough to be stopped in the middle.
    proc = subprocess.Popen([sys.executable, "-m", "cheapinfer", "faults", "eval-ppl-windows-overlap", "--report-dir", str(tmp_path / "out")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not list(temp.glob("cheapinfer-faults-*/*/pytest.log")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    if not list(temp.glob("cheapinfer-faults-*/*/pytest.log")):
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"no fault run started (the runner's exit status {proc.returncode}): {(out + err)[-3000:]}")
    time.sleep(1)
    assert len(_processes_with(marker)) >= 2  # the runner and the fault run's pytest
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err
    assert [line for line in err.splitlines() if line.strip()] == [
        "cheapinfer faults: terminated (SIGTERM): the running fault runs were stopped and their temporary directory removed; nothing was written"
    ]
    assert not list(temp.glob("cheapinfer-faults-*")) and not (tmp_path / "out" / schema.FAULTS_NAME).exists()
    deadline = time.monotonic() + 30  # the fork server notices its parent is gone and exits
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(marker) == []



@pytest.mark.skipif(sys.platform == "win32", reason="no fork server")
def test_the_fork_server_starts_under_a_temporary_directory_too_long_for_its_socket(tmp_path):
    """Under a TMPDIR of 90 characters and more the fork server's socket path would pass the 107 bytes a Unix
    socket binds to, and every fault run failed with a traceback ("AF_UNIX path too long"); the server now binds
    under /tmp, and a process forked from it runs."""
    long_dir = tmp_path / ("d" * max(1, 100 - len(str(tmp_path))))
    long_dir.mkdir()
    code = ("from cheapinfer.audits import forks as child\n"
            "child._PRELOAD = []  # the server alone, without torch\n"
            "p = child._fork_context().Process(target=print, args=('forked',))\n"
            "p.start(); p.join(); print('exit', p.exitcode)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(long_dir)})
    assert out.returncode == 0 and out.stdout.split() == ["forked", "exit", "0"], out.stderr[-2000:]

def test_a_halted_runner_starts_no_fault_run(monkeypatch):
    """After halt() (SIGTERM), a worker that was about to start a fault's pytest does not."""
    monkeypatch.setattr(child, "_fork_context", lambda: None)
    child.halt()
    try:
        with pytest.raises(child.Halted):
            child.pytest_run(["--version"], ROOT, 1, 60, Path("unused.log"))
    finally:
        child.clear_halt()


# ------------------------------------------------------------------------------------------------
# the plan: which claims each fault run tries, in which phase and order (pure)
# ------------------------------------------------------------------------------------------------

_TARGETS = {"quick": ("A",), "long": ("B",), "timed": ("C", "T"), "only-timed": ("T",), "slow": ("S",)}


def test_the_sweep_counts_unclocked_claims_first_and_times_clocked_ones_alone_after():
    first, quiet = faults.plan(_TARGETS, 2, clocked={"T"}, slow={"S"}, last_seconds={"long": 300.0})
    assert quiet == ["timed", "only-timed"]
    assert all("T" not in claims for _, _, claims in first), first  # a clocked claim never runs beside another fault
    assert {(n, i) for n, i, _ in first} == {(n, i) for n in ("quick", "long", "timed", "slow") for i in range(2)}  # only-timed has nothing counted
    assert [n for n, _, _ in first[:2]] == ["long", "long"]  # the longest last time starts first
    assert [n for n, _, _ in first[2:4]] == ["slow", "slow"]  # then, without a last time, the slow tests
    alone = faults.alone_jobs(_TARGETS, quiet, 2, {"T"}, caught=lambda n, i: (n, i) == ("timed", 0))
    assert alone == [("timed", 1, ("T",)), ("only-timed", 0, ("T",)), ("only-timed", 1, ("T",))]  # run 0 of timed was caught counted


def test_all_targets_runs_every_claim_and_a_fault_with_a_clocked_one_alone():
    first, quiet = faults.plan(_TARGETS, 1, clocked={"T"}, slow=set(), last_seconds={}, all_targets=True)
    assert {n for n, _, _ in first} == {"quick", "long", "slow"} and quiet == ["timed", "only-timed"]
    alone = faults.alone_jobs(_TARGETS, quiet, 1, {"T"}, caught=lambda n, i: True, all_targets=True)
    assert alone == [("timed", 0, ("C", "T")), ("only-timed", 0, ("T",))]  # caught or not: every target claim runs


# a check's own fault (registry ``fault``): the sweep runs its claim to the end under it and fails where it holds
# ------------------------------------------------------------------------------------------------


def test_every_check_that_names_a_fault_names_one_of_the_catalogue_aimed_at_its_claim():
    cat, named = faults.catalogue(), faults.declared_checks()
    assert named, "no check names its fault"
    for name, checks in named.items():
        assert name in cat, f"a check names {name!r}, which the catalogue lacks"
        assert {cid for cid, _ in checks} <= set(cat[name].targets), f"{name} does not name the claim of the check that names it: {checks}"


def test_a_claims_checks_by_outcome_over_its_profiles():
    claim = {"results": [
        {"test": "t", "checks": [{"q": "a", "expected": "a < 1", "passed": True}, {"q": "b", "expected": "b == 2", "passed": True}]},
        {"test": "t", "checks": [{"q": "a", "expected": "a < 1", "passed": False}, {"q": "c", "passed": True}]},
        {"checks": [{"q": "d", "passed": False}]},  # the placeholder of an unselected test: no test, not judged
    ]}
    assert faults.checks_of(claim) == {"failed": ["a < 1"], "held": ["b == 2", "c"]}


def test_a_check_that_holds_under_its_own_fault_fails_the_sweep_even_when_its_claim_goes_red(monkeypatch, tmp_path):
    """The claim is red under the fault (another check failed), yet a check that names the fault was never judged failing."""
    cat = faults.catalogue()
    name = next(n for n, f in cat.items() if not set(f.targets) & registry.clocked_claims())
    cid = cat[name].targets[0]
    declared = {name: [(cid, "q == 1"), (cid, "r > 0")]}
    _logging_runner(monkeypatch, red=lambda c: True, declared=declared)
    result = faults.run([name], 2, tmp_path, echo=lambda line: None)
    assert result["faults"][name]["caught"] == 2
    assert [(t["check"], t["run"], t["status"]) for t in result["toothless"]] == [("r > 0", 1, "not judged"), ("r > 0", 2, "not judged")]
    rows = faults.teeth_table(result)
    assert any(f"{cid}: `q == 1`" in row and "failed 2/2" in row for row in rows)
    assert any(f"{cid}: `r > 0`" in row and "failed 0/2" in row for row in rows)


def test_toothless_names_a_check_that_held_and_passes_over_faults_not_run():
    declared = {"f": [("A", "x < 1")], "g": [("B", "y > 0")]}
    runs = {"f": {"checks": [{"A": {"failed": [], "held": ["x < 1"]}}, {"A": {"failed": ["x < 1"], "held": []}}]}}
    assert faults.toothless(declared, runs) == [{"claim": "A", "check": "x < 1", "fault": "f", "run": 1, "status": "held"}]


def test_a_fault_named_by_a_check_runs_that_claim_to_the_end_and_its_clocked_claim_even_when_caught(monkeypatch, tmp_path):
    cat, clocked = faults.catalogue(), registry.clocked_claims()
    mixed = next(n for n, f in cat.items() if set(f.targets) & clocked and set(f.targets) - clocked)
    timed = next(c for c in cat[mixed].targets if c in clocked)
    log = _logging_runner(monkeypatch, red=lambda cid: True, declared={mixed: [(timed, "q == 1")]})
    result = faults.run([mixed], 1, tmp_path, echo=lambda line: None)
    assert [(set(claims) & clocked, stop) for _, claims, _, _, stop in log] == [(set(), True), ({timed}, False)]
    assert result["toothless"] == []
    alone = faults.alone_jobs(_TARGETS, ["timed"], 1, {"T"}, caught=lambda n, i: True, must={"timed": {"T"}})
    assert alone == [("timed", 0, ("T",))] and faults.alone_jobs(_TARGETS, ["timed"], 1, {"T"}, caught=lambda n, i: True) == []


def test_every_fault_that_models_some_releases_names_them_as_a_version_range():
    """``applies``: an installed library's name and a PEP 440 specifier; a typo would leave the fault run everywhere."""
    from importlib import metadata

    from packaging.specifiers import SpecifierSet

    ranged = {n: f.applies for n, f in faults.catalogue().items() if f.applies}
    assert "kv-listing-deaf-to-logged-deprecations" in ranged
    for name, applies in ranged.items():
        for library, spec in applies.items():
            metadata.version(library)  # installed with the suite: raises for a misspelt name
            assert SpecifierSet(spec), (name, spec)


def test_a_fault_outside_its_releases_is_not_run_and_not_missed(monkeypatch, tmp_path, capsys):
    """transformers 4.x deprecates no cache keyword, so a collector deaf to transformers' logger has nothing to miss there:
    the sweep says so in one line, records why, and does not count it missed; inside its range it is run as ever."""
    from cheapinfer.faults import base

    name = "kv-listing-deaf-to-logged-deprecations"
    ran = []
    monkeypatch.setattr(faults, "declared_checks", dict)
    monkeypatch.setattr(faults, "_run_one", lambda f, claims, outdir, timeout, threads=None, stop=False:
                        (ran.append(f.name), faults.FaultRun({cid: vocabulary.RED for cid in claims}, {}))[1])
    for installed, runs in (("4.57.6", False), ("5.24.0", True)):
        ran.clear()
        monkeypatch.setattr(faults, "inapplicable", lambda f, v=None, installed=installed: base.inapplicable(f, {"transformers": installed}))
        lines = []
        result = faults.run([name], 1, tmp_path, echo=lines.append)
        assert (ran == [name]) is runs and (name in result["faults"]) is runs
        assert schema.check_fault_record(json.loads(json.dumps(result))) == result  # faults.json reads back
        if not runs:
            assert result["not_applicable"] == {name: "models transformers >=5; this environment has transformers 4.57.6"}
            assert lines[0] == f"n/a     {name}: not run: it models transformers >=5; this environment has transformers 4.57.6"
        else:
            assert result["not_applicable"] == {} and result["faults"][name]["caught"] == 1
