"""Run records are never lost: the report directory is checked first, every run keeps its own record,
the latest is replaced atomically, and pytest works from any directory.

The runs select one arithmetic claim (KV-BYTES-FORMULA), so each takes a few seconds.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cheapinfer import report

ROOT = Path(__file__).resolve().parent.parent
ONE_CLAIM = ["claims/test_kv_cache.py::test_kv_cache_is_12288_bytes_per_token"]


def _pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _usage_error(run: subprocess.CompletedProcess) -> str:
    """The one ERROR line of a pytest usage error (exit 4), with no traceback."""
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Traceback" not in run.stdout + run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("ERROR: ")]
    assert len(lines) == 1, run.stderr
    return lines[0]


def test_a_report_dir_that_is_a_file_is_a_usage_error_before_any_test(tmp_path):
    target = tmp_path / "reports"
    target.write_text("a file")
    line = _usage_error(_pytest(*ONE_CLAIM, f"--report-dir={target}"))
    assert line == f"ERROR: --report-dir {target}: it is a file, not a directory"
    assert target.read_text() == "a file"


def test_a_report_dir_that_cannot_be_created_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("")
    line = _usage_error(_pytest(*ONE_CLAIM, f"--report-dir={tmp_path / 'file' / 'reports'}"))
    assert "cannot create the directory" in line


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a user whom file permissions bind (not root)")
def test_a_report_dir_without_write_permission_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(ValueError, match="cannot write in the directory"):
        report.writable_dir(locked)


def test_two_concurrent_runs_into_one_directory_keep_both_records(tmp_path):
    out = tmp_path / "reports"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *ONE_CLAIM, f"--report-dir={out}"]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    kept = sorted((out / report.RUNS_DIR).glob("*.json"))
    assert sorted(int(k.stem.rsplit("-", 1)[1]) for k in kept) == sorted(p.pid for p in procs)
    records = [json.loads(k.read_text()) for k in kept]
    assert all(r["claims"]["KV-BYTES-FORMULA"]["verdict"] == "reproduced" for r in records)
    assert json.loads((out / report.RECORD_NAME).read_text()) in records  # the latest is one of them, whole
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_pytest_runs_from_another_directory(tmp_path):
    """``pytest /path/to/checkout``: the rootdir is the checkout; a relative --report-dir is the caller's;
    the benchmark JSON goes into the report directory, not into a reports/ of the caller's directory."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = _pytest(str(ROOT), "-k", "test_kv_cache_is_12288_bytes_per_token", "--report-dir=out", cwd=elsewhere)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    record = json.loads((elsewhere / "out" / report.RECORD_NAME).read_text())
    assert record["claims"]["KV-BYTES-FORMULA"]["verdict"] == "reproduced"
    assert record["run"]["benchmarks"] == "benchmarks.json"  # <report dir>/benchmarks.json
    assert not (elsewhere / "reports").exists()


def test_write_replaces_the_latest_and_keep_never_overwrites(tmp_path):
    record = report.load(ROOT / "tests" / "data" / "run-record.json")
    first, second = report.keep(record, tmp_path), report.keep(record, tmp_path)  # same process, same second
    assert first != second and first.read_text() == second.read_text()
    rec, _ = report.write(record, tmp_path)
    assert report.load(rec) == record
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([report.RECORD_NAME, report.ERRATA_NAME, report.RUNS_DIR])


def _verify(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cheapinfer", "verify", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_verify_prints_no_stale_summary_after_a_usage_error(tmp_path):
    shutil.copy(ROOT / "tests" / "data" / "run-record.json", tmp_path / report.RECORD_NAME)  # an older run's record
    run = _verify("--report-dir", str(tmp_path), "--perturb", "KV-NOPE")
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "**all**" not in run.stdout and "Errata report" not in run.stdout


def test_verify_prints_the_summary_of_its_own_run_in_its_report_dir(tmp_path):
    (tmp_path / "out").mkdir()
    shutil.copy(ROOT / "tests" / "data" / "run-record.json", tmp_path / "out" / report.RECORD_NAME)  # an older run's
    run = _verify("--report-dir", "out", "-k", "test_kv_cache_is_12288_bytes_per_token", cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    kept = list((tmp_path / "out" / report.RUNS_DIR).glob("*.json"))
    assert len(kept) == 1 and f"Run record: {kept[0]}" in run.stdout
    summary = report.summary_table(report.load(kept[0]))
    assert "\n".join(summary) in run.stdout
