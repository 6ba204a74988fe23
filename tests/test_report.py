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
from pathlib import Path

import pytest

from cheapinfer.runtime import device as devices
from cheapinfer.harness import registry, report, errata, schema
from cheapinfer.harness.record import Recorder
from cheapinfer.harness.registry import DEVIATES, VERDICTS

DATA = Path(__file__).resolve().parent / "data"
RECORD = DATA / "run-record.json"
SNAPSHOT = DATA / "errata-snapshot.md"
ENV_KEYS = ("cpu", "gpu", "driver", "cuda", "torch", "transformers", "bitsandbytes", "gguf")


@pytest.fixture
def fixed_record() -> dict:
    return schema.read_record(RECORD)


@pytest.mark.parametrize("render, snapshot", [(report.markdown, SNAPSHOT), (report.evidence_markdown, DATA / "evidence-snapshot.md")],
                         ids=["errata.md", "evidence.md"])
def test_errata_markdown_matches_the_checked_in_snapshot(fixed_record, render, snapshot):
    rendered = render(fixed_record)
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        snapshot.write_text(rendered, encoding="utf-8")
    expected = snapshot.read_text(encoding="utf-8")
    if rendered != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), rendered.splitlines(True), snapshot.name, "rendered", n=1))
        pytest.fail(f"the report's format changed (regenerate on purpose with UPDATE_SNAPSHOTS=1 and review the diff):\n{diff[:4000]}", pytrace=False)


def test_markdown_is_a_pure_function_of_the_record(fixed_record, monkeypatch):
    """No registry, clock or machine is consulted: the same record renders the same text anywhere."""
    first = report.markdown(copy.deepcopy(fixed_record))

    def forbidden(*_a, **_k):
        raise AssertionError("markdown() consulted something outside the record")

    monkeypatch.setattr(report.registry, "load", forbidden)
    monkeypatch.setattr(report.time, "strftime", forbidden)
    monkeypatch.setattr(devices, "environment", forbidden)
    monkeypatch.setattr(report.author, "text_record", forbidden)
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
    return report.build([r.to_dict() for r in rec.results], env, {"device": "cpu", "created": "2026-01-01T00:00:00Z"}, {"KV-BYTES-FORMULA": ["t.py"], "KV-IDENTITY": ["t.py"]})


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
    entries = report.author.json_entries(fixed_record)
    assert entries and len(entries) == len(fixed_record["text"]["entries"])
    for e in entries:
        assert e["grade"] and e["evidence"]["finding"], e["id"]
        for lines, quotes, new in zip(e["locations"], e["quotes"], e["replacements"], strict=True):
            assert set(lines) == set(quotes) == set(new) == {"nl", "vi"}, (e["id"], lines)
            assert all(isinstance(n, int) and n > 0 for n in lines.values()) and all(quotes.values()) and all(new.values())
    md = report.markdown(fixed_record)
    for entry in fixed_record["text"]["entries"]:
        assert f"{entry['title']} — {entry['grade']}" in md
    assert "**not found**" not in md


def test_an_entry_that_lost_its_place_says_so_in_the_report(fixed_record):
    broken = copy.deepcopy(fixed_record)
    occ = broken["text"]["entries"][0]["occurrences"][0]
    del occ["lines"]["vi"]
    occ["errors"]["vi"] = "not found: 'cache đều là 768 MB'"
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
