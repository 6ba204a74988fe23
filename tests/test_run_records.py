"""Run records are never lost: the report directory is checked first, every run keeps its own record (and
its timings), the latest is replaced atomically and only by a run that ran, and pytest works from any directory.

The runs select one arithmetic claim (KV-BYTES-FORMULA), so each takes a few seconds.
"""

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from commands import cheapinfer
from plugin_runs import errors, suite
from plugin_runs import run as plugin_run

from cheapinfer.harness import author, report, schema, store, tables

ROOT = Path(__file__).resolve().parent.parent
ONE_CLAIM = ["claims/test_kv_cache.py::test_kv_cache_is_12288_bytes_per_token"]
#: A claim whose test is timed (pytest-benchmark writes its JSON), in about 3 s.
ONE_TIMED_CLAIM = ["claims/test_kv_cache.py::test_head_recompute_over_cached_grows_with_n"]


def _pytest(pytester: pytest.Pytester, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return suite(pytester, "-q", *args, cwd=cwd)


#: A made-up claim test (the runs below check the plugin's configure, collection and record, not a measurement).
CLAIM_TEST = """
import pytest


@pytest.mark.claim("KV-BYTES-FORMULA")
def test_claim(claim):
    from cheapinfer.chapter.kv_cache import kv
    from cheapinfer.runtime.arch import QWEN25_05B

    claim.verify("arithmetic", bytes_per_token=kv.arch_kv_bytes_per_token(QWEN25_05B, 2))
"""


def _plugin_usage_error(pytester: pytest.Pytester, *args: str, code: int = 4) -> str:
    """The one line on standard error of a run of :data:`CLAIM_TEST` through the plugin (pytester) that ends with ``code``."""
    pytester.makepyfile(test_claim=CLAIM_TEST)
    result = plugin_run(pytester, "-q", *args)  # the last --report-dir given wins
    assert result.ret == code, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert len(errors(result)) == 1, result.stderr.str()
    return errors(result)[0]


def _usage_error(run: subprocess.CompletedProcess, code: int = 4) -> str:
    """The one line on standard error of a run that ends with ``code`` (a pytest usage error: 4), with no traceback."""
    assert run.returncode == code, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Traceback" not in run.stdout + run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    return lines[0]


def test_a_report_dir_that_is_a_file_is_a_usage_error_before_any_test(pytester):
    target = pytester.path / "out"
    target.write_text("a file")
    line = _plugin_usage_error(pytester, f"--report-dir={target}")
    assert line == f"ERROR: --report-dir {target}: it is a file, not a directory"
    assert target.read_text() == "a file"


def test_a_report_dir_that_cannot_be_created_is_a_usage_error(pytester):
    (pytester.path / "file").write_text("")
    line = _plugin_usage_error(pytester, f"--report-dir={pytester.path / 'file' / 'reports'}")
    assert f"its parent {pytester.path / 'file'} is a file, not a directory" in line  # the real cause, never "File exists"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a user whom file permissions bind (not root)")
def test_a_report_dir_without_write_permission_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(ValueError, match="cannot write in the directory"):
        store.writable_dir(locked)


def test_two_concurrent_runs_into_one_directory_keep_both_records(tmp_path):
    out = tmp_path / "reports"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *ONE_CLAIM, f"--report-dir={out}"]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    kept = sorted((out / store.RUNS_DIR).glob("*.json"))
    records = [json.loads(k.read_text()) for k in kept]
    assert len(kept) == 2 and [k.stem.rsplit("-", 1)[1] for k in kept] == [r["run"]["id"] for r in records]
    assert records[0]["run"]["id"] != records[1]["run"]["id"]
    assert all(r["claims"]["KV-BYTES-FORMULA"]["verdict"] == "reproduced" for r in records)
    assert json.loads((out / schema.RECORD_NAME).read_text()) in records  # the latest is one of them, whole
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_pytest_runs_from_another_directory(tmp_path, pytester):
    """``pytest /path/to/checkout``: the rootdir is the checkout; a relative --report-dir is the caller's;
    the benchmark JSON goes into the report directory, not into a reports/ of the caller's directory."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = _pytest(pytester, str(ROOT), "-k", "test_kv_cache_is_12288_bytes_per_token", "--report-dir=out", cwd=elsewhere)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    record = json.loads((elsewhere / "out" / schema.RECORD_NAME).read_text())
    assert record["claims"]["KV-BYTES-FORMULA"]["verdict"] == "reproduced"
    assert record["run"]["benchmarks"] is None  # nothing timed: no timings, and none of another run named
    assert not (elsewhere / "reports").exists()


def test_write_replaces_the_latest_and_keep_never_overwrites(tmp_path):
    record = schema.read_record(ROOT / "tests" / "data" / "run-record.json")
    first, second = store.keep(record, tmp_path), store.keep(record, tmp_path)  # same process, same second
    assert first != second and first.read_text() == second.read_text()
    rec, _ = report.write(record, tmp_path)
    assert schema.read_record(rec) == record
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([schema.RECORD_NAME, store.ERRATA_NAME, author.EVIDENCE_NAME, author.JSON_NAME, store.RUNS_DIR])


def _verify(capfd, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return cheapinfer(capfd, "verify", *args, cwd=cwd)


def test_verify_prints_no_stale_summary_after_a_usage_error(tmp_path, capfd):
    shutil.copy(ROOT / "tests" / "data" / "run-record.json", tmp_path / schema.RECORD_NAME)  # an older run's record
    run = _verify(capfd, "--report-dir", str(tmp_path), "--perturb", "KV-NOPE")
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "**all**" not in run.stdout and "Errata report" not in run.stdout


def test_verify_prints_the_summary_of_its_own_run_in_its_report_dir(tmp_path, capfd):
    (tmp_path / "out").mkdir()
    shutil.copy(ROOT / "tests" / "data" / "run-record.json", tmp_path / "out" / schema.RECORD_NAME)  # an older run's
    run = _verify(capfd, "--report-dir", "out", "-k", "test_kv_cache_is_12288_bytes_per_token", cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    kept = list((tmp_path / "out" / store.RUNS_DIR).glob("*.json"))
    assert len(kept) == 1 and f"Run record: {kept[0]}" in run.stdout
    summary = tables.summary_table(schema.read_record(kept[0]))
    assert "\n".join(summary) in run.stdout


# ----------------------------------------------------------------------------------------------
# a run that did not run replaces nothing; a record that cannot be written is one line
# ----------------------------------------------------------------------------------------------


def _seeded(out: Path) -> dict[str, bytes]:
    """A report directory holding an earlier run's run.json, errata.md, evidence.md and errata.json; their bytes."""
    out.mkdir(parents=True, exist_ok=True)
    record = schema.read_record(ROOT / "tests" / "data" / "run-record.json")
    report.write(record, out)
    names = (schema.RECORD_NAME, store.ERRATA_NAME, author.EVIDENCE_NAME, author.JSON_NAME)
    return {name: (out / name).read_bytes() for name in names}


