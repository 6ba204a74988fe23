"""The errata report: a snapshot of its Markdown on a fixed run record, and the record's contract.

The snapshot works like the results checker of MLPerf Inference, which has a test of its own on
checked-in submissions: ``tests/data/run-record.json`` is a fixed run record (made by
``tests/data/make_run_record.py`` with a fixed environment and run, independent of clock and
machine) and ``tests/data/errata-snapshot.md`` is the Markdown the report must render from it.
A change of format fails here until the snapshot is regenerated on purpose:

    UPDATE_SNAPSHOTS=1 pytest tests/test_report.py

and the diff of errata-snapshot.md is reviewed with the change.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
import time
from pathlib import Path

import pytest

from cheapinfer.faults.records import RECORD_FAULTS, REPORT
from cheapinfer.harness import author, errata, registry, report, schema, vocabulary
from cheapinfer.harness import record as records
from cheapinfer.harness.record import Recorder
from cheapinfer.harness.vocabulary import DEVIATES, VERDICTS
from cheapinfer.runtime import device as devices

DATA = Path(__file__).resolve().parent / "data"
RECORD = DATA / "run-record.json"
SNAPSHOT = DATA / "errata-snapshot.md"
ENV_KEYS = ("cpu", "gpu", "driver", "cuda", "torch", "transformers", "bitsandbytes", "gguf")


@pytest.fixture
def fixed_record() -> dict:
    return schema.read_record(RECORD)


SNAPSHOTS = {"errata.md": (report.markdown, SNAPSHOT), "evidence.md": (report.evidence_markdown, DATA / "evidence-snapshot.md")}


def _snapshot_diff(record: dict, name: str) -> str:
    """How ``name`` rendered from ``record`` differs from its checked-in snapshot ("" where it does not)."""
    render, snapshot = SNAPSHOTS[name]
    rendered, expected = render(record), snapshot.read_text(encoding="utf-8")
    return "".join(difflib.unified_diff(expected.splitlines(True), rendered.splitlines(True), snapshot.name, "rendered", n=1))


@pytest.mark.parametrize("name", list(SNAPSHOTS))
def test_errata_markdown_matches_the_checked_in_snapshot(fixed_record, name):
    render, snapshot = SNAPSHOTS[name]
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        snapshot.write_text(render(fixed_record), encoding="utf-8")
    diff = _snapshot_diff(fixed_record, name)
    if diff:
        pytest.fail(f"the report's format changed (regenerate on purpose with UPDATE_SNAPSHOTS=1 and review the diff):\n{diff[:4000]}", pytrace=False)


@pytest.mark.parametrize("fault", [n for n, f in RECORD_FAULTS.items() if f.check == REPORT])
def test_each_report_fault_turns_the_snapshot_red(fixed_record, fault):
    """The snapshot is not true by construction: under each fault of the report's renderers one of its files differs."""
    with RECORD_FAULTS[fault].activate():
        assert any(_snapshot_diff(fixed_record, name) for name in SNAPSHOTS)


def test_a_claim_with_two_errata_and_an_inconclusive_claim_read_right(fixed_record):
    """Both errata of Q-DOWNPROJ-STATS, each with its grade and evidence; BAT-KNEE's search and KV-DECODE-FLAT's margin
    as undecided, with their numbers, never as failures."""
    claims = fixed_record["claims"]
    two = [cid for cid, c in claims.items() if len(c.get("errata", [])) >= 2 and c["verdict"] == vocabulary.ERRATUM]
    undecided = [cid for cid, c in claims.items() if c["verdict"] == vocabulary.INCONCLUSIVE]
    assert two == ["Q-DOWNPROJ-STATS"] and sorted(undecided) == ["BAT-KNEE", "KV-DECODE-FLAT"]
    evidence, md = report.evidence_markdown(fixed_record), report.markdown(fixed_record)
    for e in claims["Q-DOWNPROJ-STATS"]["errata"]:
        section = evidence.split(f"### Q-DOWNPROJ-STATS ({e['grade']})\n", 1)[1].split("\n### ", 1)[0]
        assert e["says"] in section and e["holds"] in section
        assert [f"- **Evidence** (arithmetic, cpu): `{q}` measured" in section for q in e["fails"]] == [True] * len(e["fails"])
    assert md.count("[Q-DOWNPROJ-STATS](evidence.md#q-downproj-stats): measured again in this run: confirmed.") == 2
    inconclusive = md.split("## Inconclusive", 1)[1].split("\n## ", 1)[0]
    assert "- `step_ratio`: measured 1.21 ± 0.09 (standard error over the rounds); expected `step_ratio < 1.25`: the margin is 0.44" in inconclusive
    assert "- `knee_found`: not found in the range this device could afford (`knee_searched_up_to` = 64)." in inconclusive
    rows = {line.split(" | ")[0][2:]: line for line in evidence.splitlines() if line.startswith(("| BAT-KNEE |", "| KV-DECODE-FLAT |"))}
    assert "knee_found == True **undecided**" in rows["BAT-KNEE"] and "step_ratio < 1.25 **undecided**" in rows["KV-DECODE-FLAT"]
    assert "**fails**" not in rows["BAT-KNEE"] + rows["KV-DECODE-FLAT"]


