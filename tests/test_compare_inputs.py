"""compare and merge on bad input: one line and exit 2, never a traceback or the regression code;
merge never overwrites a record or a file it did not write; every change to *not run* carries its reason,
harness errors apart; a claim that vanished is a regression."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from commands import cheapinfer

from cheapinfer.cli.records import compare_cli, merge_cli
from cheapinfer.harness import compare as cmp
from cheapinfer.harness import merge, schema, vocabulary

RECORD = Path(__file__).resolve().parent / "data" / "run-record.json"


def _exit_2(argv: list[str], run, capsys) -> str:
    """The one error line of a CLI call that must exit 2."""
    with pytest.raises(SystemExit) as exc:
        run(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("band", ["nan", "inf", "-inf", "-0.1", "abc"])
def test_compare_rejects_a_band_that_is_not_finite_and_non_negative(band, capsys):
    line = _exit_2([str(RECORD), str(RECORD), f"--band={band}"], compare_cli, capsys)
    assert "argument --band" in line and band in line


def test_compare_accepts_a_zero_band(capsys):
    assert compare_cli([str(RECORD), str(RECORD), "--band", "0"]) == 0


def _record() -> dict:
    return json.loads(RECORD.read_text(encoding="utf-8"))


def _first_result(rec: dict) -> dict:
    return next(r for c in rec["claims"].values() for r in c["results"] if r.get("checks"))


def _broken(kind: str) -> dict | bytes:
    rec = _record()
    if kind == "not-json":
        return b"{ this is not json"
    if kind == "not-utf8":
        return b'{"claims": "\xff\xfe"}'
    if kind == "not-an-object":
        return [1, 2, 3]
    if kind == "claims-a-list":
        rec["claims"] = list(rec["claims"])
    elif kind == "result-without-profile":
        del _first_result(rec)["profile"]
    elif kind == "check-without-asserted":
        del _first_result(rec)["checks"][0]["asserted"]
    elif kind == "digits-spec-without-tol":
        spec = next(s for c in rec["claims"].values() for s in c["checks"] if s["kind"] == "digits" and s["form"] != "exact")
        del spec["tol"]
    elif kind == "verdict-a-number":
        next(iter(rec["claims"].values()))["verdict"] = 3
    elif kind == "another-suite":
        rec["suite"] = "otherbench 2.0"
    elif kind == "no-suite":
        del rec["suite"]
    elif kind == "another-schema":
        rec["schema"] = 3
    elif kind == "no-schema":
        del rec["schema"]
    elif kind == "unknown-claim-verdict":
        next(iter(rec["claims"].values()))["verdict"] = "maybe"
    elif kind == "unknown-result-verdict":
        _first_result(rec)["verdict"] = "maybe"
    elif kind == "huge-measured":
        _first_result(rec)["checks"][0]["measured"] = 10**400
    elif kind == "huge-book":
        next(c for c in rec["claims"].values() if c["book"])["book"].update(huge=-(10**400))
    elif kind == "not-unicode":
        _first_result(rec)["reason"] = "\ud800"
    return rec


KINDS = ["not-json", "not-utf8", "not-an-object", "claims-a-list", "result-without-profile", "check-without-asserted", "digits-spec-without-tol", "verdict-a-number",
         "another-suite", "no-suite", "another-schema", "no-schema", "unknown-claim-verdict", "unknown-result-verdict", "huge-measured", "huge-book", "not-unicode"]


def _write(data, path: Path) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_compare_exits_2_with_one_line_on_a_record_it_cannot_read(kind, tmp_path, capsys):
    bad = _write(_broken(kind), tmp_path / "run.json")
    line = _exit_2([str(RECORD), str(bad)], compare_cli, capsys)
    assert str(bad) in line


@pytest.mark.parametrize(
    "kind, message",
    [
        ("another-suite", "'suite': expected 'cheapinfer <version>', not 'otherbench 2.0'"),
        ("no-suite", "'suite': expected 'cheapinfer <version>', and the record has none"),
        ("another-schema", "'schema': expected 1 or 2 (the schemas this version reads), not 3"),
        ("no-schema", "'schema': expected 1 or 2, and the record has none"),
        ("unknown-claim-verdict", f"claim KV-IDENTITY: 'verdict': expected one of {', '.join(vocabulary.VERDICTS)}, not 'maybe'"),
        ("unknown-result-verdict", f"claim KV-IDENTITY: results[0]: 'verdict': expected one of {', '.join(vocabulary.VERDICTS)}, not 'maybe'"),
        ("huge-measured", "claims.KV-IDENTITY.results[0].checks[0].measured: an integer of about 401 digits, beyond the range of a float"),
        ("not-unicode", "claims.KV-IDENTITY.results[0].reason: text that is not Unicode ('\\ud800')"),
    ],
)
def test_compare_names_what_it_cannot_read_in_one_line_through_the_command_line(kind, message, tmp_path, capfd):
    """Another suite's record, a schema this version does not read, an unknown verdict, a value beyond a float:
    one line on standard error, exit 2, no traceback (and never the regression code)."""
    bad = _write(_broken(kind), tmp_path / "run.json")
    run = cheapinfer(capfd, "compare", str(RECORD), str(bad))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""
    [line] = [line for line in run.stderr.splitlines() if line.strip()]
    assert line == f"cheapinfer compare: error: {bad} is not a well-formed run record of this suite: {message}"


def test_a_verdict_added_to_the_registry_is_read_without_another_change(monkeypatch):
    """compare reads the known verdicts from vocabulary.VERDICTS when it checks a record."""
    rec = _record()
    next(iter(rec["claims"].values()))["verdict"] = "inconclusive"
    if "inconclusive" not in vocabulary.VERDICTS:
        with pytest.raises(schema.RecordError, match="not 'inconclusive'"):
            schema.check_record(rec)
        monkeypatch.setattr(vocabulary, "VERDICTS", (*vocabulary.VERDICTS, "inconclusive"))
    schema.check_record(rec)


def test_a_huge_value_compares_without_an_overflow():
    """Value handling never raises on an integer beyond a float, even where check_record is not asked first."""
    assert schema.as_float(10**400) is None
    assert cmp._moved(10**400, 10**400 + 1, "rel", 0.25) and not cmp._moved(10**400, 10**400, "abs", 1.0)


def test_a_claim_that_vanished_is_a_regression_and_a_new_one_is_not(tmp_path, capsys):
    before = _record()
    after = copy.deepcopy(before)
    gone = next(cid for cid, c in before["claims"].items() if c["verdict"] == "reproduced")
    del after["claims"][gone]
    a, b = _write(before, tmp_path / "before.json"), _write(after, tmp_path / "after.json")
    for extra in ([], ["--verdicts-only"]):
        assert compare_cli([str(a), str(b), *extra]) == 1
        out = capsys.readouterr().out.splitlines()
        assert f"REGRESSION  {gone} [-] vanished: reproduced -> absent from the later record" in out
        assert out[-1].startswith(f"{len(before['claims'])} claims compared: 1 regression(s), 0 other change(s)")
    assert compare_cli([str(b), str(a)]) == 0  # the same claim, new in AFTER
    assert f"changed     {gone} [-] new: absent from the earlier record -> reproduced" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("kind", ["claims-a-list", "result-without-profile", "check-without-asserted", "another-suite", "unknown-result-verdict", "huge-measured"])
def test_merge_exits_2_with_one_line_on_a_record_it_cannot_read(kind, tmp_path, capsys):
    bad = _write(_broken(kind), tmp_path / "run.json")
    line = _exit_2([str(RECORD), str(bad)], merge_cli, capsys)
    assert str(bad) in line


def test_compare_of_a_malformed_record_through_the_command_line_is_exit_2_without_traceback(tmp_path, capfd):
    bad = _write(_broken("result-without-profile"), tmp_path / "run.json")
    run = cheapinfer(capfd, "compare", str(RECORD), str(bad))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().count("\n") == 0 and "results[0]" in run.stderr


def test_merge_refuses_to_overwrite_one_of_its_records(tmp_path, capsys):
    rec = tmp_path / "a" / "run.json"
    rec.parent.mkdir()
    rec.write_bytes(RECORD.read_bytes())
    for target in (rec, rec.parent):  # the file, or the report directory holding it: its run.json
        out = target if target.is_file() else target / "run.json"
        line = _exit_2([str(RECORD), str(target), "-o", str(out)], merge_cli, capsys)
        assert "one of the records being merged" in line and "--force" in line
    assert rec.read_bytes() == RECORD.read_bytes()


@pytest.mark.parametrize("name", ["notes.txt", "README.md", "empty.md"])
def test_merge_refuses_to_overwrite_a_file_it_did_not_write_unless_forced(name, tmp_path, capsys):
    other = tmp_path / name
    other.write_text("" if name == "empty.md" else "# Claims x machines\nkeep me\n")
    kept = other.read_text()
    line = _exit_2([str(RECORD), "-o", str(other)], merge_cli, capsys)
    assert line == (f"cheapinfer merge: error: -o {other}: it exists and is not a Markdown matrix written by merge "
                    "(its first line is not the matrix's mark); nothing was written (pass --force to overwrite it)")
    assert other.read_text() == kept
    assert merge_cli([str(RECORD), "-o", str(other), "--force"]) == 0
    assert other.read_text().splitlines()[:2] == [merge.MATRIX_MARK, "# Claims x machines"]


def test_merge_over_a_readme_through_the_command_line_is_one_line_and_exit_2(tmp_path, capfd):
    readme = tmp_path / "README.md"
    readme.write_text("# A project\n")
    run = cheapinfer(capfd, "merge", str(RECORD), "-o", str(readme))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [line] = [line for line in run.stderr.splitlines() if line.strip()]
    assert line.startswith(f"cheapinfer merge: error: -o {readme}: it exists and is not a Markdown matrix") and readme.read_text() == "# A project\n"


def test_merge_overwrites_its_own_earlier_output(tmp_path):
    md, js = tmp_path / "matrix.md", tmp_path / "matrix.json"
    for _ in range(2):
        assert merge_cli([str(RECORD), "-o", str(md)]) == 0
        assert merge_cli([str(RECORD), "--json", "-o", str(js)]) == 0
    assert json.loads(js.read_text())["machines"]


def _not_run(rec: dict, cid: str, reason: str, error: bool = False) -> dict:
    rec = copy.deepcopy(rec)
    claim = rec["claims"][cid]
    claim["results"] = [{**r, "verdict": "not run", "reason": reason, "harness_error": error, "checks": [], "measured": {}} for r in claim["results"]]
    claim["verdict"] = "not run"
    return rec


def test_compare_prints_the_reason_of_every_not_run_and_keeps_harness_errors_apart(tmp_path, capsys):
    before = _record()
    passing = [cid for cid, c in before["claims"].items() if c["verdict"] in ("reproduced", "shape holds") and c["results"][0]["profile"] != "-"]
    errored, skipped = passing[0], passing[1]
    after = _not_run(before, errored, "error before a verdict: ImportError: cannot import name 'DynamicCache'", error=True)
    after = _not_run(after, skipped, "needs a CUDA device; this run uses cpu")
    a, b = _write(before, tmp_path / "before.json"), _write(after, tmp_path / "after.json")
    assert compare_cli([str(a), str(b)]) == 1  # a passing claim whose test now raises: a regression
    out = capsys.readouterr().out.splitlines()
    harness = [line for line in out if line.startswith("HARNESS ")]
    assert harness and all(errored in line and "-> not run (error before a verdict: ImportError" in line for line in harness)
    changed = [line for line in out if line.startswith("changed ") and skipped in line]
    assert changed and all("-> not run (needs a CUDA device; this run uses cpu)" in line for line in changed)
    assert not [line for line in out if line.startswith("REGRESSION")]
    assert out[-1].endswith(
        f"claims compared: 0 regression(s), {len(changed)} other change(s), {len(harness)} harness error(s) "
        "(a test raised before its verdict: the suite or a library broke, not the claim)."
    )
    assert out.index(harness[0]) > max(out.index(line) for line in changed)  # listed after the claims that changed
    schema.read_record(b)  # the record stays readable
