"""The registry itself: coverage of the chapter's catalog, one test per claim, and falsifiability."""

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from cheapinfer.harness import numbers, record, registry, vocabulary
from cheapinfer.harness import verdict as verdicts
from cheapinfer.harness.registry import RegistryError
from cheapinfer.harness.vocabulary import DEVIATES, REPRODUCED, SHAPE_HOLDS

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT.parent / "shared" / "CLAIMS.md"
CLAIM_COUNT = 61  # the chapter's catalog lists 61 claim IDs


def test_registry_holds_every_catalog_id_once():
    claims = registry.load()
    assert len(claims) == CLAIM_COUNT, f"registry has {len(claims)} claims, the catalog {CLAIM_COUNT}"
    if not CATALOG.exists():
        pytest.skip(f"the catalog CLAIMS.md is not beside this checkout ({CATALOG}); the count was checked")
    ids = [i for i in re.findall(r"^\| ([A-Z][A-Z0-9.\-]+) \|", CATALOG.read_text(encoding="utf-8"), re.M) if i != "ID"]
    assert sorted(ids) == sorted(claims), f"missing: {set(ids) - set(claims)}, extra: {set(claims) - set(ids)}"
    assert ids == list(claims), "the registry keeps the catalog's order"


#: A claim test's marker, as written in ``claims/test_*.py`` (read here only: the suite takes every registry claim as tested)
_CLAIM_MARK = re.compile(r"""mark\.claim\(\s*["']([A-Z][A-Z0-9.\-]+)["']""")


def test_every_claim_has_exactly_one_test_function():
    tested: dict[str, list[str]] = {}
    for path in sorted((ROOT / "claims").glob("test_*.py")):
        for claim_id in _CLAIM_MARK.findall(path.read_text(encoding="utf-8")):
            tested.setdefault(claim_id, []).append(path.name)
    missing = [cid for cid in registry.load() if cid not in tested]
    twice = {cid: files for cid, files in tested.items() if len(files) > 1}
    unknown = set(tested) - set(registry.load())
    assert not unknown, f"tests name claims the registry lacks: {sorted(unknown)}"
    assert not twice, f"claims with more than one test function: {twice}"
    assert not missing, f"claims without a test: {missing}"


def _passing_value(check, book):
    """A measurement that satisfies ``check`` exactly at the book's value or just inside the bound
    (a printed bound's book value is its bound; a printed set's first member)."""
    if check.kind == "digits" and check.form == "one_of":
        return book[check.q][0]
    if check.kind == "digits" and check.form != "bound":
        return book[check.q]
    b = book[check.q] if check.kind == "digits" else check.bound
    if isinstance(b, bool) or not isinstance(b, (int, float)):
        return b
    step = max(abs(b) * 1e-3, 1e-6)
    return {">": b + step, ">=": b, "<": b - step, "<=": b, "==": b}[check.op]


@pytest.mark.parametrize("claim", list(registry.load().values()), ids=lambda c: c.id)
def test_claim_turns_red_when_its_book_value_moves_beyond_tolerance(claim):
    """Every check of every tested claim can fail: a passing measurement stops passing once the
    registry's value moves beyond its tolerance (STYLE habit 9)."""
    assert claim.checks, f"{claim.id} has a test but no checks: its verdict could never be 'deviates'"
    # a confirmed erratum documents its digits as failing; here the comparator is proved on the plain checks
    claim = replace(claim, errata=())
    # the book's own values first: where a shape check names the same quantity, the book must satisfy it too
    measured = {c.q: _passing_value(c, claim.book) for c in claim.checks if c.kind == "digits"}
    measured.update({c.q: _passing_value(c, claim.book) for c in claim.checks if c.kind == "shape" and c.q not in measured})
    for c in claim.checks:  # a seeded check's distribution (registry_fields.DRAWS_RULE): every draw at the median
        if c.draws:
            measured.update({f"{c.q}_p05": measured[c.q], f"{c.q}_p95": measured[c.q], f"{c.q}_draws": c.draws, f"{c.q}_share_holding": 1.0})
    for profile in claim.runs_on:
        base = verdicts.judge(claim, measured, profile, "cuda")
        assert base.verdict in (REPRODUCED, SHAPE_HOLDS), f"{claim.id} on {profile}: {[o.message(claim) for o in base.failures]}"
        moved = verdicts.judge(verdicts.perturb(claim, measured), measured, profile, "cuda")
        assert moved.verdict == DEVIATES, f"{claim.id} on {profile}: still {moved.verdict} after moving the book values"
    # each check on its own flips as well: no check hides behind another
    for check in claim.checks:
        if check.kind == "digits" and not set(claim.digits_on) & set(claim.runs_on):
            continue
        alone = verdicts.perturb(registry.Claim(**{**claim.__dict__, "checks": (check,)}), measured)
        profile = next(p for p in claim.runs_on if check.judged_on(p) and (check.kind == "shape" or p in claim.digits_on))
        assert verdicts.judge(alone, measured, profile, "cuda").verdict == DEVIATES, f"{claim.id}/{check.q} cannot fail"


