"""Hard edges (issue 46): every bad input a hostile tester tried is one line and a non-zero exit, every reader is
bounded, and a write that fails leaves the earlier files intact and says so truthfully. One case per input."""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import pytest

from cheapinfer import cli as cli_main
from cheapinfer.cli.faults import faults_cli
from cheapinfer.cli.records import compare_cli, merge_cli
from cheapinfer.harness import record as records
from cheapinfer.harness import registry, schema, store
from cheapinfer.runtime import artifacts, files
from cheapinfer.runtime import settings as cli

RECORD = Path(__file__).resolve().parent / "data" / "run-record.json"


def _record() -> dict:
    return json.loads(RECORD.read_text(encoding="utf-8"))


def _write(path: Path, data) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def _refused(run, argv: list[str], capsys, code: int = 2) -> str:
    """The one error line of a command that must exit ``code`` without a traceback."""
    with pytest.raises(SystemExit) as exc:
        run(argv)
    assert exc.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and "INTERNALERROR" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------------------------------
# readers: bounded, regular files only, strict numbers
# ------------------------------------------------------------------------------------------------


def _fifo(tmp_path: Path) -> str:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return str(path)


READERS = {
    "/dev/zero": (lambda tmp: "/dev/zero", "it is a device"),
    "a FIFO": (_fifo, "it is a FIFO"),
    "a NaN literal": (lambda tmp: str(_write(tmp / "r.json", b'{"x": NaN}')), "NaN, which is not a JSON number"),
    "an Infinity literal": (lambda tmp: str(_write(tmp / "r.json", b'{"x": -Infinity}')), "-Infinity, which is not a JSON number"),
    "1e400": (lambda tmp: str(_write(tmp / "r.json", b'{"x": 1e400}')), "the number 1e400, beyond the range of a float"),
    "a huge integer": (lambda tmp: str(_write(tmp / "r.json", {**_record(), "x": 10**400})), "beyond the range of a float"),
    "a directory without run.json": (lambda tmp: str(tmp), "No such file"),
}


@pytest.mark.parametrize("case", list(READERS))
@pytest.mark.parametrize("command", ["compare", "merge", "compare --after-reruns"])
def test_every_record_reader_refuses_what_is_no_bounded_strict_record(case, command, tmp_path, capsys):
    make, said = READERS[case]
    bad = make(tmp_path)
    argv = {"compare": [bad, str(RECORD)], "merge": [str(RECORD), bad],
            "compare --after-reruns": [str(RECORD), str(RECORD), "--before-reruns", bad, "--after-reruns", bad]}[command]
    line = _refused(compare_cli if command.startswith("compare") else merge_cli, argv, capsys)
    assert said in line and bad in line


def test_a_record_larger_than_the_limit_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(files, "MAX_RECORD_BYTES", 1000)
    line = _refused(compare_cli, [str(RECORD), str(RECORD)], capsys)
    assert "more than the 0 MiB" in line or "more than" in line


def test_a_record_that_grows_while_read_is_cut_at_the_limit(tmp_path):
    path = _write(tmp_path / "r.json", b" " * 5000)
    with pytest.raises(files.UnreadableFile, match="more than"):
        files.read_bounded(path, limit=4096)
    assert len(files.read_bounded(path, limit=5000)) == 5000


def test_the_quiet_record_goes_through_the_bounded_reader(capsys):
    code = _main_exit(["verify", "--stress", "--quiet-record", "/dev/zero", "--claims", "KV-SPEEDUP-48"], capsys)
    assert code[0] == 2 and "it is a device" in code[1]


def _main_exit(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = cli_main.main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    return code, lines[-1] if lines else ""


# ------------------------------------------------------------------------------------------------
# empty paths and empty values mean nothing
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["compare", "", str(RECORD)],
    ["merge", ""],
    ["merge", str(RECORD), "-o", ""],
    ["compare", str(RECORD), str(RECORD), "--before-reruns", "", "--after-reruns", str(RECORD)],
    ["faults", "--report-dir", ""],
], ids=["compare", "merge", "merge -o", "--before-reruns", "faults --report-dir"])
def test_an_empty_path_is_refused_never_the_current_directory(argv, capsys):
    code, line = _main_exit(argv, capsys)
    assert code == 2 and "an empty path names no file" in line


