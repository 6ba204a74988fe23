"""The typed records: what the writers write is what the types declare, and the one validator holds a record
to them in one line naming the place."""

from __future__ import annotations

import copy
import json
import types
import typing
from pathlib import Path

import pytest

from cheapinfer.audits import faults
from cheapinfer.cli import records
from cheapinfer.harness import record, report, schema, vocabulary

RECORD = Path(__file__).resolve().parent / "data" / "run-record.json"


def _undeclared(value, tp, where: str) -> list[str]:
    """Keys ``value`` holds that its type does not declare, at every level of a TypedDict (``Any`` ends the walk)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        tp = next((a for a in args if a is not type(None)), tp)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    out = []
    if typing.is_typeddict(tp) and isinstance(value, dict):
        fields = schema._fields(tp)
        out += [f"{where}.{k}" for k in value if k not in fields]
        for k, t in fields.items():
            if k in value:
                out += _undeclared(value[k], t, f"{where}.{k}")
    elif origin is list and isinstance(value, list):
        for i, v in enumerate(value):
            out += _undeclared(v, args[0], f"{where}[{i}]")
    elif origin is dict and isinstance(value, dict):
        for k, v in value.items():
            out += _undeclared(v, args[1], f"{where}.{k}")
    return out


def _built_record() -> dict:
    """A record as a run writes it: every result kind (judged, not run, a harness error, a placeholder) and a fault run."""
    rec = record.Recorder(perturb=["KV-SCORES-BYTES"])
    rec.verify("KV-BYTES-FORMULA", "arithmetic", "cpu", {"bytes_per_token": 12_288}, tables=[{"title": "t", "header": ["a"], "rows": [[1]]}],
               notes=["n"], test="claims/test_kv_cache.py::t", seconds=0.1, load={"loadavg_before": [0.1, 0.1, 0.1], "cpus": 2})
    rec.verify("KV-HEAD-TIMING", "twin", "cpu", {"ratio_growth": 2.0, "ratio_growth_se": 0.01, "recompute_over_cached_4096": 50.0, "rounds": 5})
    rec.not_run("KV-IDENTITY", "twin", "cpu", "skipped: no reason", test="claims/test_kv_cache.py::x")
    rec.not_run("KV-API", "twin", "cpu", f"{vocabulary.ERROR_REASON}: ImportError", test="claims/test_kv_cache.py::y", harness_error=True)
    results = [r.to_dict() for r in rec.results]
    fault = {"schema": schema.FAULT_SCHEMA, "suite": "cheapinfer 0", "created": "2026-01-01T00:00:00Z", "runs": 1, "mode": vocabulary.SWEEP,
             "seconds": 1.0, "uncovered": [], "faults": {"f": {"section": "kv_cache", "kind": "k", "what": "w", "targets": ["KV-IDENTITY"], "clocked": False,
                                                              "runs": [{"KV-IDENTITY": vocabulary.RED}], "caught": 1, "seconds": 1.0}}}
    tested = {"KV-BYTES-FORMULA": ["t"], "KV-HEAD-TIMING": ["t"], "KV-IDENTITY": ["t"], "KV-API": ["t"], "KV-MACS": ["t"]}
    return record.build(results, {"cpu": "x", "torch": "2"}, {"id": "abc", "command": "pytest"}, tested, faults={"KV-IDENTITY": ["f"]}, fault_run=fault)


def test_what_the_report_writes_is_what_the_schema_declares():
    """A key the writer adds without declaring it in the schema fails here: the types keep up with the record."""
    built = json.loads(json.dumps(_built_record(), default=str))
    schema.check_record(built)
    assert _undeclared(built, schema.RunRecord, "record") == []


def test_the_pinned_record_and_the_runners_fault_record_conform(monkeypatch, tmp_path):
    pinned = json.loads(RECORD.read_text(encoding="utf-8"))
    schema.check_record(pinned)
    assert _undeclared(pinned, schema.RunRecord, "record") == []
    some = next(iter(faults.catalogue()))
    monkeypatch.setattr(faults, "_run_one", lambda f, claims, outdir, timeout, threads=None, stop=False: faults.FaultRun({cid: vocabulary.RED for cid in claims}, {}))
    written = json.loads(json.dumps(faults.run([some], 1, tmp_path, echo=lambda line: None)))
    assert schema.check_fault_record(written) is written and written["schema"] == schema.FAULT_SCHEMA
    assert _undeclared(written, schema.FaultRecord, "faults") == []
    (tmp_path / schema.FAULTS_NAME).write_text(json.dumps(written))
    assert faults.last_run(tmp_path) == written


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda r: r["claims"]["KV-IDENTITY"]["results"][0]["checks"][0].update(asserted="yes"),
         "claim KV-IDENTITY: results[0]: checks[0]: 'asserted': expected true or false"),
        (lambda r: r["claims"]["KV-IDENTITY"].update(statement=None), "claim KV-IDENTITY: 'statement': expected a string"),
        (lambda r: r["claims"]["KV-IDENTITY"]["results"][0].update(seconds="slow"), "claim KV-IDENTITY: results[0]: 'seconds': expected a number"),
        (lambda r: r["claims"]["KV-IDENTITY"]["checks"][0].update(kind="digit"), "claim KV-IDENTITY: checks[0]: 'kind': expected digits or shape"),
        (lambda r: r["fault_run"]["faults"]["kv-decode-ignores-cache"].pop("targets"),
         "the record: fault_run: faults: kv-decode-ignores-cache: expected an object with 'runs', 'targets'; it has no 'targets'"),
        (lambda r: r["fault_run"].update(schema=7), "the record: fault_run: 'schema': expected 1 (the schemas this version reads), not 7"),
        (lambda r: r.update(summary={"reproduced": "many"}), "the record: summary: reproduced: expected an integer"),
    ],
)
def test_a_record_of_the_wrong_type_anywhere_is_one_line_naming_the_place(break_it, message):
    rec = json.loads(RECORD.read_text(encoding="utf-8"))
    break_it(rec)
    with pytest.raises(schema.RecordError) as exc:
        schema.check_record(rec)
    assert str(exc.value).startswith(message), str(exc.value)


def test_a_fault_record_is_read_only_when_it_is_one(tmp_path):
    """faults.json: an earlier version's (no schema) is read; another schema, a missing key or a broken file is none."""
    good = json.loads(RECORD.read_text(encoding="utf-8"))["fault_run"]
    assert "schema" not in good and schema.check_fault_record(copy.deepcopy(good)) == good
    path = tmp_path / schema.FAULTS_NAME
    for broken in ({**good, "schema": 2}, {**good, "suite": "otherbench 1"}, {k: v for k, v in good.items() if k != "runs"}):
        path.write_text(json.dumps(broken))
        with pytest.raises(schema.RecordError):
            schema.read_fault_record(tmp_path)
        assert faults.last_run(tmp_path) is None
    path.write_text("{not json")
    assert faults.last_run(tmp_path) is None