@pytest.mark.parametrize("claim", list(registry.load().values()), ids=lambda c: c.id)
def test_claim_is_asserted_somewhere_on_a_cpu(claim):
    """A claim whose every check needs CUDA would have no verdict on a laptop."""
    cpu_checks = [c for c in claim.checks if c.requires != "cuda" and (c.kind == "shape" or set(claim.digits_on) & set(claim.runs_on))]
    assert cpu_checks, f"{claim.id}: no check is asserted on a CPU"


def test_tolerances_are_finite_and_explained():
    for claim in registry.load().values():
        for check in claim.checks:
            assert check.why.strip(), f"{claim.id}/{check.q}: no reason for the tolerance"
            assert math.isfinite(check.tol), f"{claim.id}/{check.q}: infinite tolerance"


@pytest.mark.parametrize(
    "entry, problem",
    [
        ('[X]\nsection = "kv_cache"\nstatement = "s"\nbook = {a = 1}\nchecks = [{q = "a", form = "exact"}]', "why"),
        ('[X]\nsection = "kv_cache"\nstatement = "s"\nbook = {a = 1}\nchecks = [{q = "a", form = "rel", why = "w"}]', "finite tol"),
        ('[X]\nsection = "kv_cache"\nstatement = "s"\nbook = {a = 1}\nchecks = [{q = "b", form = "exact", why = "w"}]', "names no book value"),
        ('[X]\nsection = "kv_cache"\nstatement = "s"\nbook = {}\nchecks = [{q = "b", kind = "shape", op = "~", bound = 1, why = "w"}]', "op in"),
        ('[X]\nsection = "NOPE"\nstatement = "s"', "section"),
        ('[X]\nsection = "kv_cache"\nstatement = "s"\nruns_on = ["laptop"]', "unknown profile"),
        ('[X]\nsection = "kv_cache"\nstatement = "s"\nbook = {a = 1}\nruns_on = ["book"]\nchecks = [{q = "a", form = "exact", why = "w", profiles = ["arithmetic"]}]',
         "names profiles the claim does not run on"),
        ('[X]\nsection = "kv_cache"\nstatement = "s"\ntiming = "sometimes"', "timing 'sometimes' is none of clocked, counted"),
        ('[X]\nsection = "kv_cache"\nstatement = "s"', "timing is missing"),
        ('[X]\nsection = "kv_cache"\nstatement = "s"\ntiming = "counted"\nruns_on = ["twin"]\n'
         'checks = [{q = "r", kind = "shape", op = ">", bound = 2.0, noise = "rounds", why = "w"}]', "its check 'r' is read from timing rounds: it is clocked"),
        ('[X]\nsection = "kv_cache"\nstatement = "s"\ntiming = "counted"\nslow = "yes"', "slow 'yes' is not true or false"),
        ('[X]\nsection = "kv_cache"\nstatement = "s"\ntiming = "counted"\nslwo = true', "unknown field 'slwo'"),
    ],
    ids=["no-reason", "no-tolerance", "unknown-value", "unknown-op", "unknown-section", "unknown-profile", "check-off-the-claims-profiles",
         "unknown-timing", "no-timing", "counted-but-noisy", "slow-not-a-bool", "misspelt-field"],
)
def test_malformed_registry_entries_are_rejected(entry, problem):
    with pytest.raises(RegistryError, match=problem):
        registry.parse(entry)