# ------------------------------------------------------------------------------------------------
# reruns that measure nothing, records given twice
# ------------------------------------------------------------------------------------------------


def _rerun(tmp_path: Path, name: str, change) -> str:
    rec = _record()
    rec.setdefault("run", {})["id"] = f"rerun-{name}"
    change(rec)
    return str(_write(tmp_path / f"{name}.json", rec))


def _measured_claim(rec: dict) -> dict:
    return next(c for c in rec["claims"].values() if any(r.get("profile") != "-" for r in c.get("results", [])))


def _clocked_check(rec: dict) -> dict:
    return next(chk for c in rec["claims"].values() for r in c.get("results", []) for chk in r.get("checks", []) if chk.get("se") is not None)


RERUNS = {
    "a fault injected": (lambda rec: rec["run"].update(fault="kv-decode-ignores-cache"), "with the fault kv-decode-ignores-cache injected"),
    "another suite": (lambda rec: rec.update(suite="cheapinfer 99.0"), "written by 'cheapinfer 99.0'"),
    "another claim set": (lambda rec: _measured_claim(rec).update(results=[]), "another set of claims"),
    "a non-numeric value": (lambda rec: _clocked_check(rec).update(measured="fast"), "not a number"),
}


@pytest.mark.parametrize("case", list(RERUNS))
def test_a_rerun_that_is_not_one_is_refused(case, tmp_path, capsys):
    change, said = RERUNS[case]
    good, bad = _rerun(tmp_path, "good", lambda rec: None), _rerun(tmp_path, "bad", change)
    line = _refused(compare_cli, [str(RECORD), str(RECORD), "--before-reruns", good, "--after-reruns", bad], capsys)
    assert said in line and "is not a rerun of" in line


@pytest.mark.parametrize("side", ["--before-reruns", "--after-reruns"])
def test_reruns_on_one_side_only_are_refused(side, tmp_path, capsys):
    line = _refused(compare_cli, [str(RECORD), str(RECORD), side, _rerun(tmp_path, "one", lambda rec: None)], capsys)
    assert f"{side} without" in line and "both sides" in line


def test_reruns_with_1e308_do_not_crash_the_statistics(tmp_path, capsys):
    def huge(rec):
        _clocked_check(rec)["measured"] = 1e308

    b = [_rerun(tmp_path, f"b{i}", huge) for i in range(2)]
    a = [_rerun(tmp_path, f"a{i}", huge) for i in range(2)]
    code = compare_cli([str(RECORD), str(RECORD), "--before-reruns", *b, "--after-reruns", *a])
    assert code in (0, 1)
    assert "Traceback" not in capsys.readouterr().err


def test_merge_refuses_one_run_twice(tmp_path, capsys):
    copy_of = _write(tmp_path / "copy.json", _record())
    line = _refused(merge_cli, [str(RECORD), str(copy_of)], capsys)
    assert "are the same run" in line and "two machines" in line


