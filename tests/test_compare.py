"""compare (two run records: regressions) and merge (several: a claim x machine matrix).

The records are the fixed one of the snapshot test (tests/data/run-record.json) and small ones
built here with ``record.build`` from measurements judged by the registry.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from commands import cheapinfer
from hypothesis import given
from hypothesis import strategies as st

from cheapinfer import cli
from cheapinfer.cli.records import compare_cli, merge_cli
from cheapinfer.harness import compare as cmp
from cheapinfer.harness import merge, registry, schema, tables
from cheapinfer.harness import record as records
from cheapinfer.harness.record import Recorder

RECORD = Path(__file__).resolve().parent / "data" / "run-record.json"
ENV = {"cpu": "Example CPU", "gpu": "none", "driver": "n/a", "cuda": "n/a", "torch": "2.13.0", "transformers": "5.24.0", "bitsandbytes": "0.50.2", "gguf": "0.19.0"}


def built(bytes_per_token: int = 12_288, speedup: float = 3.0, env: dict | None = None) -> dict:
    """A small record: one digits claim (arithmetic) and one shape claim (twin timing ratios)."""
    rec = Recorder()
    rec.verify("KV-BYTES-FORMULA", "arithmetic", "cpu", {"bytes_per_token": bytes_per_token})
    rec.verify("KV-SPEEDUP-48", "twin", "cpu", {"speedup": speedup, "speedup_growth": 2.0, "cache_grows_by_one": True, "logit_change_vs_no_context": 1.0, "timed_forwards": 48, "timed_forwards_max": 48, "cached_s": 0.5})
    tested = {"KV-BYTES-FORMULA": ["t.py"], "KV-SPEEDUP-48": ["t.py"]}
    return records.build([r.to_dict() for r in rec.results], dict(env or ENV), {"device": "cpu", "created": "2026-01-01T00:00:00Z"}, tested)


def save(record: dict, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps(record), encoding="utf-8")
    return path


def test_compare_a_run_against_itself_exits_0(capsys):
    assert compare_cli([str(RECORD), str(RECORD)]) == 0
    assert "0 regression(s), 0 other change(s)" in capsys.readouterr().out


def test_compare_a_perturbed_value_exits_1_naming_the_claim(tmp_path, capsys):
    after = schema.read_record(RECORD)
    result = after["claims"]["KV-SPEEDUP-48"]["results"][0]
    for chk in result["checks"]:
        if chk["q"] == "speedup":
            chk["measured"] *= 0.5  # half the speedup, beyond the 25% band and below its bound > 2: a regression, whatever its noise
    assert compare_cli([str(RECORD), str(save(after, tmp_path / "after"))]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION  KV-SPEEDUP-48 [twin] speedup: 3.47 -> 1.735" in out


def test_a_claim_that_now_deviates_is_a_regression(tmp_path, capsys):
    before, after = save(built(), tmp_path / "before"), save(built(bytes_per_token=12_289), tmp_path / "after")
    assert schema.read_record(after)["claims"]["KV-BYTES-FORMULA"]["verdict"] == "deviates"
    assert cli.main(["compare", str(before), str(after)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION  KV-BYTES-FORMULA [arithmetic] verdict: reproduced -> deviates" in out


def test_a_claim_that_no_longer_deviates_is_reported_but_not_a_regression(tmp_path, capsys):
    before, after = save(built(bytes_per_token=12_289), tmp_path / "before"), save(built(), tmp_path / "after")
    assert compare_cli([str(before), str(after), "--verdicts-only"]) == 0
    assert "changed     KV-BYTES-FORMULA [arithmetic] verdict: deviates -> reproduced" in capsys.readouterr().out


def test_a_timing_ratio_within_its_band_is_noise(tmp_path):
    """speedup > 1: a fall from 3.6 to 3.0 (-17%) moves toward the bound; within 25% it is noise, beyond 10% a regression."""
    before, after = save(built(speedup=3.6), tmp_path / "before"), save(built(speedup=3.0), tmp_path / "after")
    assert compare_cli([str(before), str(after)]) == 0
    assert compare_cli([str(before), str(after), "--band", "0.1"]) == 1


def test_a_shape_value_moving_away_from_its_bound_is_no_regression():
    """speedup > 1 rising from 3.0 to 6.0 is a change worth printing, not a regression."""
    changes = cmp.compare(built(speedup=3.0), built(speedup=6.0))
    assert [(c.what, c.regression) for c in changes] == [("speedup", False)]


def test_a_value_not_named_by_a_check_is_not_compared():
    """Absolute times are reported, never asserted: they may move freely between machines."""
    before, after = built(), built()
    after["claims"]["KV-SPEEDUP-48"]["results"][0]["measured"]["cached_s"] = 50.0
    assert cmp.compare(before, after) == []


def test_a_digits_value_moves_by_its_own_tolerance():
    """KV-MEMORY-8.3X: ratio = 8.3 +- 15% relative, so a move of more than 0.15 x 8.3 = 1.245 is a regression."""
    before = schema.read_record(RECORD)

    def moved_to(value: float) -> list[cmp.Change]:
        after = copy.deepcopy(before)
        for chk in after["claims"]["KV-MEMORY-8.3X"]["results"][0]["checks"]:
            if chk["q"] == "ratio":
                chk["measured"] = value
        return cmp.compare(before, after)

    assert moved_to(6.2 + 1.2) == []
    [change] = moved_to(6.2 + 1.3)
    assert (change.claim, change.what, change.regression) == ("KV-MEMORY-8.3X", "ratio", True)


@given(base=st.floats(1e-3, 1e6), inside=st.floats(-0.99, 0.99), outside=st.floats(1.01, 3.9))
def test_shape_values_move_only_beyond_the_band(base, inside, outside):
    """Within the band (up or down, at any scale) a value has not moved; beyond it (up or down) it has."""
    assert not cmp._moved(base, base * (1 + inside * cmp.BAND), "rel", cmp.BAND)
    assert cmp._moved(base, base * (1 + outside * cmp.BAND), "rel", cmp.BAND)
    assert cmp._moved(base, base * (1 - outside * cmp.BAND), "rel", cmp.BAND)


def test_compare_names_the_environment_that_changed(tmp_path, capsys):
    newer = {**ENV, "torch": "2.14.0"}
    before, after = save(built(), tmp_path / "before"), save(built(env=newer), tmp_path / "after")
    assert compare_cli([str(before), str(after)]) == 0
    assert "environment torch: 2.13.0 -> 2.14.0" in capsys.readouterr().out


def test_compare_json_output(tmp_path, capsys):
    before, after = save(built(), tmp_path / "before"), save(built(bytes_per_token=12_289), tmp_path / "after")
    assert compare_cli([str(before), str(after), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["regressions"] >= 1
    assert {"claim": "KV-BYTES-FORMULA", "what": "verdict", "before": "reproduced", "after": "deviates"}.items() <= out["changes"][0].items()


def test_compare_command_line_exit_status(tmp_path, capfd):
    """The exit status a CI job sees, through `python -m cheapinfer compare`."""
    before, after = save(built(), tmp_path / "before"), save(built(bytes_per_token=12_289), tmp_path / "after")
    run = lambda a, b: cheapinfer(capfd, "compare", str(a), str(b))  # noqa: E731
    assert run(before, before).returncode == 0
    failed = run(before, after)
    assert failed.returncode == 1 and "KV-BYTES-FORMULA" in failed.stdout


def test_compare_a_missing_record_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exc:
        compare_cli([str(tmp_path / "nowhere"), str(RECORD)])
    assert exc.value.code == 2


def test_merge_makes_a_claim_by_machine_matrix(tmp_path, capsys):
    gpu = {**ENV, "gpu": "Example GPU 24 GB", "cuda": "12.4", "driver": "550.00"}
    paths = [save(built(), tmp_path / "laptop"), save(built(speedup=7.5, env=gpu), tmp_path / "gpu"), save(built(bytes_per_token=12_289), tmp_path / "laptop2")]
    assert cli.main(["merge", *map(str, paths)]) == 0
    md = capsys.readouterr().out
    laptop = "Example CPU (torch 2.13.0, transformers 5.24.0, bitsandbytes 0.50.2)"
    header = next(line for line in md.splitlines() if line.startswith("| claim |"))
    assert header == f"| claim | {laptop} | Example GPU 24 GB (torch 2.13.0, transformers 5.24.0, bitsandbytes 0.50.2) | {laptop} #2 |"
    row = next(line for line in md.splitlines() if line.startswith("| KV-BYTES-FORMULA |"))
    assert row.count("reproduced") == 2 and "**deviates**" in row
    assert "twin: speedup 7.5" in next(line for line in md.splitlines() if line.startswith("| KV-SPEEDUP-48 |"))


def test_merge_names_the_release_that_made_each_record(tmp_path, capsys):
    """Each machine's row of the matrix names the suite's release that wrote its record, as compare does."""
    older = built() | {"suite": "cheapinfer 0.0.9"}
    paths = [save(older, tmp_path / "old"), save(built(), tmp_path / "new")]
    assert merge_cli(list(map(str, paths))) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| Example CPU")]
    laptop = "Example CPU (torch 2.13.0, transformers 5.24.0, bitsandbytes 0.50.2)"
    tail = "cpu | Example CPU | none | n/a | n/a | 2.13.0 | 5.24.0 | 0.50.2 | 0.19.0 | 2026-01-01T00:00:00Z"
    assert rows == [f"| {laptop} | cheapinfer 0.0.9 | {tail} | {paths[0]} |",
                    f"| {laptop} #2 | {built()['suite']} | {tail} | {paths[1]} |"], rows
    assert [m["suite"] for m in merge.merge([older, built()], ["a", "b"])["machines"]] == ["cheapinfer 0.0.9", built()["suite"]]


def test_merge_json(tmp_path):
    paths = [save(built(), tmp_path / "a"), str(RECORD)]
    out = tmp_path / "matrix.json"
    assert merge_cli([*map(str, paths), "--json", "-o", str(out)]) == 0
    matrix = json.loads(out.read_text(encoding="utf-8"))
    labels = [m["label"] for m in matrix["machines"]]
    assert len(labels) == 2 and labels[1].startswith("Example GPU 8 GB")
    cell = matrix["claims"]["KV-MEMORY-8.3X"]["machines"]
    assert cell[labels[1]]["verdict"] == "deviates"
    assert matrix["claims"]["KV-7B-CACHE"]["machines"][labels[1]] is None  # not in the fixed record


def test_an_old_record_s_section_keys_are_read_as_the_registry_names_them_now():
    """Records written before the sections had one name carry ``KV``, ``Q``...: merged with a new record, every claim is
    filed under today's key, and an old record's summary still counts its sections; compare matches claims by ID."""
    old = json.loads(RECORD.read_text(encoding="utf-8"))
    assert {c["section"] for c in old["claims"].values()} >= {"KV", "Q", "SPEC"}  # the fixed record is such an old one
    matrix = merge.merge([old, built()], ["old", "new"])
    assert {c["section"] for c in matrix["claims"].values()} <= set(registry.SECTIONS)
    assert matrix["claims"]["KV-MEMORY-8.3X"]["section"] == "kv_cache" and matrix["claims"]["Q-NF4"]["section"] == "quantization"
    assert tables.section_key("kv_cache") == "kv_cache" and tables.section_key("ASIDE") == "asides"
    without = {k: v for k, v in old.items() if k != "sections"}
    rows = [line for line in tables.summary_table(without) if line.startswith("| 1. KV cache")]
    assert rows and rows == [line for line in tables.summary_table(old) if line.startswith("| 1. KV cache")]
    assert not [c for c in cmp.compare(old, old) if c.regression]


@pytest.mark.parametrize(
    "reason, error, regression",
    [("error before a verdict: ImportError: cannot import name 'DynamicCache'", True, True), ("needs a CUDA device; this run uses cpu", False, False)],
    ids=["error", "skip"],
)
def test_a_claim_that_errors_is_a_regression_and_one_that_is_skipped_is_not(reason, error, regression):
    before, after = built(), built()
    after["claims"]["KV-SPEEDUP-48"]["results"] = [{"claim": "KV-SPEEDUP-48", "profile": "twin", "device": "cpu", "verdict": "not run", "reason": reason,
                                                    "harness_error": error, "measured": {}, "checks": []}]
    [change] = cmp.compare(before, after)
    assert (change.claim, change.before, change.after, change.regression) == ("KV-SPEEDUP-48", "shape holds", "not run", regression)


def test_a_claim_whose_test_was_not_selected_is_one_informational_change():
    """A run with -k or -m selects fewer tests: their claims are 'not run', not regressions."""
    before = built()
    rec = Recorder()
    rec.verify("KV-SPEEDUP-48", "twin", "cpu", {"speedup": 3.0, "speedup_growth": 2.0, "cache_grows_by_one": True, "logit_change_vs_no_context": 1.0, "timed_forwards": 48, "timed_forwards_max": 48})
    after = records.build([r.to_dict() for r in rec.results], dict(ENV), {"device": "cpu"}, {"KV-BYTES-FORMULA": ["t.py"], "KV-SPEEDUP-48": ["t.py"]})
    [change] = cmp.compare(before, after)
    assert (change.claim, change.profile, change.before, change.after, change.regression) == ("KV-BYTES-FORMULA", "-", "reproduced", "not run", False)


def _gamma8(a09: float, a03: float) -> dict:
    rec = Recorder()
    rec.verify("SPEC-GAMMA8", "arithmetic", "cpu", {"speedup_a09": a09, "speedup_a03": a03})
    return records.build([r.to_dict() for r in rec.results], dict(ENV), {"device": "cpu", "created": "2026-01-01T00:00:00Z"}, {"SPEC-GAMMA8": ["t.py"]})


def test_a_confirmed_erratum_whose_digits_reproduce_is_a_regression(tmp_path, capsys):
    """Like a strict xfail that passes: the erratum entry is stale, and compare says so."""
    before = save(_gamma8(2.356, 0.549), tmp_path / "before")
    after = save(_gamma8(3.40, 0.79), tmp_path / "after")
    assert schema.read_record(before)["claims"]["SPEC-GAMMA8"]["verdict"] == "erratum"
    assert schema.read_record(after)["claims"]["SPEC-GAMMA8"]["verdict"] == "deviates"
    assert compare_cli([str(before), str(after)]) == 1
    assert "REGRESSION  SPEC-GAMMA8 [arithmetic] verdict: erratum -> deviates" in capsys.readouterr().out


def test_a_printed_bound_moves_like_a_shape_bound():
    """A digits check of form `bound` (a printed "more than ten times") is compared against its bound with the band."""
    claim = {"book": {"r": 10.0}, "checks": [{"q": "r", "kind": "digits", "form": "bound", "op": ">", "tol": 0.0}]}
    assert cmp._tolerance("r", claim, 0.25) == ("rel", 0.25)
    assert cmp.shape_bound("r", claim) == (">", 10.0)


def _with_se(speedup: float, se: float) -> dict:
    rec = Recorder()
    rec.verify("KV-SPEEDUP-48", "twin", "cpu", {"speedup": speedup, "speedup_se": se, "speedup_growth": 2.0, "speedup_growth_se": 0.01,
                                                 "cache_grows_by_one": True, "logit_change_vs_no_context": 1.0, "timed_forwards": 48, "timed_forwards_max": 48})
    return records.build([r.to_dict() for r in rec.results], dict(ENV), {"device": "cpu", "created": "2026-01-01T00:00:00Z"}, {"KV-SPEEDUP-48": ["t.py"]})


def test_a_noisy_value_moved_within_three_combined_standard_errors_is_no_regression():
    """speedup 4.0 -> 2.4 (-40%, toward > 2): a change where the two runs' standard errors are small, nothing where they are
    not. Never a regression while the verdict holds: those errors are one process's rounds, and two processes of one
    environment differ by more (KV-HEAD-TIMING 840 and 1,520); only a verdict change decides."""
    [change] = cmp.compare(_with_se(4.0, 0.05), _with_se(2.4, 0.05))
    assert (change.what, change.regression, change.reason) == ("speedup", False, cmp.BETWEEN_PROCESSES_REASON)
    assert "rerun the claim on both sides" in change.line() and change.line().startswith("changed")
    def moved(before, after):
        return [c for c in cmp.compare(before, after) if c.what == "speedup"]  # the verdict may turn inconclusive: a change, reported apart

    assert moved(_with_se(4.0, 0.4), _with_se(2.4, 0.4)) == []  # 1.6 < 3 x hypot(0.4, 0.4) = 1.70
    assert moved(_with_se(4.0, 0.05), _with_se(2.4, float("inf"))) == []  # an infinite error decides nothing



def _processes(*speedups: float) -> list[dict]:
    """One record per process (each its own run id), every speedup with a small standard error of its rounds."""
    return [_with_se(x, 0.05) for x in speedups]


def test_reruns_on_both_sides_judge_a_clocked_value_on_the_spread_between_processes():
    """Three processes a side. 4.0, 4.2, 3.9 -> 2.6, 2.5, 2.7 (toward > 2, -35%): Welch's t-test rejects equal means far
    below 0.27%, so it is a regression although the bound still holds. KV-HEAD-TIMING's kind of spread (one process at
    twice another's value) on both sides hides a move of the first records as large: nothing is reported."""
    (before, *more_before), (after, *more_after) = _processes(4.0, 4.2, 3.9), _processes(2.6, 2.5, 2.7)
    [change] = [c for c in cmp.compare(before, after, reruns=(more_before, more_after)) if c.what == "speedup"]
    assert change.regression and "Welch's t-test at level 0.27%" in change.tolerance and "toward the bound > 2" in change.tolerance
    assert change.before == pytest.approx(4.0333, abs=1e-3) and change.after == pytest.approx(2.6) and "3.9 -> 2.6, 2.5, 2.7" in change.reason
    assert cmp.compare(before, after) and cmp.compare(before, after)[0].reason == cmp.BETWEEN_PROCESSES_REASON  # one record a side: a change

    (before, *more_before), (after, *more_after) = _processes(4.0, 7.6, 3.4), _processes(2.4, 6.9, 3.8)
    assert [c for c in cmp.compare(before, after, reruns=(more_before, more_after)) if c.what == "speedup"] == []