def test_timing_is_declared_and_a_noise_check_implies_clocked():
    noisy = registry.parse('[N]\nsection = "kv_cache"\nstatement = "s"\nruns_on = ["twin"]\nslow = true\n'
                           'checks = [{q = "r", kind = "shape", op = ">", bound = 2.0, noise = "rounds", why = "w"}]')["N"]
    counted = registry.parse('[C]\nsection = "kv_cache"\nstatement = "s"\ntiming = "counted"')["C"]
    assert (noisy.timing, noisy.slow, counted.timing, counted.slow) == ("clocked", True, "counted", False)
    claims = registry.load()
    assert registry.clocked_claims() == {c for c, claim in claims.items() if claim.timing == "clocked"}
    assert {c for c, claim in claims.items() if any(k.noise for k in claim.checks)} < registry.clocked_claims()
    assert {"EVAL-TABLE", "SPEC-EXACT-GREEDY", "KV-SPEEDUP-48"} <= registry.slow_claims() and "KV-MACS" not in registry.slow_claims()


def test_digits_are_reported_not_asserted_off_their_profiles():
    claim = registry.parse(
        '[X]\nsection = "kv_cache"\nstatement = "s"\ntiming = "counted"\nbook = {a = 10.0}\nruns_on = ["stand-in", "book"]\ndigits_on = ["book"]\n'
        'checks = [{q = "a", form = "rel", tol = 0.1, why = "w"}, {q = "r", kind = "shape", op = ">", bound = 1.0, why = "w"}]'
    )["X"]
    assert verdicts.judge(claim, {"a": 50.0, "r": 2.0}, "stand-in").verdict == SHAPE_HOLDS
    assert verdicts.judge(claim, {"a": 50.0, "r": 2.0}, "book").verdict == DEVIATES
    assert verdicts.judge(claim, {"a": 10.5, "r": 2.0}, "book").verdict == REPRODUCED
    assert verdicts.judge(claim, {"a": 10.5}, "book").verdict == DEVIATES, "a missing measured value fails its check"


def test_a_check_with_profiles_is_judged_only_there():
    """The book against itself (arithmetic, from its printed numbers) beside a model's measurement of the same claim."""
    claim = registry.parse(
        '[X]\nsection = "outliers"\nstatement = "s"\ntiming = "counted"\nbook = {total = 896, n = 100}\nruns_on = ["arithmetic", "book"]\n'
        'digits_on = ["arithmetic", "book"]\nchecks = [{q = "total", form = "exact", why = "w"}, '
        '{q = "n", form = "exact", why = "w", profiles = ["book"]}]'
    )["X"]
    assert verdicts.judge(claim, {"total": 896}, "arithmetic").verdict == REPRODUCED, "n is not judged on arithmetic"
    assert verdicts.judge(claim, {"total": 896}, "book").verdict == DEVIATES, "n is judged on the book, and missing"
    assert [o.check.q for o in verdicts.judge(claim, {"total": 856}, "arithmetic").outcomes] == ["total"]


# ------------------------------------------------------------------------------------------------
# a failing measurement of every check type deviates (issue: verdicts that tell the truth)
# ------------------------------------------------------------------------------------------------

_KINDS = registry.parse(
    '[X]\nsection = "kv_cache"\nstatement = "s"\ntiming = "counted"\nruns_on = ["twin"]\ndigits_on = ["twin"]\n'
    'book = {exact = 12288, flag = true, rel = 10.0, abs = 1.0, more = 10.0, some = [2, 3]}\n'
    "checks = ["
    '{q = "exact", form = "exact", why = "w"}, {q = "flag", form = "exact", why = "w"},'
    '{q = "rel", form = "rel", tol = 0.1, why = "w"}, {q = "abs", form = "abs", tol = 0.5, why = "w"},'
    '{q = "more", form = "bound", op = ">", why = "w"}, {q = "some", form = "one_of", why = "w"},'
    '{q = "shape", kind = "shape", op = ">", bound = 1.0, why = "w"}]'
)["X"]
_GOOD = {"exact": 12288, "flag": True, "rel": 10.5, "abs": 1.4, "more": 17.4, "some": 3, "shape": 2.0}