def _unchanged(out: Path, before: dict[str, bytes]) -> bool:
    return {name: (out / name).read_bytes() for name in before} == before


def test_a_usage_error_in_the_marker_expression_replaces_no_record(pytester):
    """``pytest -m "nto slow"`` (exit 4) used to replace run.json and errata.md with an empty record."""
    out = pytester.path / "reports"
    before = _seeded(out)
    line = _plugin_usage_error(pytester, "-m", "nto slow")
    assert line == "ERROR: Wrong expression passed to '-m': nto slow: at column 5: expected end of input; got identifier"
    assert _unchanged(out, before) and not (out / store.RUNS_DIR).exists()


def test_a_collection_error_replaces_no_record(pytester):
    out = pytester.path / "reports"
    before = _seeded(out)
    pytester.makepyfile(test_broken="def test_broken(:\n", test_claim=CLAIM_TEST)
    result = plugin_run(pytester, "-q")
    assert result.ret == 2 and "1 error during collection" in result.stdout.str(), result.stdout.str()[-2000:]
    assert _unchanged(out, before) and not (out / store.RUNS_DIR).exists()


def test_a_selection_of_no_test_replaces_no_record(tmp_path, capfd):
    """``verify -k no_such_test_name`` (pytest exit 5) used to replace run.json and errata.md with an empty record."""
    out = tmp_path / "reports"
    before = _seeded(out)
    run = _verify(capfd, "--report-dir", str(out), "-k", "no_such_test_name")
    assert _usage_error(run, 5) == ("cheapinfer verify: no test was selected, nothing was run; "
                                    "the latest run.json and errata.md were not replaced")
    assert "**all**" not in run.stdout and "Run record" not in run.stdout
    assert "no record written (the latest run.json and errata.md were not replaced)" in run.stdout  # pytest's own line
    assert _unchanged(out, before) and not (out / store.RUNS_DIR).exists()