def test_a_side_with_one_process_keeps_the_rule_of_one_run_per_side():
    """Reruns on one side only, or reruns that did not measure the claim, leave one process on a side: the move is a change."""
    (before, *more_before), after = _processes(4.0, 4.1, 4.05), _with_se(2.4, 0.05)
    [change] = [c for c in cmp.compare(before, after, reruns=(more_before, [])) if c.what == "speedup"]
    assert (change.regression, change.reason) == (False, cmp.BETWEEN_PROCESSES_REASON)
    unselected = built()
    del unselected["claims"]["KV-SPEEDUP-48"]  # a rerun of another claim
    [change] = [c for c in cmp.compare(before, after, reruns=(more_before, [unselected])) if c.what == "speedup"]
    assert (change.regression, change.reason) == (False, cmp.BETWEEN_PROCESSES_REASON)


def test_welch_p_of_values_that_do_not_vary():
    assert cmp.welch_p([2.0, 2.0], [2.0, 2.0]) == 1.0 and cmp.welch_p([2.0, 2.0], [3.0, 3.0]) == 0.0
    assert cmp.welch_p([1.0, 2.0, 3.0], [1.5, 2.5, 3.5]) > 0.5


def test_reruns_through_the_command_line_and_what_they_refuse(tmp_path, capsys):
    sides = {name: [save(r, tmp_path / f"{name}{i}") for i, r in enumerate(_processes(*values))]
             for name, values in (("before", (4.0, 4.2, 3.9)), ("after", (2.6, 2.5, 2.7)))}
    argv = [str(sides["before"][0]), str(sides["after"][0]), "--before-reruns", *map(str, sides["before"][1:]),
            "--after-reruns", *map(str, sides["after"][1:])]
    assert compare_cli(argv) == 1
    out = capsys.readouterr().out
    assert "(and 2 rerun(s): " in out and "REGRESSION  KV-SPEEDUP-48 [twin] speedup: 4.03333 -> 2.6" in out
    assert compare_cli(argv[:2]) == 0  # one record a side: a change, no regression
    capsys.readouterr()

    twice = [*argv[:3], str(sides["before"][1]), str(sides["before"][1])]
    other = save(_with_se(4.1, 0.05) | {"environment": {**ENV, "transformers": "4.57.6"}}, tmp_path / "other")
    for bad, message in ((twice, "are the same run"), ([*argv[:3], str(other)], "is not a rerun of")):
        with pytest.raises(SystemExit) as stop:
            compare_cli(bad)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err