def test_a_passing_measurement_of_every_check_type_reproduces():
    assert verdicts.judge(_KINDS, _GOOD, "twin").verdict == REPRODUCED


@pytest.mark.parametrize(
    "q, bad",
    [
        ("exact", 12289), ("exact", 12288.5), ("flag", False), ("flag", 1), ("rel", 11.5), ("rel", "10"),
        ("abs", 1.6), ("more", 10.0), ("more", 9), ("some", 4), ("some", 2.5), ("shape", 0.99), ("shape", True),
        *[(q, v) for q in _GOOD for v in (float("nan"), float("inf"), float("-inf"), "nan", "inf", None)],
    ],
    ids=repr,
)
def test_a_failing_measurement_of_every_check_type_deviates(q, bad):
    """Exact, boolean, rel, abs, bound, one_of and shape checks, and NaN/inf/missing for each: deviates, no crash."""
    judged = verdicts.judge(_KINDS, {**_GOOD, q: bad}, "twin")
    assert judged.verdict == DEVIATES, f"{q} = {bad!r} gave {judged.verdict}"
    assert [o.check.q for o in judged.failures] == [q]
    assert judged.messages(), "a deviation says why"


def test_a_failing_measurement_deviates_through_the_recorder_too():
    """The recorder records the failure as `deviates` (a failing boolean is not turned into 'not run')."""
    rec = record.Recorder()
    claim = registry.get("KV-IDENTITY")
    result, judged = rec.verify(claim.id, "twin", "cpu", {"identical": False})
    assert result.verdict == judged.verdict == DEVIATES
    result, _ = rec.verify("KV-BYTES-FORMULA", "arithmetic", "cpu", {"bytes_per_token": float("nan")})
    assert result.verdict == DEVIATES and result.measured["bytes_per_token"] == "nan"


def test_a_perturbed_judgement_carries_its_perturbed_claim_judged_once(monkeypatch):
    """``--perturb ID``: the recorder perturbs the claim once, and the judgement's messages quote the moved book value."""
    calls = []
    real = verdicts.perturb
    monkeypatch.setattr(verdicts, "perturb", lambda claim, measured: calls.append(claim.id) or real(claim, measured))
    rec = record.Recorder(perturb=["KV-BYTES-FORMULA"])
    result, judged = rec.verify("KV-BYTES-FORMULA", "arithmetic", "cpu", {"bytes_per_token": 12_288})
    assert calls == ["KV-BYTES-FORMULA"] and result.perturbed and judged.verdict == DEVIATES
    moved = judged.claim.book["bytes_per_token"]
    assert moved != 12_288 and judged.measured == {"bytes_per_token": 12_288}
    assert numbers.fmt(moved) in judged.messages()[0]


_ERRATUM = (
    '[E]\nsection = "batching"\nstatement = "s"\ntiming = "counted"\nruns_on = ["twin", "book"]\ndigits_on = ["twin", "book"]\n'
    "book = {speedup = 1.6, other = 2.0}\n"
    'source = {speedup = {printed = "1.6x"}, other = {derived = "1.6 + 0.4", from = ["speedup"]}}\n'
    'checks = [{q = "speedup", form = "rel", tol = 0.1, why = "w"}, {q = "other", form = "rel", tol = 0.1, why = "w"},'
    '{q = "r", kind = "shape", op = ">", bound = 1.0, why = "w"}]\n'
    '[E.erratum]\nsays = "1.6x"\nholds = "2.8x"\nassumption = "a"\nfails = ["speedup"]\nstands_on = ["speedup"]\nprofiles = ["twin"]\n'
    'grade = "erratum"\n'
)


def test_a_confirmed_erratum_is_green_while_its_digits_fail_as_documented():
    claim = registry.parse(_ERRATUM)["E"]
    assert verdicts.judge(claim, {"speedup": 2.8, "other": 2.0, "r": 2.0}, "twin").verdict == vocabulary.ERRATUM