# ------------------------------------------------------------------------------------------------
# text from a record is shown, never obeyed
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cid", ["KV-MACS\nREGRESSION  KV-API", "\x1b[31mREGRESSION\x1b[0m", "kv-macs", ""])
def test_a_claim_id_that_is_no_claim_id_is_refused_escaped(cid, tmp_path, capsys):
    rec = _record()
    rec["claims"][cid] = rec["claims"].pop(next(iter(rec["claims"])))
    line = _refused(compare_cli, [str(_write(tmp_path / "r.json", rec)), str(RECORD)], capsys)
    assert "\x1b" not in line and "a claim ID" in line


def test_printable_shows_control_characters_as_escapes():
    assert cli.printable("a\nb\x1b[31mc\td") == "a\\nb\\x1b[31mc\\td"
    assert cli.printable("KV-MACS ±5%") == "KV-MACS ±5%"


# ------------------------------------------------------------------------------------------------
# writes: checked first, atomic, truthful on failure
# ------------------------------------------------------------------------------------------------


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _merge_o_on_a_full_disk(tmp_path, capsys, monkeypatch):
    out = tmp_path / "matrix.md"
    assert merge_cli([str(RECORD), "-o", str(out)]) == 0
    before = out.read_bytes()
    monkeypatch.setattr(store, "_write_all", _enospc)
    line = _refused(merge_cli, [str(RECORD), "-o", str(out)], capsys)
    assert out.read_bytes() == before, "the previous matrix was truncated"
    assert "No space left on device" in line and "the previous file is as it was" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.md"]  # no temporary file left


def _second_rename_fails(tmp_path, capsys, monkeypatch):
    rec, md = tmp_path / "run.json", tmp_path / "errata.md"
    md.mkdir()  # the rename over it fails after run.json is in place
    with pytest.raises(store.PartlyWritten) as exc:
        store.atomic_write((rec, "{}\n"), (md, "# errata\n"))
    assert rec.read_text() == "{}\n" and exc.value.written == [rec] and exc.value.unwritten == [md]
    assert "run.json replaced, but" in str(exc.value) and "errata.md not" in str(exc.value)


def _full_disk_before_the_renames(tmp_path, capsys, monkeypatch):
    rec, md = tmp_path / "run.json", tmp_path / "errata.md"
    rec.write_text("old record"), md.write_text("old errata")
    monkeypatch.setattr(store, "_write_all", _enospc)
    with pytest.raises(OSError) as exc:
        store.atomic_write((rec, "new"), (md, "new"))
    assert (rec.read_text(), md.read_text()) == ("old record", "old errata"), "the previous pair was truncated"
    assert exc.value.errno == errno.ENOSPC and not isinstance(exc.value, store.PartlyWritten)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["errata.md", "run.json"]


def _faults_on_a_full_disk(tmp_path, capsys, monkeypatch):
    from cheapinfer.audits import faults as runner

    (tmp_path / "faults.json").write_text("previous")
    monkeypatch.setattr(runner, "run", lambda names, runs, *a, **k: {"runs": runs, "mode": "sweep", "seconds": 1.0, "uncovered": [],
                                                                      "faults": {n: {"targets": [], "runs": [{}], "kind": "k", "caught": 1} for n in names}})
    monkeypatch.setattr(store, "_write_all", _enospc)
    code = faults_cli(["--report-dir", str(tmp_path), next(iter(runner.catalogue()))])
    err = capsys.readouterr().err
    assert (tmp_path / "faults.json").read_text() == "previous", "the previous faults.json was truncated"
    assert code == 1 and "No space left on device" in err and "the previous one is as it was" in err


def _plot_on_a_full_disk(tmp_path, capsys, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fixtures.profiles import ClaimProbe

    probe = ClaimProbe.__new__(ClaimProbe)
    probe.report_dir, probe.notes, probe.figures = tmp_path, [], []
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "f.png").write_bytes(b"previous png")
    monkeypatch.setattr(store, "_write_all", _enospc)
    fig = plt.figure()
    probe.figure("f", fig)  # no exception: a figure that cannot be saved does not fail its claim
    assert (tmp_path / "plots" / "f.png").read_bytes() == b"previous png", "the previous figure was truncated"
    assert probe.figures == [] and "could not be saved (No space left on device)" in probe.notes[0]


WRITE_FAILURES = {"merge -o on a full disk": _merge_o_on_a_full_disk, "the second rename fails": _second_rename_fails,
                  "a full disk before the renames": _full_disk_before_the_renames, "faults on a full disk": _faults_on_a_full_disk,
                  "a plot on a full disk": _plot_on_a_full_disk, "benchmarks.json on a full disk": lambda *a: _benchmarks_on_a_full_disk(*a)}


@pytest.mark.parametrize("case", list(WRITE_FAILURES))
def test_a_failed_write_loses_nothing_and_says_so(case, tmp_path, capsys, monkeypatch):
    WRITE_FAILURES[case](tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("case", list(WRITE_FAILURES))
def test_the_writers_fault_turns_each_write_failure_check_red(case, tmp_path, capsys, monkeypatch):
    """The check above is not true by construction: with the writer's fault (writes in place) it fails."""
    from cheapinfer.faults.writer import non_atomic_writer

    with non_atomic_writer(), pytest.raises((AssertionError, pytest.fail.Exception, OSError)):
        WRITE_FAILURES[case](tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("slot,make,said", [
    ("runs", lambda p: p.write_text("x"), "is a file, not a directory"),
    ("run.json", lambda p: p.mkdir(), "is a directory"),
    ("errata.md", lambda p: p.mkdir(), "is a directory"),
    ("run.json", lambda p: os.mkfifo(p), "is a FIFO"),
])
def test_a_report_dir_slot_that_cannot_take_its_file_is_found_before_any_test(slot, make, said, tmp_path):
    make(tmp_path / slot)
    with pytest.raises(ValueError, match=said):
        store.check_slots(tmp_path)


def test_a_clean_report_dir_passes_the_slot_check(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "run.json").write_text("{}")
    store.check_slots(tmp_path)
    store.check_slots(tmp_path / "absent")


def _file(tmp: Path) -> Path:
    (tmp / "file").write_text("x")
    return tmp / "file"


@pytest.mark.parametrize("make,said", [
    (lambda tmp: (tmp / "loop").symlink_to(tmp / "loop") or tmp / "loop", "is a symlink loop"),
    (lambda tmp: _file(tmp) / "reports", "is a file, not a directory"),
    (lambda tmp: _file(tmp), "it is a file, not a directory"),
    (lambda tmp: tmp / "ok" / "deeper", None),
], ids=["symlink loop", "parent a file", "a file", "creatable"])
def test_writable_dir_names_the_real_cause(make, said, tmp_path):
    path = make(tmp_path)
    if said is None:
        assert store.writable_dir(path).is_dir()
        return
    with pytest.raises(ValueError) as exc:
        store.writable_dir(path)
    assert said in str(exc.value) and "File exists" not in str(exc.value)


@pytest.mark.parametrize("where,said", [
    (lambda tmp: _file(tmp) / "out", "is a file, not a directory"),
    (lambda tmp: (tmp / "loop").symlink_to(tmp / "loop") or tmp / "loop", "symlink loop"),
], ids=["parent a file", "symlink loop"])
def test_faults_checks_its_report_dir_before_the_sweep(where, said, tmp_path, capsys, monkeypatch):
    from cheapinfer.audits import faults as runner

    monkeypatch.setattr(runner, "run", lambda *a, **k: pytest.fail("the sweep ran before the report dir was checked"))
    code, line = _main_exit(["faults", "--report-dir", str(where(tmp_path)), "kv-decode-ignores-cache"], capsys)
    assert code == 2 and said in line


# ------------------------------------------------------------------------------------------------
# counts bounded, values that mean nothing refused
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,said", [
    (["faults", "--runs", "100000000"], "must be from 1 to 1000 runs"),
    (["faults", "--runs", "0"], "must be from 1 to 1000 runs"),
    (["faults", "--workers", "100000"], "must be from 1 to 64 workers"),
    (["faults", "--timeout", "0.001", "kv-decode-ignores-cache"], "--timeout 0.001: at least 5 s"),
])
def test_faults_counts_are_bounded(argv, said, capsys):
    code, line = _main_exit(argv, capsys)
    assert code == 2 and said in line


@pytest.mark.parametrize("value,ok", [("999999", False), ("1025", False), ("-1", False), ("x", False), ("0", True), ("8", True)])
def test_timing_threads_are_bounded(value, ok):
    if ok:
        assert cli.timing_threads({cli.TIMING_THREADS_VARIABLE: value}) == int(value)
    else:
        with pytest.raises(ValueError, match="from 0 to 1024"):
            cli.timing_threads({cli.TIMING_THREADS_VARIABLE: value})


@pytest.mark.parametrize("value,means", [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("", False),
                                         ("off", False), ("False", False), ("2", None), ("offline", None), ("ja", None)])
def test_cheapinfer_offline_takes_the_usual_words_and_refuses_others(value, means):
    env = {artifacts.OFFLINE_VARIABLE: value}
    if means is None:
        with pytest.raises(ValueError, match=f"CHEAPINFER_OFFLINE={value!r}: expected one of 1, true, yes, on"):
            cli.env_flag(artifacts.OFFLINE_VARIABLE, env)
    else:
        assert cli.env_flag(artifacts.OFFLINE_VARIABLE, env) is means


def test_fetch_refuses_an_offline_typo_even_when_nothing_needs_downloading(capsys, monkeypatch):
    """A full cache never reads CHEAPINFER_OFFLINE: fetch reads it first, so 'ja' is one line and exit 2, not a silent 0."""
    monkeypatch.setenv(artifacts.OFFLINE_VARIABLE, "ja")
    monkeypatch.setattr(artifacts, "fetch", lambda a: pytest.fail("fetch ran with a refused CHEAPINFER_OFFLINE"))
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["fetch"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(err) == 1 and "CHEAPINFER_OFFLINE='ja': expected one of 1, true, yes, on" in err[0]


def test_cheapinfer_offline_true_forbids_the_download(tmp_path, monkeypatch):
    monkeypatch.setenv(artifacts.OFFLINE_VARIABLE, "yes")
    with pytest.raises(artifacts.ArtifactUnavailable, match="CHEAPINFER_OFFLINE=yes"):
        artifacts._download(next(iter(artifacts.ARTIFACTS.values())), tmp_path)


# ------------------------------------------------------------------------------------------------
# signals, registry errors, the version
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_sighup_stops_faults_cleanly_as_sigterm_does(sig, tmp_path, capsys, monkeypatch):
    from cheapinfer.audits import faults as runner

    def sweep(*args, **kwargs):
        os.kill(os.getpid(), sig)
        pytest.fail("the signal did not stop the sweep")

    monkeypatch.setattr(runner, "run", sweep)
    before = signal.getsignal(sig)
    code = faults_cli(["--report-dir", str(tmp_path), next(iter(runner.catalogue()))])
    err = capsys.readouterr().err
    assert code == 128 + sig and f"terminated ({signal.Signals(sig).name})" in err and "temporary directory removed" in err
    assert signal.getsignal(sig) == before


def test_sighup_stops_the_verdict_checks_as_sigterm_does(capsys):
    from cheapinfer.audits import matrix

    def body():
        os.kill(os.getpid(), signal.SIGHUP)
        pytest.fail("SIGHUP did not stop the check")

    assert matrix.guarded("cheapinfer verify --isa-matrix", body) == 128 + signal.SIGHUP
    assert "terminated (SIGHUP)" in capsys.readouterr().err


def test_version(capsys):
    assert cli_main.main(["--version"]) == 0
    from cheapinfer import __version__

    assert capsys.readouterr().out.strip() == f"cheapinfer {__version__}"


def test_a_runs_summary_names_the_suites_version(tmp_path, pytester):
    """The terminal summary a reader copies into an issue says which release measured it."""
    from plugin_runs import suite

    from cheapinfer import __version__

    run = suite(pytester, "-q", f"--report-dir={tmp_path}", "claims", "--claims", "KV-BYTES-FORMULA")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f" chapter claims, cheapinfer {__version__} " in run.stdout


@pytest.mark.parametrize("command", ["compare", "merge", "budget", "faults"])
def test_a_broken_registry_is_one_line_and_exit_4_from_every_command(command, capsys, monkeypatch):
    def broken():
        raise registry.RegistryError("KV-MACS: check 'macs': 'why' says nothing about why its tolerance is what it is")

    monkeypatch.setattr(registry, "load", broken)
    code, line = _main_exit([command, str(RECORD)], capsys)
    assert code == registry.REGISTRY_EXIT == 4
    assert "registry.toml is broken: KV-MACS: check 'macs': 'why' says nothing" in line


@pytest.mark.parametrize("why", ["", "   ", "\t\n"])
def test_a_blank_why_is_refused(why):
    text = f'''
[KV-MACS]
section = "kv_cache"
statement = "s"
book = {{ macs = 1 }}
checks = [{{ q = "macs", form = "exact", why = {json.dumps(why)} }}]
'''
    with pytest.raises(registry.RegistryError, match="'why' says nothing"):
        registry.parse(text)


def test_a_registry_id_that_is_no_claim_id_is_refused():
    with pytest.raises(registry.RegistryError, match="not a claim ID"):
        registry.parse('["KV\\u001b[31m"]\nsection = "kv_cache"\nstatement = "s"\n')


def test_interrupted_claims_are_recorded_as_interrupted_not_unselected():
    record = records.build([], {}, {"interrupted": True}, {"KV-MACS": ["t"], "KV-API": ["t"]}, unfinished={"KV-MACS"})
    reasons = {cid: record["claims"][cid]["results"][0]["reason"] for cid in ("KV-MACS", "KV-API")}
    assert reasons == {"KV-MACS": records.INTERRUPTED_REASON, "KV-API": "its test was not selected in this run"}


# ------------------------------------------------------------------------------------------------
# pytest's own usage errors: one line, exit 4, before any test
# ------------------------------------------------------------------------------------------------


def _runs_file(tmp: Path) -> list[str]:
    (tmp / "runs").write_text("not a folder")
    return []


@pytest.mark.parametrize("args,said", [
    (lambda tmp: ["--fault", "kv-decode-ignores-cache"], "--fault kv-decode-ignores-cache: none of its claims"),
    (lambda tmp: ["--perturb", "KV-MACS"], "--perturb KV-MACS: none of these claims is selected"),
    (lambda tmp: ["--hypothesis-profile", ""], "--hypothesis-profile: the value is empty"),
    (_runs_file, "is a file, not a directory; this run's record could not be kept there"),
], ids=["--fault not selected", "--perturb not selected", "empty hypothesis profile", "runs is a file"])
def test_a_run_that_would_mean_nothing_is_a_usage_error_before_any_test(args, said, tmp_path, pytester):
    from plugin_runs import suite

    proc = suite(pytester, "claims/test_budget.py", "-q", "--report-dir", str(tmp_path), *args(tmp_path))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 4 and len(lines) == 1 and said in lines[0], proc.stdout + proc.stderr
    assert "passed" not in proc.stdout and not (tmp_path / "run.json").exists()


# ------------------------------------------------------------------------------------------------
# the corpus and the book model: the real cause, the same rule wherever the weights are
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make,said", [
    (lambda tmp: tmp, "it is a directory"),
    (lambda tmp: _fifo(tmp), "it is a FIFO"),
    (lambda tmp: "/dev/null", "it is a device"),
    (lambda tmp: tmp / "absent.txt", "there is no such file"),
], ids=["directory", "FIFO", "/dev/null", "missing"])
def test_corpus_names_what_the_path_is(make, said, tmp_path):
    from cheapinfer.runtime import corpus

    with pytest.raises(ValueError, match=said):
        corpus.check_file(make(tmp_path))


def test_weights_from_the_hugging_face_cache_follow_the_safetensors_rule(tmp_path, monkeypatch):
    """A cached checkpoint with pickled weights only is refused as a local copy is: never loaded."""
    import huggingface_hub

    from cheapinfer.runtime import models

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"a pickle")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(tmp_path))
    with pytest.raises(models.BookModelNotFound, match=r"book weights not usable: the Hugging Face cache's .* no weights \(\*\.safetensors\)"):
        models.find_book(None)