def test_markdown_is_a_pure_function_of_the_record(fixed_record, monkeypatch):
    """No registry, clock or machine is consulted: the same record renders the same text anywhere."""
    first = report.markdown(copy.deepcopy(fixed_record))

    def forbidden(*_a, **_k):
        raise AssertionError("markdown() consulted something outside the record")

    monkeypatch.setattr(registry, "load", forbidden)
    monkeypatch.setattr(time, "strftime", forbidden)
    monkeypatch.setattr(devices, "environment", forbidden)
    monkeypatch.setattr(author, "text_record", forbidden)
    assert report.markdown(fixed_record) == first


def test_fixed_record_shows_every_verdict_and_every_kind_of_content(fixed_record):
    """The snapshot only pins what the fixed record exercises: keep every path of the renderer in it."""
    verdicts = {c["verdict"] for c in fixed_record["claims"].values()}
    results = [r for c in fixed_record["claims"].values() for r in c["results"]]
    assert verdicts == set(VERDICTS)
    assert any(r.get("tables") for r in results)
    assert any(r.get("figures") for r in results)
    assert any(r.get("notes") for r in results)
    assert any(r.get("warnings") for r in results)
    assert any(r.get("perturbed") for r in results)
    assert len({c["section"] for c in fixed_record["claims"].values()}) > 1


def test_report_has_a_compact_table_per_section_and_links_its_plots(fixed_record):
    md = report.evidence_markdown(fixed_record)
    assert md.count("| claim | book | measured | tolerance | verdict | profile |") == len({c["section"] for c in fixed_record["claims"].values()})
    for fig in {f for c in fixed_record["claims"].values() for r in c["results"] for f in r.get("figures", [])}:
        assert f"]({fig})" in md
        assert fig.startswith("plots/") and fig.endswith(".png")


def test_a_deviating_claim_says_what_was_measured_how_and_what_to_conclude(fixed_record):
    candidates = errata.candidate_errata(fixed_record)
    deviating = {cid for cid, c in fixed_record["claims"].items() if c["verdict"] == DEVIATES}
    assert {e["claim"] for e in candidates} == deviating
    for e in candidates:
        assert e["failures"] and all(f["measured"] is not None and f["expected"] for f in e["failures"])
        assert e["test"] and e["profile"] and e["device"]
        assert e["conclusion"]
    assert [e["perturbed"] for e in candidates] == sorted(e["perturbed"] for e in candidates), "real candidates come before perturbed ones"
    md = report.markdown(fixed_record)
    section = md.split("## Candidate errata", 1)[1].split("\n## ", 1)[0]
    for e in candidates:
        assert f"### {e['claim']} on {e['profile']}" in section


def _built(tmp_path: Path | None = None) -> dict:
    rec = Recorder()
    rec.verify("KV-BYTES-FORMULA", "arithmetic", "cpu", {"bytes_per_token": 12_288})
    rec.not_run("KV-IDENTITY", "book", "cpu", "book weights not found")
    env = {k: f"{k}-value" for k in ENV_KEYS}
    return records.build([r.to_dict() for r in rec.results], env, {"device": "cpu", "created": "2026-01-01T00:00:00Z"}, {"KV-BYTES-FORMULA": ["t.py"], "KV-IDENTITY": ["t.py"]})