def test_a_run_of_the_suites_own_tests_replaces_no_record(tmp_path, pytester):
    """``pytest tests/test_rounding.py`` measures nothing about the chapter: it used to replace run.json and errata.md
    with a record of 61 claims not run."""
    out = tmp_path / "reports"
    before = _seeded(out)
    run = _pytest(pytester, "tests/test_rounding.py", f"--report-dir={out}")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "no claim test was selected: no record written (the latest run.json and errata.md were not replaced)" in run.stdout.splitlines()
    assert _unchanged(out, before) and not (out / store.RUNS_DIR).exists()


@pytest.mark.parametrize("where", ["below-a-file", "a-directory"])
def test_an_unwritable_benchmark_json_is_a_usage_error_before_any_test(where, pytester):
    """pytest-benchmark writes its JSON after the last test; failing there used to lose the run's record."""
    (pytester.path / "file").write_text("")
    path = pytester.path / "file" / "benchmarks.json" if where == "below-a-file" else pytester.path
    line = _plugin_usage_error(pytester, f"--benchmark-json={path}")
    message = f"its directory {pytester.path / 'file'}: it is a file, not a directory" if where == "below-a-file" else "it is a directory, not a file"
    assert line == f"ERROR: --benchmark-json {path}: {message}"
    assert not (pytester.path / "reports" / schema.RECORD_NAME).exists()


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_leaves_the_previous_record_and_no_temporary_file(tmp_path, monkeypatch):
    before = _seeded(tmp_path)
    monkeypatch.setattr(store, "_write_all", _enospc)
    record = schema.read_record(ROOT / "tests" / "data" / "run-record.json")
    record["created"] = "2030-01-01T00:00:00Z"
    with pytest.raises(OSError) as err:
        report.write(record, tmp_path)
    assert err.value.errno == errno.ENOSPC
    with pytest.raises(OSError):
        store.keep(record, tmp_path)
    assert _unchanged(tmp_path, before)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(before)  # no .tmp left anywhere


def _aside(monkeypatch, plugins: Path, aside: Path) -> None:
    """A run in an interpreter of its own (its plugin patches the report writing) finds its plugin in ``plugins`` and
    keeps its record aside in ``aside`` (its TMPDIR)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TMPDIR", str(aside))


def test_a_full_disk_at_the_end_of_a_run_is_one_line(tmp_path, pytester, monkeypatch):
    """The whole path: the plugin's report writing fails with ENOSPC; one ERROR line, the previous pair intact."""
    out = tmp_path / "reports"
    before = _seeded(out)
    (tmp_path / "enospc.py").write_text(
        "import errno, os\nfrom cheapinfer.harness import store\n\n\ndef pytest_configure(config):\n"
        "    def full(fd, data):\n        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n\n    store._write_all = full\n"
    )
    aside = tmp_path / "aside"  # the same full disk: the record is printed, not lost
    aside.mkdir()
    _aside(monkeypatch, tmp_path, aside)
    run = suite(pytester, "-q", "-p", "enospc", *ONE_CLAIM, f"--report-dir={out}", separate=True)
    line = _usage_error(run, code=3)
    assert line == (f"ERROR: cannot write this run's record in {out}: No space left on device; the latest run.json and errata.md are as they "
                    f"were; this run's record could not be kept in {aside} either (No space left on device), so it was printed on standard output")
    assert _unchanged(out, before) and list(aside.iterdir()) == []
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert '"schema": ' in run.stdout and ONE_CLAIM[0].split("::")[0] in run.stdout