def test_a_fault_injected_record_is_no_quiet_record(tmp_path, capsys):
    rec = _record()
    rec.setdefault("run", {})["fault"] = "kv-decode-ignores-cache"
    path = _write(tmp_path / "run.json", rec)
    code, line = _main_exit(["verify", "--stress", "--quiet-record", str(path), "--report-dir", str(tmp_path / "out")], capsys)
    assert code == 2 and "a run with the fault kv-decode-ignores-cache injected" in line


def test_a_run_leaves_no_stray_benchmarks_folder_in_the_callers_directory(tmp_path, pytester):
    from plugin_runs import suite

    root = Path(__file__).resolve().parents[1]
    caller = tmp_path / "caller"
    caller.mkdir()
    proc = suite(pytester, str(root / "tests" / "test_budget_cli.py"), "-q", "--rootdir", str(root), "--report-dir", str(tmp_path / "reports"),
                 "-k", "not slow", cwd=caller)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert list(caller.iterdir()) == []


def _benchmarks_on_a_full_disk(tmp_path, capsys, monkeypatch):
    from types import SimpleNamespace

    from fixtures import recording

    path = tmp_path / "benchmarks.json"
    path.write_text("previous timings")
    bench = SimpleNamespace(json=str(path))
    recording.pytest_sessionstart(SimpleNamespace(config=SimpleNamespace(_benchmarksession=bench)))
    monkeypatch.setattr(store, "_write_all", _enospc)
    bench.save_json({"benchmarks": []})  # pytest-benchmark's call after the last test: no exception reaches it
    assert path.read_text() == "previous timings", "the previous benchmark file was truncated"
    assert "could not be written" in recording.RUN_WARNINGS[0] and "the previous file is as it was" in recording.RUN_WARNINGS[0]
    assert "WARNING: the benchmark timings could not be written" in capsys.readouterr().err