def test_a_confirmed_erratum_turns_red_when_its_digits_reproduce():
    """Strict, like xfail(strict=True): the day the book's number holds, the entry must be revisited."""
    claim = registry.parse(_ERRATUM)["E"]
    judged = verdicts.judge(claim, {"speedup": 1.6, "other": 2.0, "r": 2.0}, "twin")
    assert judged.verdict == DEVIATES and judged.stale
    assert "no longer holds" in judged.messages()[0]


def test_a_confirmed_erratum_does_not_hide_another_failure():
    claim = registry.parse(_ERRATUM)["E"]
    assert verdicts.judge(claim, {"speedup": 2.8, "other": 2.0, "r": 0.5}, "twin").verdict == DEVIATES
    assert verdicts.judge(claim, {"speedup": 2.8, "other": 5.0, "r": 2.0}, "twin").verdict == DEVIATES


_TWO_ERRATA = _ERRATUM.replace("[E.erratum]", "[[E.erratum]]") + (
    '[[E.erratum]]\nsays = "2.0"\nholds = "2.5"\nassumption = "b"\nfails = ["other"]\nstands_on = ["speedup"]\nprofiles = ["twin"]\n'
    'grade = "translation"\n'
)


def test_several_errata_of_one_claim_each_document_their_own_checks():
    claim = registry.parse(_TWO_ERRATA)["E"]
    assert [e.grade for e in claim.errata] == ["erratum", "translation"] and claim.erratum is claim.errata[0]
    assert verdicts.judge(claim, {"speedup": 2.8, "other": 2.5, "r": 2.0}, "twin").verdict == vocabulary.ERRATUM
    # the second erratum's digits reproduce: stale, red, while the first still holds
    judged = verdicts.judge(claim, {"speedup": 2.8, "other": 2.0, "r": 2.0}, "twin")
    assert judged.verdict == DEVIATES and [o.check.q for o in judged.stale] == ["other"]


def test_a_check_documented_by_two_errata_is_refused():
    text = _TWO_ERRATA.replace('fails = ["other"]', 'fails = ["speedup"]')
    with pytest.raises(registry.RegistryError, match="more than one erratum"):
        registry.parse(text)


def test_a_confirmed_erratum_does_not_cover_the_book_profile():
    """Book-profile digits that fail on real weights stay red until the erratum is confirmed there."""
    claim = registry.parse(_ERRATUM)["E"]
    assert verdicts.judge(claim, {"speedup": 2.8, "other": 2.0, "r": 2.0}, "book").verdict == DEVIATES


@pytest.mark.parametrize(
    "change, problem",
    [
        (("stands_on = [\"speedup\"]", "stands_on = [\"other\"]"), "printed"),
        (("fails = [\"speedup\"]", "fails = [\"r\"]"), "no digits check"),
        (("assumption = \"a\"\n", ""), "assumption"),
        (("{printed = \"1.6x\"}", "{reading = \"1.6x\"}"), "why"),
        (("from = [\"speedup\"]", "from = []"), "from"),
    ],
    ids=["stands-on-a-derivation", "fails-a-shape", "no-assumption", "reading-without-why", "derivation-without-inputs"],
)
def test_malformed_errata_and_sources_are_rejected(change, problem):
    with pytest.raises(RegistryError, match=problem):
        registry.parse(_ERRATUM.replace(*change))


_API_ERRATUM = _ERRATUM + 'applies = { transformers = ">=5" }\n'


@pytest.mark.parametrize(("transformers", "expected"), [("5.24.0", vocabulary.ERRATUM), ("4.57.6", DEVIATES)])
def test_an_erratum_about_an_api_holds_only_on_the_releases_it_names(transformers, expected):
    """KV-API's kind: the book's spelling is deprecated from transformers 5 on; on 4.x the digits are asserted as printed."""
    claim = registry.parse(_API_ERRATUM)["E"]
    judged = verdicts.judge(claim, {"speedup": 2.8, "other": 2.0, "r": 2.0}, "twin", versions={"transformers": transformers})
    assert judged.verdict == expected
    printed = verdicts.judge(claim, {"speedup": 1.6, "other": 2.0, "r": 2.0}, "twin", versions={"transformers": transformers})
    assert printed.verdict == (DEVIATES if expected == vocabulary.ERRATUM else vocabulary.REPRODUCED)