def test_build_keeps_the_record_keys_the_ci_reads():
    record = _built()
    assert record["schema"] == schema.RUN_SCHEMA
    assert set(record) >= {"schema", "claims", "summary", "environment", "run", "created", "sections", "errata"}
    assert list(record["claims"]) == list(registry.load())
    for c in record["claims"].values():
        assert set(c) >= {"section", "statement", "book", "units", "note", "has_test", "verdict", "results", "checks"}
    assert record["claims"]["KV-BYTES-FORMULA"]["verdict"] == "reproduced"
    assert record["claims"]["KV-IDENTITY"]["verdict"] == "not run"
    assert sum(record["summary"].values()) == len(record["claims"])
    assert record["created"] == "2026-01-01T00:00:00Z"


def test_build_records_each_check_with_its_tolerance():
    spec = _built()["claims"]["KV-7B-CACHE"]["checks"]
    claim = registry.get("KV-7B-CACHE")
    assert [s["q"] for s in spec] == [c.q for c in claim.checks]
    for s, c in zip(spec, claim.checks):
        assert (s.get("form"), s.get("tol"), s.get("op"), s.get("bound")) == ((c.form, c.tol, None, None) if c.kind == "digits" else (None, None, c.op, c.bound))


def test_write_puts_json_and_markdown_in_the_report_dir(tmp_path):
    record = _built()
    rec, md = report.write(record, tmp_path / "reports")
    assert json.loads(rec.read_text(encoding="utf-8"))["claims"]["KV-BYTES-FORMULA"]["verdict"] == "reproduced"
    assert md.read_text(encoding="utf-8") == report.markdown(record)
    assert schema.read_record(tmp_path / "reports") == json.loads(rec.read_text(encoding="utf-8"))


def test_environment_record_names_hardware_driver_and_library_versions():
    env = devices.environment("cpu")
    missing = [k for k in ENV_KEYS if not env.get(k)]
    assert not missing, f"environment() lacks {missing}"
    md = report.evidence_markdown(_built())
    for k in ENV_KEYS:
        assert f"| {k} | {k}-value |" in md


def test_benchmark_json_carries_the_environment():
    """pytest-benchmark writes machine_info into benchmarks.json; the suite adds its environment record."""
    from fixtures import options, recording

    class Config:
        stash = {options.DEVICE: "cpu"}

    machine_info: dict = {}
    recording.pytest_benchmark_update_machine_info(Config(), machine_info)
    assert all(machine_info["cheapinfer"].get(k) for k in ENV_KEYS)
    assert machine_info["cheapinfer"]["device"] == "cpu"
    assert "device" not in devices.environment("cpu"), "the run's environment record must not pick up the benchmark's device entry"


def test_markdown_renders_records_without_the_newer_keys(fixed_record):
    """Records written before `sections`, `checks` and `errata` existed still render."""
    old = copy.deepcopy(fixed_record)
    for key in ("sections", "errata"):
        old.pop(key)
    for c in old["claims"].values():
        c.pop("checks"), c.pop("runs_on"), c.pop("digits_on")
    assert report.markdown(old) == report.markdown(fixed_record)


def test_every_graded_entry_of_the_report_has_its_places_quotes_and_replacements(fixed_record):
    """errata.md and errata.json list no entry without a line in each translation, the printed words and a replacement."""
    entries = author.json_entries(fixed_record)
    assert entries and len(entries) == len(fixed_record["text"]["entries"])
    for e in entries:
        assert e["grade"] and e["evidence"]["finding"], e["id"]
        for lines, quotes, new in zip(e["locations"], e["quotes"], e["replacements"], strict=True):
            assert set(lines) == set(quotes) == set(new) == {"nl", "vi"}, (e["id"], lines)
            assert all(isinstance(n, int) and n > 0 for n in lines.values()) and all(quotes.values()) and all(new.values())
    md = report.markdown(fixed_record)
    listed = _author_entries(md)
    assert sorted(listed) == sorted(f"{e['title']} — {e['grade']}" for e in fixed_record["text"]["entries"])
    assert _unplaced(listed) == []


_CODE = re.compile(r"^(`+) ?(.*?) ?\1$")
KEPT = "unchanged (listed, right as printed)"