def test_verify_on_a_disk_that_fills_keeps_its_record_and_points_at_no_report_it_did_not_write(tmp_path, capfd):
    """The run's own record is whole in runs/, the latest pair is as it was, and nothing says otherwise."""
    from commands import cheapinfer

    args = ("verify", "--claims", "KV-BYTES-FORMULA", "--report-dir", str(tmp_path))
    first = cheapinfer(capfd, *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = {n: (tmp_path / n).read_bytes() for n in ("run.json", "errata.md")}
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])}
    full = cheapinfer(capfd, *args, "-p", "full_disk", cwd=tmp_path, env=env)  # its claims run loads the plugin that fills the disk
    assert full.returncode == 3, full.stdout[-2000:] + full.stderr[-2000:]
    assert {n: (tmp_path / n).read_bytes() for n in before} == before, "the latest record was replaced or truncated"
    errors = [line for line in full.stderr.splitlines() if line.startswith("ERROR")]
    kept = sorted((tmp_path / store.RUNS_DIR).glob("*.json"))[-1]
    assert errors == [f"ERROR: this run's record was kept as {kept}, but the latest run.json and errata.md could not be "
                      "replaced (No space left on device): they are as they were"], full.stderr
    assert schema.read_record(kept)["run"]["id"] != schema.read_record(tmp_path / "run.json")["run"]["id"]
    assert "Errata report:" not in full.stdout and "were not replaced: see the error above" in full.stdout