@pytest.mark.parametrize("grade, message", [(None, "erratum needs 'grade'"), ("typo", "grade 'typo' is none of")])
def test_an_erratum_without_a_known_grade_is_rejected(grade, message):
    text = _ERRATUM.replace('grade = "erratum"\n', "" if grade is None else f'grade = "{grade}"\n')
    with pytest.raises(RegistryError, match=message):
        registry.parse(text)


def test_an_erratum_range_that_is_no_version_specifier_is_rejected():
    with pytest.raises(RegistryError, match="no version specifier"):
        registry.parse(_ERRATUM + 'applies = { transformers = "five or later" }\n')


# ------------------------------------------------------------------------------------------------
# inconclusive: a margin within the noise, a search that ran out of range
# ------------------------------------------------------------------------------------------------

_NOISY = (
    '[N]\nsection = "kv_cache"\nstatement = "s"\nruns_on = ["twin"]\ndigits_on = []\n'
    'checks = [{q = "speedup", kind = "shape", op = ">", bound = 2.0, noise = "rounds", why = "w"},'
    '{q = "found", kind = "shape", op = "==", bound = true, searched = true, why = "w"},'
    '{q = "rows", kind = "shape", op = "==", bound = 1, why = "w"}]\n'
)


@pytest.mark.parametrize(("speedup", "se", "expected"), [
    (3.5, 0.4, SHAPE_HOLDS),                     # 1.5 above the bound: 3.75 standard errors
    (2.5, 0.4, vocabulary.INCONCLUSIVE),           # 0.5 above: 1.25 standard errors, passes but cannot decide
    (1.5, 0.4, vocabulary.INCONCLUSIVE),           # 0.5 below: fails but cannot decide
    (0.5, 0.4, DEVIATES),                        # 1.5 below: 3.75 standard errors
    (2.5, None, SHAPE_HOLDS),                    # no standard error handed: decides as an ordinary check
    (1.5, None, DEVIATES),
    (2.5, float("inf"), vocabulary.INCONCLUSIVE),  # a noise that could not be estimated decides nothing
])
def test_a_noisy_check_decides_only_beyond_three_standard_errors(speedup, se, expected):
    claim = registry.parse(_NOISY)["N"]
    measured = {"speedup": speedup, "found": True, "rows": 1, **({"speedup_se": se} if se is not None else {})}
    judged = verdicts.judge(claim, measured, "twin")
    assert judged.verdict == expected
    if expected == vocabulary.INCONCLUSIVE:
        message = judged.inconclusive_messages()[0]
        assert "standard errors" in message and "quieter machine" in message


_LIMIT = _NOISY.replace('why = "w"},', 'why = "w"}, {q = "gain", kind = "shape", op = "<=", bound = 2.0, noise = "rounds", limit = true, why = "w"},', 1)


@pytest.mark.parametrize(("gain", "se", "expected"), [
    (1.5, 0.1, SHAPE_HOLDS),             # below the limit, decided
    (1.95, 0.1, SHAPE_HOLDS),            # at the limit within the noise: a right measurement may sit there, never inconclusive
    (2.2, 0.1, SHAPE_HOLDS),             # above it by 2 standard errors: no evidence beyond the limit
    (2.4, 0.1, DEVIATES),                # above it by 4 standard errors: beyond what any right measurement gives
    (2.4, float("inf"), SHAPE_HOLDS),    # a noise that could not be estimated shows nothing beyond the limit
    (2.4, None, DEVIATES),               # no standard error handed: decides as an ordinary check
])
def test_a_limit_passes_within_its_noise_and_fails_only_beyond_it(gain, se, expected):
    claim = registry.parse(_LIMIT)["N"]
    measured = {"speedup": 4.0, "speedup_se": 0.1, "found": True, "rows": 1, "gain": gain, **({"gain_se": se} if se is not None else {})}
    assert verdicts.judge(claim, measured, "twin").verdict == expected


