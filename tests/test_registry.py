"""The registry itself: coverage of the chapter's catalog, one test per claim, and falsifiability."""

import math
import re
from pathlib import Path

import pytest

from cheapinfer import registry
from cheapinfer import record
from cheapinfer.registry import DEVIATES, REPRODUCED, SHAPE_HOLDS, RegistryError

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


def test_every_claim_has_exactly_one_test_function():
    tested = record.tested_ids(ROOT / "claims")
    missing = [cid for cid in registry.load() if cid not in tested]
    twice = {cid: files for cid, files in tested.items() if len(files) > 1}
    unknown = set(tested) - set(registry.load())
    assert not unknown, f"tests name claims the registry lacks: {sorted(unknown)}"
    assert not twice, f"claims with more than one test function: {twice}"
    assert not missing, f"claims without a test: {missing}"


def _passing_value(check, book):
    """A measurement that satisfies ``check`` exactly at the book's value or just inside the bound."""
    if check.kind == "digits":
        return book[check.q]
    b = check.bound
    if isinstance(b, bool) or not isinstance(b, (int, float)):
        return b
    step = max(abs(b) * 1e-3, 1e-6)
    return {">": b + step, ">=": b, "<": b - step, "<=": b, "==": b}[check.op]


def _claims_with_tests():
    tested = record.tested_ids(ROOT / "claims")
    return [c for c in registry.load().values() if c.id in tested]


@pytest.mark.parametrize("claim", _claims_with_tests(), ids=lambda c: c.id)
def test_claim_turns_red_when_its_book_value_moves_beyond_tolerance(claim):
    """Every check of every tested claim can fail: a passing measurement stops passing once the
    registry's value moves beyond its tolerance (STYLE habit 9)."""
    assert claim.checks, f"{claim.id} has a test but no checks: its verdict could never be 'deviates'"
    # the book's own values first: where a shape check names the same quantity, the book must satisfy it too
    measured = {c.q: claim.book[c.q] for c in claim.checks if c.kind == "digits"}
    measured.update({c.q: _passing_value(c, claim.book) for c in claim.checks if c.kind == "shape" and c.q not in measured})
    for profile in claim.runs_on:
        base = registry.judge(claim, measured, profile, "cuda")
        assert base.verdict in (REPRODUCED, SHAPE_HOLDS), f"{claim.id} on {profile}: {[o.message(claim) for o in base.failures]}"
        moved = registry.judge(registry.perturb(claim, measured), measured, profile, "cuda")
        assert moved.verdict == DEVIATES, f"{claim.id} on {profile}: still {moved.verdict} after moving the book values"
    # each check on its own flips as well: no check hides behind another
    for check in claim.checks:
        if check.kind == "digits" and not set(claim.digits_on) & set(claim.runs_on):
            continue
        alone = registry.perturb(registry.Claim(**{**claim.__dict__, "checks": (check,)}), measured)
        profile = next(p for p in claim.runs_on if check.kind == "shape" or p in claim.digits_on)
        assert registry.judge(alone, measured, profile, "cuda").verdict == DEVIATES, f"{claim.id}/{check.q} cannot fail"


@pytest.mark.parametrize("claim", _claims_with_tests(), ids=lambda c: c.id)
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
        ('[X]\nsection = "KV"\nstatement = "s"\nbook = {a = 1}\nchecks = [{q = "a", form = "exact"}]', "why"),
        ('[X]\nsection = "KV"\nstatement = "s"\nbook = {a = 1}\nchecks = [{q = "a", form = "rel", why = "w"}]', "finite tol"),
        ('[X]\nsection = "KV"\nstatement = "s"\nbook = {a = 1}\nchecks = [{q = "b", form = "exact", why = "w"}]', "names no book value"),
        ('[X]\nsection = "KV"\nstatement = "s"\nbook = {}\nchecks = [{q = "b", kind = "shape", op = "~", bound = 1, why = "w"}]', "op in"),
        ('[X]\nsection = "NOPE"\nstatement = "s"', "section"),
        ('[X]\nsection = "KV"\nstatement = "s"\nruns_on = ["laptop"]', "unknown profile"),
    ],
    ids=["no-reason", "no-tolerance", "unknown-value", "unknown-op", "unknown-section", "unknown-profile"],
)
def test_malformed_registry_entries_are_rejected(entry, problem):
    with pytest.raises(RegistryError, match=problem):
        registry.parse(entry)


def test_digits_are_reported_not_asserted_off_their_profiles():
    claim = registry.parse(
        '[X]\nsection = "KV"\nstatement = "s"\nbook = {a = 10.0}\nruns_on = ["stand-in", "book"]\ndigits_on = ["book"]\n'
        'checks = [{q = "a", form = "rel", tol = 0.1, why = "w"}, {q = "r", kind = "shape", op = ">", bound = 1.0, why = "w"}]'
    )["X"]
    assert registry.judge(claim, {"a": 50.0, "r": 2.0}, "stand-in").verdict == SHAPE_HOLDS
    assert registry.judge(claim, {"a": 50.0, "r": 2.0}, "book").verdict == DEVIATES
    assert registry.judge(claim, {"a": 10.5, "r": 2.0}, "book").verdict == REPRODUCED
    assert registry.judge(claim, {"a": 10.5}, "book").verdict == DEVIATES, "a missing measured value fails its check"