def test_a_value_an_erratum_stands_on_may_move_with_the_release_its_erratum_applies_to():
    """KV-API: `cache` on transformers 5.x, `past_key_values` on 4.x. Expected where the erratum's release range is crossed, a regression otherwise."""
    def kv_api(argument: str, transformers: str) -> dict:
        rec = Recorder()
        rec.verify("KV-API", "twin", "cpu", {"cache_argument": argument, "cache_attribute": argument, "identical": True})
        return records.build([r.to_dict() for r in rec.results], {**ENV, "transformers": transformers},
                            {"device": "cpu", "created": "2026-01-01T00:00:00Z"}, {"KV-API": ["t.py"]})

    across = [c for c in cmp.compare(kv_api("cache", "5.24.0"), kv_api("past_key_values", "4.57.6")) if c.what == "cache_argument"]
    assert len(across) == 1 and not across[0].regression and "applies to transformers >=5" in across[0].line()
    within = [c for c in cmp.compare(kv_api("cache", "5.24.0"), kv_api("past_key_values", "5.24.0")) if c.what == "cache_argument"]
    assert len(within) == 1 and within[0].regression


def test_a_value_first_measured_when_a_search_succeeds_is_a_change_not_a_regression():
    """BAT-KNEE inconclusive (no knee in range, its gains nan) in one run, found in the next: the verdicts tell the change;
    a value that moves between two decided runs still is a regression."""
    def knee(found: bool, gain: float, knee_batch: int, gain_16_32: float = 1.1) -> dict:
        rec = Recorder()
        measured = {"knee_found": found, "knee_latency_gain": gain if found else float("nan"), "knee_latency_gain_se": 0.01,
                    "gain_before_knee": 2.0 if found else float("nan"), "gain_before_knee_se": 0.01, "knee_batch": knee_batch,
                    "knee_rule_on_book_curve": 16, "gain_before_on_book_curve": 1.9, "knee_searched_up_to": 512, "knee_search_complete": True, "knee_skipped_doublings": 0,
                    "throughput_gain_16_32": gain_16_32, "latency_gain_16_32": 1.8, "cache_grows_by_fed": True, "logit_change_vs_no_context": 1.0,
                    "timed_forwards": 1, "timed_forwards_max": 1, "history_tokens": [64, 64]}
        rec.verify("BAT-KNEE", "twin", "cpu", measured)
        return records.build([r.to_dict() for r in rec.results], ENV, {"device": "cpu", "created": "2026-01-01T00:00:00Z"}, {"BAT-KNEE": ["t.py"]})

    found_later = cmp.compare(knee(False, 0, 0), knee(True, 1.7, 256))
    assert found_later and not [c for c in found_later if c.regression], [c.line() for c in found_later]
    assert any(c.what == "verdict" for c in found_later) and any(c.reason == cmp.UNDECIDED_REASON for c in found_later)
    moved = [c for c in cmp.compare(knee(True, 1.7, 256), knee(True, 1.7, 256, gain_16_32=2.0)) if c.what == "throughput_gain_16_32"]
    assert moved and moved[0].regression