def test_a_limit_without_noise_is_rejected():
    with pytest.raises(registry.RegistryError, match="noisy check 'gain'"):
        registry.parse(_NOISY.replace('why = "w"},', 'why = "w"}, {q = "gain", kind = "shape", op = "<=", bound = 2.0, limit = true, why = "w"},', 1))


@pytest.mark.parametrize(("found", "expected"), [(True, SHAPE_HOLDS), (False, vocabulary.INCONCLUSIVE), (None, DEVIATES)])
def test_a_searched_existence_not_found_is_inconclusive_and_a_missing_one_fails(found, expected):
    claim = registry.parse(_NOISY)["N"]
    measured = {"speedup": 4.0, "speedup_se": 0.1, "found": found, "rows": 1, "searched_up_to": 512}
    judged = verdicts.judge(claim, measured, "twin")
    assert judged.verdict == expected
    if expected == vocabulary.INCONCLUSIVE:
        assert "searched_up_to = 512" in judged.inconclusive_messages()[0]


def test_inconclusive_never_hides_a_decided_failure():
    claim = registry.parse(_NOISY)["N"]
    assert verdicts.judge(claim, {"speedup": 2.1, "speedup_se": 1.0, "found": False, "rows": 4}, "twin").verdict == DEVIATES


def test_a_perturbed_noisy_check_fails_beyond_its_noise():
    """--perturb moves a noisy bound beyond three standard errors: it proves the comparator even for a noisy value."""
    claim = registry.parse(_NOISY)["N"]
    measured = {"speedup": 2.5, "speedup_se": 5.0, "found": True, "rows": 1}
    assert verdicts.judge(verdicts.perturb(claim, measured), measured, "twin").verdict == DEVIATES


_FOUND = (
    '[F]\nsection = "batching"\nstatement = "s"\nruns_on = ["twin"]\ndigits_on = []\n'
    'checks = [{q = "found", kind = "shape", op = "==", bound = true, searched = true, why = "w"},'
    '{q = "gain", kind = "shape", op = ">", bound = 1.6, noise = "rounds", when_found = "found", why = "w"},'
    '{q = "rows", kind = "shape", op = "==", bound = 1, why = "w"}]\n'
)


@pytest.mark.parametrize(("measured", "expected"), [
    ({"found": True, "gain": 1.9, "gain_se": 0.05}, SHAPE_HOLDS),
    ({"found": True, "gain": 1.2, "gain_se": 0.05}, DEVIATES),  # found, and what was found fails beyond its noise
    ({"found": False, "gain": float("nan"), "gain_se": float("inf")}, vocabulary.INCONCLUSIVE),  # nothing found: nothing to judge
])
def test_a_check_on_what_was_searched_for_is_judged_only_where_it_was_found(measured, expected):
    claim = registry.parse(_FOUND)["F"]
    judged = verdicts.judge(claim, {**measured, "rows": 1, "searched_up_to": 512}, "twin")
    assert judged.verdict == expected
    assert next(o for o in judged.outcomes if o.check.q == "gain").asserted == measured["found"]


def test_a_check_measured_when_something_is_found_must_name_a_search_or_a_premise():
    with pytest.raises(RegistryError, match="no searched or measurable check"):
        registry.parse('[X]\nsection = "kv_cache"\nstatement = "s"\nruns_on = ["twin"]\nchecks = [{q = "x", kind = "shape", op = ">", bound = 1.0, '
                       'when_found = "found", why = "w"}]\n')


@pytest.mark.parametrize("check, problem", [
    ('{q = "x", kind = "shape", op = "==", bound = 1.0, noise = "rounds", why = "w"}', "noisy check"),
    ('{q = "x", kind = "shape", op = ">", bound = 1.0, noise = "guess", why = "w"}', "noisy check"),
    ('{q = "x", kind = "shape", op = ">", bound = 1.0, searched = true, why = "w"}', "searched check"),
    ('{q = "x", kind = "shape", op = "==", bound = 1, measurable = true, why = "w"}', "measurable check"),
    ('{q = "x", kind = "shape", op = "==", bound = true, measurable = true, searched = true, why = "w"}', "measurable check"),
])
def test_malformed_noisy_and_searched_checks_are_rejected(check, problem):
    with pytest.raises(RegistryError, match=problem):
        registry.parse(f'[X]\nsection = "kv_cache"\nstatement = "s"\nruns_on = ["twin"]\nchecks = [{check}]\n')