def test_a_run_whose_report_dir_is_full_keeps_its_record_aside(tmp_path, pytester, monkeypatch):
    """A full report dir (its own copy in runs/ fails too) with room elsewhere: the record is kept in TMPDIR and named."""
    out, aside = tmp_path / "reports", tmp_path / "aside"
    before = _seeded(out)
    aside.mkdir()
    (tmp_path / "fullhere.py").write_text(
        "import errno, os\nfrom cheapinfer.harness import report, store\n\n\ndef pytest_configure(config):\n"
        "    def full(*args, **kwargs):\n        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n\n    store.keep = report.write = full\n"
    )
    _aside(monkeypatch, tmp_path, aside)
    run = suite(pytester, "-q", "-p", "fullhere", *ONE_CLAIM, f"--report-dir={out}", separate=True)
    line = _usage_error(run, code=3)
    kept = list(aside.glob("cheapinfer-run-*.json"))
    assert len(kept) == 1 and line.endswith(f"are as they were; this run's record was kept as {kept[0]} instead"), line
    assert _unchanged(out, before)
    assert schema.read_record(kept[0])["run"]["exit_status"] == 0


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_report_files_get_the_mode_the_umask_gives(umask, tmp_path):
    """Not 0600 (tempfile's mode): 0666 less the umask, as any file the user writes."""
    old = os.umask(umask)
    try:
        record = schema.read_record(ROOT / "tests" / "data" / "run-record.json")
        kept = store.keep(record, tmp_path)
        rec, md = report.write(record, tmp_path)
    finally:
        os.umask(old)
    for path in (kept, rec, md):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


def test_each_run_keeps_its_own_timings(tmp_path, pytester):
    """benchmarks.json is the latest run's; each run's record names the copy of its own timings beside it."""
    out = tmp_path / "reports"
    ids = []
    for _ in range(2):
        run = _pytest(pytester, *ONE_TIMED_CLAIM, f"--report-dir={out}")
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        ids.append(json.loads((out / schema.RECORD_NAME).read_text())["run"]["id"])
    latest = json.loads((out / "benchmarks.json").read_text())
    for run_id in ids:
        [kept] = (out / store.RUNS_DIR).glob(f"*-{run_id}.json")
        record = json.loads(kept.read_text())
        assert record["run"]["benchmarks"] == f"{store.RUNS_DIR}/{kept.stem}{store.BENCHMARKS_SUFFIX}"
        timings = json.loads((out / record["run"]["benchmarks"]).read_text())
        assert timings["benchmarks"][0]["name"] == "test_head_recompute_over_cached_grows_with_n"
        assert (timings == latest) == (run_id == ids[-1])  # the latest file is the last run's; the first kept its own


# ----------------------------------------------------------------------------------------------
# a run is known by its id, not its pid; verify finds its own record by that id
# ----------------------------------------------------------------------------------------------


def test_the_run_id_verify_passes_names_the_record(tmp_path, pytester, monkeypatch):
    monkeypatch.setenv(store.RUN_ID_VARIABLE, "feedc0ffee42")
    run = suite(pytester, "-q", *ONE_CLAIM, f"--report-dir={tmp_path}")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [kept] = (tmp_path / store.RUNS_DIR).glob("*.json")
    assert kept.name.endswith("-feedc0ffee42.json") and schema.read_record(kept)["run"]["id"] == "feedc0ffee42"


def test_verify_gives_each_run_a_new_id_and_finds_no_summary_without_its_record(tmp_path, monkeypatch, capsys):
    """The mechanism behind verify's summary: the record of its own run id, else nothing (a usage error)."""
    from cheapinfer import cli

    seen = []
    runs = tmp_path / store.RUNS_DIR
    runs.mkdir()
    for pid in range(1, 50):  # records an older run left, named the old way, by a pid the child may have now
        shutil.copy(ROOT / "tests" / "data" / "run-record.json", runs / f"20250101T000000Z-{pid}.json")

    def child(cmd, env):
        seen.append(env[store.RUN_ID_VARIABLE])
        return 4, False

    monkeypatch.setattr(cli.verify, "_run_interruptibly", child)
    for _ in range(2):
        assert cli.main(["verify", "--report-dir", str(tmp_path)]) == 4
    assert len(set(seen)) == 2 and capsys.readouterr().out == ""