@pytest.mark.parametrize("case,said", [("duplicate", "is not valid TOML: Cannot declare"), ("nan-tolerance", "needs a finite tol > 0"),
                                       ("bad-timing", "timing 'sometimes' is none of clocked, counted")])
def test_a_broken_registry_through_pytest_is_one_line_and_exit_4(case, said, tmp_path, pytester, monkeypatch):
    """The path a maintainer meets first (pytest's configure), not only the commands'. In an interpreter of its own:
    the broken registry is its plugin's, loaded before the suite's."""
    from plugin_runs import suite

    monkeypatch.setenv("BROKEN_REGISTRY", case)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]))
    run = suite(pytester, "-p", "broken_registry", f"--report-dir={tmp_path}", "--co", "-q", "claims/test_budget.py", separate=True)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == registry.REGISTRY_EXIT, run.stdout[-2000:] + run.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("ERROR: the registry ") and said in lines[0], run.stderr
    assert "Traceback" not in run.stdout + run.stderr and not list(tmp_path.iterdir())


def test_compare_names_the_release_that_made_each_record(capsys):
    from cheapinfer import __version__

    assert compare_cli([str(RECORD), str(RECORD)]) == 0
    heads = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("before:", "after: "))]
    assert len(heads) == 2 and all(f": cheapinfer {__version__} on " in line for line in heads), heads
