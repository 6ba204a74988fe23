"""The fault catalogue itself: every fault patches something real, and the runner tells caught from missed.

The full run (every fault, every target claim) is ``python -m cheapinfer faults`` or
``pytest -m faults tests/test_faults.py``; it takes minutes, so plain ``pytest`` runs it only for one
cheap fault, end to end.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from cheapinfer import faults, registry
from cheapinfer import record

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", list(faults.catalogue()), ids=str)
def test_every_fault_patches_existing_code_and_restores_it(name):
    """A fault whose target was renamed would be silently inert: entering it must patch a real attribute."""
    f = faults.catalogue()[name]
    assert f.kind in faults.KINDS and f.what.strip()
    assert set(f.targets) <= set(registry.load()), f"{name} names claims the registry lacks"
    assert set(f.targets) <= set(record.tested_ids(ROOT / "claims")), f"{name} names claims without a test"
    with f.activate():
        pass


def test_faults_cover_every_section_of_the_chapter():
    sections = {f.section for f in faults.catalogue().values()}
    wanted = {c.section for c in registry.load().values()} - {"ASIDE"}
    assert wanted <= sections, f"sections without a fault: {sorted(wanted - sections)}"


def test_the_runner_reports_a_fault_that_turns_nothing_red(monkeypatch, tmp_path):
    """A missed fault is an exit-1 finding, with the claim's verdict beside it."""
    some = next(iter(faults.catalogue()))
    monkeypatch.setattr(faults, "_run_one", lambda f, outdir, timeout, threads=None: {cid: registry.REPRODUCED for cid in f.targets})
    result = faults.run([some], 2, tmp_path, echo=lambda line: None)
    assert result["faults"][some]["caught"] == 0
    assert any("red 0/2" in row and "reproduced" in row for row in faults.table(result))


def test_clocked_claims_are_the_ones_whose_tests_read_a_clock():
    clocked = faults.clocked_claims()
    assert {"KV-SPEEDUP-48", "BAT-TRADEOFF", "BAT-STATIC-CONT", "Q-BYTES-SPEED", "SPEC-REAL-SLOWDOWN", "KV-HEAD-TIMING"} <= clocked
    assert not clocked & {"KV-IDENTITY", "KV-BYTES-FORMULA", "Q-ABSMAX", "EVAL-TABLE", "SPEC-EXACT-GREEDY", "KV-MEMORY-8.3X"}


def test_faults_on_clocked_claims_never_run_beside_another(monkeypatch, tmp_path):
    """A neighbour's load must never be what turned a timing claim red: those faults run alone, after the others."""
    import threading
    import time

    cat = faults.catalogue()
    clocked = faults.clocked_claims()
    timed = next(n for n, f in cat.items() if set(f.targets) & clocked)
    counted = [n for n, f in cat.items() if not set(f.targets) & clocked][:3]
    active, log = [], []
    lock = threading.Lock()

    def fake(f, outdir, timeout, threads=None):
        with lock:
            active.append(f.name)
            log.append((f.name, tuple(active), threads))
        time.sleep(0.05)
        with lock:
            active.remove(f.name)
        return {cid: faults.RED for cid in f.targets}

    monkeypatch.setattr(faults, "_run_one", fake)
    faults.run([timed, *counted], 1, tmp_path, echo=lambda line: None)
    alone = [entry for entry in log if entry[0] == timed]
    assert alone == [(timed, (timed,), None)], log
    assert log[-1][0] == timed and all(t == 1 for n, _, t in log if n != timed)
    assert max(len(a) for _, a, _ in log) == 2


def test_a_fault_turns_its_claim_red_end_to_end(tmp_path):
    """One cheap fault through the real path: pytest --fault, the registry, the record, the table."""
    proc = subprocess.run(
        [sys.executable, "-m", "cheapinfer", "faults", "kv-bytes-counts-query-heads", "--report-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| kv-bytes-counts-query-heads | wrong constant | KV-BYTES-FORMULA | red 1/1 |" in proc.stdout
    assert faults.last_run(tmp_path)["faults"]["kv-bytes-counts-query-heads"]["caught"] == 1


@pytest.mark.faults
def test_every_known_fault_turns_a_claim_red_in_every_run(tmp_path):
    """The whole catalogue (minutes): every fault turns at least one of its claims red, in each of 3 runs."""
    proc = subprocess.run([sys.executable, "-m", "cheapinfer", "faults", "--runs", "3", "--report-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("args, message", [(["--fault", "no-such-fault"], "no such fault"), (["--claims", "NOPE-1"], "no such claim ID")])
def test_unknown_fault_or_claim_is_a_usage_error(args, message):
    proc = subprocess.run([sys.executable, "-m", "pytest", "claims/test_budget.py", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4 and message in proc.stderr, proc.stderr