@pytest.mark.skipif(shutil.which("unshare") is None or os.name != "posix", reason="needs unshare (util-linux)")
def test_verify_in_a_fresh_pid_namespace_prints_no_older_runs_summary(tmp_path):
    """In a new PID namespace the child pytest gets a small pid that an older run's record may carry."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid is not allowed here: {probe.stderr.decode(errors='replace').strip()}")
    runs = tmp_path / store.RUNS_DIR
    runs.mkdir()
    for pid in range(1, 50):
        shutil.copy(ROOT / "tests" / "data" / "run-record.json", runs / f"20250101T000000Z-{pid}.json")
    run = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "cheapinfer", "verify",
                          "--report-dir", str(tmp_path), "--perturb", "KV-NOPE"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert _usage_error(run) == "ERROR: --perturb: no such claim ID: KV-NOPE"
    assert "**all**" not in run.stdout and "Run record" not in run.stdout


# ----------------------------------------------------------------------------------------------
# Ctrl-C during verify: one line, exit 130, the run's own record kept (marked), the latest untouched
# ----------------------------------------------------------------------------------------------


def test_an_interrupt_in_a_frame_without_a_line_number_is_rendered_not_crashed_on():
    """Python 3.11+ may give an interrupted frame tb_lineno None; pytest's renderer then raised its own TypeError."""
    from _pytest._code.code import ExceptionInfo, Traceback, TracebackEntry

    from fixtures import options, recording

    class NoLine:  # the raw traceback entry of such a frame
        def __init__(self, tb):
            self.tb = tb

        def __getattr__(self, name):
            return None if name == "tb_lineno" else getattr(self.tb, name)

    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        excinfo = ExceptionInfo.from_current()
    entries = list(excinfo.traceback)
    excinfo.traceback = Traceback(entries + [TracebackEntry(NoLine(entries[-1]._rawentry))])
    with pytest.raises(TypeError):
        excinfo.getrepr(funcargs=True)  # what the terminal reporter does with it
    recording.pytest_keyboard_interrupt(excinfo)
    options.interrupted_by_user.clear()
    assert "KeyboardInterrupt" in str(excinfo.getrepr(funcargs=True))


def test_ctrl_c_during_verify_keeps_what_was_measured_and_replaces_nothing(tmp_path):
    out = tmp_path / "reports"
    before = _seeded(out)
    # Two tests: Ctrl-C comes once the first has passed (its dot is printed), during the second (a few seconds).
    cmd = [sys.executable, "-m", "cheapinfer", "verify", "--report-dir", str(out),
           "-k", "test_kv_cache_is_12288_bytes_per_token or test_head_recompute_over_cached_grows_with_n"]
    # As from a terminal: Ctrl-C at its default. A run started from a background job inherits SIGINT ignored, and
    # verify then (rightly) leaves Ctrl-C to its child.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = b""
    deadline = time.monotonic() + 240
    while b"." not in seen and time.monotonic() < deadline:
        chunk = os.read(proc.stdout.fileno(), 1)
        if not chunk:
            break
        seen += chunk
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the whole foreground process group
    rest, err = proc.communicate(timeout=240)
    stdout, stderr = (seen + rest).decode(), err.decode()
    assert proc.returncode == 130, stdout[-3000:] + stderr[-3000:]
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    [kept] = [k for k in (out / store.RUNS_DIR).glob("*.json") if not k.name.endswith(store.BENCHMARKS_SUFFIX)]
    # verify says it in one line, its last; what else reached stderr (a library's warning printed after the
    # child's capture ended) is not verify's, and is shown if this fails.
    lines = [line for line in stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("cheapinfer")]
    assert ours == lines[-1:] == [f"cheapinfer verify: interrupted; its record so far: {kept}; "
                                  "the latest run.json and errata.md were not replaced"], stderr[-3000:]
    record = schema.read_record(kept)
    assert record["run"]["interrupted"] is True and record["claims"]["KV-BYTES-FORMULA"]["verdict"] == "reproduced"
    assert _unchanged(out, before)