def _author_entries(md: str) -> dict[str, list[list[str]]]:
    """errata.md read back: each entry of the author's list and its notes (its ``### `` heading) -> its table's rows of cells."""
    out: dict[str, list[list[str]]] = {}
    section, entry = "", None
    for line in md.splitlines():
        if line.startswith("## "):
            section, entry = line[3:], None
        elif section in ("Errata for the author", "Notes") and line.startswith("### "):
            entry = line[4:].split(". ", 1)[1]
            out[entry] = []
        elif entry is not None and line.startswith("| ") and not line.startswith("| nl line "):
            out[entry].append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return out


def _unplaced(listed: dict[str, list[list[str]]]) -> list[str]:
    """Each entry of errata.md without a place: no row, or a row without a line, printed words or replacement in a language."""
    out = []
    for title, rows in listed.items():
        if not rows:
            out.append(f"{title}: no place")
        for row in rows:
            for lang, (line, printed, new) in zip(("nl", "vi"), (row[:3], row[3:6])):
                if not line.isdigit() or int(line) < 1:
                    out.append(f"{title}: no {lang} line ({line!r})")
                m = _CODE.match(printed)
                if not (m and m.group(2).strip()):
                    out.append(f"{title}: no {lang} printed words ({printed!r})")
                m = _CODE.match(new)
                if new != KEPT and not (m and m.group(2).strip()):
                    out.append(f"{title}: no {lang} replacement ({new!r})")
    return out


def _lost_line(entry):
    occ = entry["occurrences"][0]
    del occ["lines"]["vi"]
    occ["errors"]["vi"] = "not found: 'cache đều là 768 MB'"


@pytest.mark.parametrize("lose, said", [
    (_lost_line, "no vi line ('**not found**')"),
    (lambda e: e["occurrences"][0]["quotes"].update(nl=""), "no nl printed words ('``')"),
    (lambda e: e["occurrences"][0]["replacements"].update(vi=" "), "no vi replacement"),
    (lambda e: e.update(occurrences=[]), "no place"),
], ids=["line", "quote", "replacement", "occurrences"])
def test_a_report_entry_without_its_line_quote_or_replacement_fails_the_check(fixed_record, lose, said):
    """The check above reads errata.md as rendered: an entry that lost any of the three fails it, named."""
    broken = copy.deepcopy(fixed_record)
    entry = broken["text"]["entries"][1]
    lose(entry)
    missing = _unplaced(_author_entries(report.markdown(broken)))
    assert missing and all(m.startswith(f"{entry['title']} — {entry['grade']}: ") for m in missing), missing
    assert any(said in m for m in missing), missing


def test_an_entry_that_lost_its_place_says_so_in_the_report(fixed_record):
    broken = copy.deepcopy(fixed_record)
    _lost_line(broken["text"]["entries"][0])
    md = report.markdown(broken)
    assert "**not found**" in md and "**Not placed in the vi text:** not found" in md


def test_fault_coverage_is_one_line_without_a_faults_run(fixed_record):
    bare = copy.deepcopy(fixed_record)
    bare.pop("fault_run", None)
    md = report.markdown(bare)
    assert "faults that turn it red" not in md
    assert "No faults run is recorded: `python -m cheapinfer faults`" in md


def test_a_stand_in_verdict_never_reads_as_the_book_confirmed(fixed_record):
    md = report.markdown(fixed_record) + report.evidence_markdown(fixed_record)
    assert "stand-in: shape holds" in md
    assert "| shape holds |" not in md and "— shape holds" not in md


def test_claims_not_run_for_one_reason_are_one_line_naming_them_all(fixed_record):
    """The author reads one line for the claims that need the book's weights, not one line per claim."""
    rec = copy.deepcopy(fixed_record)
    reason = "book weights not found: pass --book-model PATH"
    for cid in ("KV-IDENTITY", "Q-NF4"):
        rec["claims"][cid]["results"] = [{**r, "verdict": "not run", "reason": reason} for r in rec["claims"][cid]["results"]]
    lines = report._not_run_lines(rec)
    assert f"- **KV-IDENTITY, Q-NF4** (2 claims): {reason}" in lines
    assert sum(reason in line for line in lines) == 1