def test_the_record_schema_names_every_verdict_the_registry_knows_only_at_read_time(monkeypatch):
    """The verdicts are the vocabulary's (read when a record is checked), not a copy in the types."""
    rec = json.loads(RECORD.read_text(encoding="utf-8"))
    rec["claims"]["KV-IDENTITY"]["verdict"] = "new verdict"
    with pytest.raises(schema.RecordError, match="not 'new verdict'"):
        schema.check_record(rec)
    monkeypatch.setattr(vocabulary, "VERDICTS", (*vocabulary.VERDICTS, "new verdict"))
    schema.check_record(rec)


# ------------------------------------------------------------------------------------------------
# records of schema 1: still read, in this version's shape
# ------------------------------------------------------------------------------------------------

#: A record of schema 1 as release 0.1.0 wrote it, cut to six claims: SPEC-GAMMA8 holds its erratum under ``erratum``
#: only (records before several per claim), the others under both keys; KV-IDENTITY's book profile is a harness
#: error said only by its reason's prefix (records before the ``harness_error`` field).
SCHEMA_1 = RECORD.parent / "run-record-schema-1.json"


def test_a_schema_1_record_is_read_in_this_versions_shape():
    raw = json.loads(SCHEMA_1.read_text(encoding="utf-8"))
    assert raw["schema"] == 1 and "errata" not in raw["claims"]["SPEC-GAMMA8"] and "erratum" in raw["claims"]["SPEC-GAMMA8"]
    read = schema.read_record(SCHEMA_1)
    assert read["schema"] == 1 and not any("erratum" in c for c in read["claims"].values())
    assert read["claims"]["SPEC-GAMMA8"]["errata"] == [raw["claims"]["SPEC-GAMMA8"]["erratum"]]
    assert read["claims"]["Q-DOWNPROJ-STATS"]["errata"] == raw["claims"]["Q-DOWNPROJ-STATS"]["errata"]
    book = [r for r in read["claims"]["KV-IDENTITY"]["results"] if r["profile"] == "book"]
    assert [r.get("harness_error") for r in book] == [True] and vocabulary.is_harness_error(book[0])


def test_an_erratum_of_schema_1_that_is_no_object_is_one_line():
    raw = json.loads(SCHEMA_1.read_text(encoding="utf-8"))
    raw["claims"]["SPEC-GAMMA8"]["erratum"] = "stale"
    with pytest.raises(schema.RecordError, match=r"^claim SPEC-GAMMA8: 'erratum': expected an object or null$"):
        schema.upgrade(schema.check_record(raw))


def test_compare_and_merge_read_a_schema_1_record_beside_this_versions(tmp_path, capsys):
    """A harness error said by the reason's prefix still reads as one; the erratum under ``erratum`` still renders."""

    now = schema.upgrade(schema.check_record(json.loads(SCHEMA_1.read_text(encoding="utf-8"))))
    now["schema"] = schema.RUN_SCHEMA
    for r in now["claims"]["KV-IDENTITY"]["results"]:
        if r["profile"] == "book":
            r.update(verdict=vocabulary.REPRODUCED, reason="", harness_error=False, checks=[])
    (tmp_path / "now.json").write_text(json.dumps(now), encoding="utf-8")
    assert records.compare_cli([str(tmp_path / "now.json"), str(SCHEMA_1)]) == 1
    out = capsys.readouterr().out
    assert "HARNESS     KV-IDENTITY [book] verdict: reproduced -> not run (error before a verdict: ImportError" in out
    assert records.merge_cli([str(SCHEMA_1), str(tmp_path / "now.json")]) == 0
    assert "| SPEC-GAMMA8 | erratum (arithmetic: speedup_a09 2.356) | erratum (arithmetic: speedup_a09 2.356) |" in capsys.readouterr().out
    evidence = report.evidence_markdown(schema.read_record(SCHEMA_1))
    assert "### SPEC-GAMMA8 (inconsistency)" in evidence and "### Q-DOWNPROJ-STATS (translation)" in evidence