_PREMISE = (
    '[P]\nsection = "batching"\nstatement = "s"\ntiming = "counted"\nruns_on = ["twin"]\ndigits_on = []\n'
    'checks = [{q = "pairs", kind = "shape", op = "==", bound = 0, why = "w"},'
    '{q = "premise", kind = "shape", op = "==", bound = true, measurable = true, why = "w"}]\n'
)


@pytest.mark.parametrize(("pairs", "premise", "verdict"), [
    (0, True, SHAPE_HOLDS),
    (0, False, vocabulary.INCONCLUSIVE),  # the device cannot measure the premise: decides nothing
    (2, False, DEVIATES),               # a pair the probe does not explain fails whatever else this device cannot measure
    (0, None, DEVIATES),                # a probe that reported nothing is a broken measurement
])
def test_a_premise_this_device_cannot_measure_is_inconclusive_with_its_reason(pairs, premise, verdict):
    claim = registry.parse(_PREMISE)["P"]
    measured = {"pairs": pairs, **({"premise": premise} if premise is not None else {}), "premise_why": "the kernel is faster at 2 rows than at 1"}
    judged = verdicts.judge(claim, measured, "twin")
    assert judged.verdict == verdict
    if verdict == vocabulary.INCONCLUSIVE:
        assert "cannot measure it: the kernel is faster at 2 rows than at 1" in judged.inconclusive_messages()[0]
    perturbed = verdicts.perturb(claim, measured)  # --perturb proves the comparator: never inconclusive there
    if premise is not None:
        assert verdicts.judge(perturbed, measured, "twin").verdict == DEVIATES


_GATED = (
    '[G]\nsection = "quantization"\nstatement = "s"\nruns_on = ["twin"]\ndigits_on = []\n'
    'checks = [{q = "premise", kind = "shape", op = "==", bound = true, measurable = true, why = "w"},'
    '{q = "speedup", kind = "shape", op = ">=", bound = 1.25, noise = "rounds", when_found = "premise", why = "w"},'
    '{q = "over", kind = "shape", op = "<=", bound = 1.0, why = "w"}]\n'
)


@pytest.mark.parametrize(("premise", "speedup", "over", "verdict"), [
    (True, 1.9, 0.4, SHAPE_HOLDS),
    (True, 0.9, 0.4, DEVIATES),                 # the premise held, and the claim fails on it
    (False, 0.9, 0.4, vocabulary.INCONCLUSIVE),   # the premise does not hold here: the speedup is reported, not asserted
    (False, 0.9, 4071.0, DEVIATES),             # a check the premise does not gate still fails
])
def test_a_check_gated_by_a_premise_is_asserted_only_where_the_premise_holds(premise, speedup, over, verdict):
    claim = registry.parse(_GATED)["G"]
    measured = {"premise": premise, "premise_why": "the kernels are bound by their arithmetic", "speedup": speedup, "speedup_se": 0.05, "over": over}
    judged = verdicts.judge(claim, measured, "twin")
    assert judged.verdict == verdict
    assert next(o for o in judged.outcomes if o.check.q == "speedup").asserted == premise


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_clocked_claim_gives_its_timing_one_bound_per_noisy_quantity(device):
    """The timing spends extra rounds while a noisy check is within its noise (fixtures.profiles.noisy_bounds): one bound
    per quantity, per claim and for the claims the batch curve times together. A limit is decided within its noise
    (it passes there), so it asks for no rounds and may bound a quantity from the other side."""
    from cheapinfer.chapter.batching.batch_curve import CURVE_CLAIMS
    from fixtures.profiles import noisy_bounds

    for claim_id in registry.load():
        noisy_bounds((claim_id,), device)
    bounds = noisy_bounds(CURVE_CLAIMS, device)
    assert bounds["gain_before_knee"] == 1.5
