"""Every rule of ``compare`` in both directions: a lower bound and an upper one, a rise and a drop, a range, with and
without a standard error, with and without reruns, and the move that stays within its tolerance beside each.

The records are the smallest ones ``compare`` reads: one claim, one profile, one quantity ``x`` with the checks given
(the registry's spec as a record holds it), so that each case names its rule and nothing else moves. Each case gives
the outcome ``compare`` must reach: ``REGRESSION`` (exit 1), ``CHANGE`` (printed, exit 0), ``HELD`` (a clocked value that
moved toward its bound beyond each run's noise but still holds it, on one run per side: a change that asks for reruns)
or ``NONE`` (nothing printed). :func:`every_rule` holds them all; under each fault of ``cheapinfer.faults.records`` on
``compare`` it fails (:func:`test_each_compare_fault_turns_the_rules_red`).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from cheapinfer.faults.records import COMPARE, RECORD_FAULTS
from cheapinfer.harness import compare as cmp
from cheapinfer.harness import schema
from cheapinfer.harness.vocabulary import DEVIATES, ERRATUM, ERROR_REASON, INCONCLUSIVE, NOT_RUN, REPRODUCED, SHAPE_HOLDS

CID, Q, PROFILE = "X-RULE", "x", "p"
REGRESSION, CHANGE, HELD, NONE = "regression", "change", "held, rerun to decide", "nothing"


def shape(op: str, bound: Any) -> dict[str, Any]:
    return {"q": Q, "kind": "shape", "op": op, "bound": bound, "why": "-"}


def digits(form: str, tol: float = 0.0, op: str = "") -> dict[str, Any]:
    return {"q": Q, "kind": "digits", "form": form, "tol": tol, "why": "-", **({"op": op} if op else {})}


LOWER = {">": [shape(">", 1.0)], ">=": [shape(">=", 1.0)]}  # x above 1
UPPER = {"<": [shape("<", 4.0)], "<=": [shape("<=", 4.0)]}  # x below 4
RANGE = [shape(">", 1.0), shape("<", 4.0)]  # 1 < x < 4: each move goes toward one side


def record(value: Any, checks: list[dict[str, Any]], *, se: float | None = None, verdict: str = SHAPE_HOLDS, book: Any = None,
           asserted: bool = True, run: str = "a", **result: Any) -> dict[str, Any]:
    """A record of claim ``CID`` with one result on ``PROFILE``: ``x`` measured ``value`` (with standard error ``se``)."""
    check = {"q": Q, "measured": value, "asserted": asserted, **({"se": se} if se is not None else {})}
    entry = {"profile": PROFILE, "verdict": verdict, "checks": [check] if verdict != NOT_RUN else [], **result}
    claim = {"verdict": verdict, "book": {} if book is None else {Q: book}, "checks": checks, "results": [entry]}
    return {"schema": schema.RUN_SCHEMA, "suite": "cheapinfer test", "run": {"id": run}, "environment": {}, "claims": {CID: claim}}


def outcome(before: dict, after: dict, reruns: tuple[list, list] = ([], [])) -> str:
    """What ``compare`` makes of the move from ``before`` to ``after``."""
    changes = cmp.compare(before, after, reruns=reruns)
    if not changes:
        return NONE
    assert len(changes) == 1, [c.line() for c in changes]
    [c] = changes
    return REGRESSION if c.regression else HELD if c.reason == cmp.BETWEEN_PROCESSES_REASON else CHANGE


def moved(checks: list[dict[str, Any]], a: Any, b: Any, **kw: Any) -> Callable[[], str]:
    return lambda: outcome(record(a, checks, **kw), record(b, checks, **kw))


def processes(checks: list[dict[str, Any]], xs: tuple[float, ...], ys: tuple[float, ...]) -> Callable[[], str]:
    """Three processes a side (the first the primary record, the others its reruns), each with a small standard error."""
    def run() -> str:
        (a, *more_a), (b, *more_b) = ([record(v, checks, se=0.05, run=f"{side}{i}") for i, v in enumerate(vs)] for side, vs in (("a", xs), ("b", ys)))
        return outcome(a, b, (more_a, more_b))
    return run


def verdict_moved(a: str, b: str, **after: Any) -> Callable[[], str]:
    return lambda: outcome(record(2.0, LOWER[">"], verdict=a), record(2.0, LOWER[">"], verdict=b, **after))


CASES: dict[str, tuple[Callable[[], str], str]] = {}
# A shape bound, one run per side, no standard error: beyond the band (25%) toward the bound is a regression, away
# from it a change, within it nothing. Each case for each op of its side.
# (side, its checks by op, the move toward it, the move across it, the move away from it, its words for them)
SIDES = (("lower", LOWER, (2.0, 1.2), (1.5, 0.5), (2.0, 3.0), ("drop", "rise")),
         ("upper", UPPER, (2.0, 3.0), (3.5, 5.0), (2.0, 1.2), ("rise", "drop")))
for side, by_op, toward, across, away, (to, fro) in SIDES:
    for op, checks in by_op.items():
        CASES |= {
            f"{side} {op}: a {to} toward it": (moved(checks, *toward), REGRESSION),
            f"{side} {op}: a {to} across it": (moved(checks, *across), REGRESSION),
            f"{side} {op}: a {fro} away from it": (moved(checks, *away), CHANGE),
            f"{side} {op}: a drop within the band": (moved(checks, 2.0, 1.6), NONE),
            f"{side} {op}: a rise within the band": (moved(checks, 2.0, 2.4), NONE),
            f"{side} {op}: a {to} toward it, only reported": (moved(checks, *toward, asserted=False), CHANGE),
        }
CASES |= {
    "range: a rise toward its upper side": (moved(RANGE, 2.0, 3.0), REGRESSION),
    "range: a drop toward its lower side": (moved(RANGE, 3.0, 2.0), REGRESSION),
    "range: a rise within the band": (moved(RANGE, 2.0, 2.4), NONE),
    "range: a drop within the band": (moved(RANGE, 2.4, 2.0), NONE),
    "range of another profile: one-sided here": (moved([{**shape("<", 4.0), "profiles": ["q"]}, shape(">", 1.0)], 2.0, 3.0), CHANGE),
    "== a number: a rise beyond the band": (moved([shape("==", 2.0)], 2.0, 3.0), REGRESSION),
    "== a number: a drop beyond the band": (moved([shape("==", 2.0)], 2.0, 1.0), REGRESSION),
    "== a number: a rise within the band": (moved([shape("==", 2.0)], 2.0, 2.4), NONE),
    "== true: true to false": (moved([shape("==", True)], True, False), REGRESSION),
    "== true: false to true": (moved([shape("==", True)], False, True), REGRESSION),
    "a finite value turns infinite": (moved(LOWER[">"], 2.0, "inf"), REGRESSION),
    "an infinite value turns finite": (moved(LOWER[">"], "inf", 2.0), REGRESSION),
    "a value first measured (nan before)": (moved(LOWER[">"], "nan", 0.5), CHANGE),
    "a value no longer measured (nan after)": (moved(LOWER[">"], 2.0, "nan"), CHANGE),
}
# A clocked value with its standard error in both runs, one run per side: it moves only beyond 3 combined standard
# errors too; toward its bound while it holds it is a change that asks for reruns, across the bound a regression.
for side, checks, toward, across, away in (("lower", LOWER[">"], 1.2, 0.5, 3.0), ("upper", UPPER["<"], 3.0, 5.0, 1.2)):
    CASES |= {
        f"clocked {side}: toward it, still held": (moved(checks, 2.0, toward, se=0.05), HELD),
        f"clocked {side}: across it": (moved(checks, 2.0, across, se=0.05), REGRESSION),
        f"clocked {side}: away from it": (moved(checks, 2.0, away, se=0.05), CHANGE),
        f"clocked {side}: toward it, within the noise": (moved(checks, 2.0, toward, se=0.5), NONE),
    }
# Reruns on both sides: the processes' means, Welch's t-test at 0.27% and the band decide; toward the bound is a
# regression whether or not the bound still holds.
CASES |= {
    "reruns lower: a drop toward it": (processes(LOWER[">"], (2.0, 2.1, 1.9), (1.3, 1.4, 1.2)), REGRESSION),
    "reruns lower: a rise away from it": (processes(LOWER[">"], (1.3, 1.4, 1.2), (2.0, 2.1, 1.9)), CHANGE),
    "reruns upper: a rise toward it": (processes(UPPER["<"], (2.0, 2.1, 1.9), (3.0, 3.1, 2.9)), REGRESSION),
    "reruns upper: a drop away from it": (processes(UPPER["<"], (3.0, 3.1, 2.9), (2.0, 2.1, 1.9)), CHANGE),
    "reruns range: a rise toward its upper side": (processes(RANGE, (2.0, 2.1, 1.9), (3.0, 3.1, 2.9)), REGRESSION),
    "reruns range: a drop toward its lower side": (processes(RANGE, (3.0, 3.1, 2.9), (2.0, 2.1, 1.9)), REGRESSION),
    "reruns: a move within the spread between processes": (processes(UPPER["<"], (2.0, 3.4, 1.5), (3.0, 1.4, 3.2)), NONE),
    "reruns: a move within the band": (processes(UPPER["<"], (2.0, 2.1, 1.9), (2.3, 2.4, 2.2)), NONE),
}
# A digits check moves by its own tolerance, up or down alike (around the book's 10).
for form, tol, inside, beyond in (("abs", 0.5, 0.4, 0.6), ("rel", 0.1, 0.9, 1.1)):  # rel: 0.1 x the book's 10
    CASES |= {
        f"digits {form}: a rise beyond its tolerance": (moved([digits(form, tol)], 10.0, 10.0 + beyond, book=10.0), REGRESSION),
        f"digits {form}: a drop beyond its tolerance": (moved([digits(form, tol)], 10.0, 10.0 - beyond, book=10.0), REGRESSION),
        f"digits {form}: a rise within its tolerance": (moved([digits(form, tol)], 10.0, 10.0 + inside, book=10.0), NONE),
        f"digits {form}: a drop within its tolerance": (moved([digits(form, tol)], 10.0, 10.0 - inside, book=10.0), NONE),
    }
CASES |= {
    "digits exact: a rise by one": (moved([digits("exact")], 12_288, 12_289, book=12_288), REGRESSION),
    "digits exact: a drop by one": (moved([digits("exact")], 12_288, 12_287, book=12_288), REGRESSION),
    "digits exact: unchanged": (moved([digits("exact")], 12_288, 12_288, book=12_288), NONE),
    "digits one_of: another of the set": (moved([digits("one_of")], 2, 3, book=[2, 3]), REGRESSION),
    "printed bound >: a drop toward it": (moved([digits("bound", op=">")], 20.0, 12.0, book=10.0), REGRESSION),
    "printed bound >: a rise away from it": (moved([digits("bound", op=">")], 20.0, 30.0, book=10.0), CHANGE),
    "printed bound <: a rise toward it": (moved([digits("bound", op="<")], 5.0, 8.0, book=10.0), REGRESSION),
    "printed bound <: a drop away from it": (moved([digits("bound", op="<")], 8.0, 5.0, book=10.0), CHANGE),
}
# Verdicts: a passing or undecided result that breaks is a regression; the way back is a change.
CASES |= {
    "verdict reproduced -> deviates": (verdict_moved(REPRODUCED, DEVIATES), REGRESSION),
    "verdict deviates -> reproduced": (verdict_moved(DEVIATES, REPRODUCED), CHANGE),
    "verdict erratum -> deviates": (verdict_moved(ERRATUM, DEVIATES), REGRESSION),
    "verdict deviates -> erratum": (verdict_moved(DEVIATES, ERRATUM), CHANGE),
    "verdict inconclusive -> deviates": (verdict_moved(INCONCLUSIVE, DEVIATES), REGRESSION),
    "verdict deviates -> inconclusive": (verdict_moved(DEVIATES, INCONCLUSIVE), CHANGE),
    "verdict shape holds -> inconclusive": (verdict_moved(SHAPE_HOLDS, INCONCLUSIVE), CHANGE),
    "verdict shape holds -> harness error": (verdict_moved(SHAPE_HOLDS, NOT_RUN, reason="raised", harness_error=True), REGRESSION),
    "verdict shape holds -> harness error (schema 1 reason)": (lambda: outcome(record(2.0, LOWER[">"]), schema.upgrade(
        record(2.0, LOWER[">"], verdict=NOT_RUN, reason=f"{schema.SCHEMA_1_ERROR_PREFIX}: ImportError") | {"schema": 1})), REGRESSION),
    "verdict shape holds -> not run, its reason's words only (schema 2)": (verdict_moved(SHAPE_HOLDS, NOT_RUN, reason=f"{ERROR_REASON}: ImportError"), CHANGE),
    "verdict shape holds -> skipped": (verdict_moved(SHAPE_HOLDS, NOT_RUN, reason="needs a CUDA device"), CHANGE),
    "verdict harness error -> shape holds": (lambda: outcome(record(2.0, [], verdict=NOT_RUN, reason="raised", harness_error=True),
                                                              record(2.0, [])), CHANGE),
    "a claim vanished": (lambda: outcome(record(2.0, []), {**record(2.0, []), "claims": {}}), REGRESSION),
    "a claim new": (lambda: outcome({**record(2.0, []), "claims": {}}, record(2.0, [])), CHANGE),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_rule_of_compare_in_each_direction(case):
    run, expected = CASES[case]
    assert run() == expected


def every_rule() -> None:
    """Every case above; the first that fails is named."""
    for case, (run, expected) in CASES.items():
        got = run()
        assert got == expected, f"{case}: {got}, not {expected}"


def test_every_bound_is_tested_in_both_directions():
    """Each side of a bound meets a move toward it and one away from it, with and without reruns, clocked and not."""
    for side in ("lower", "upper"):
        for prefix in (side, f"clocked {side}", f"reruns {side}"):
            names = [c for c in CASES if c.startswith(prefix)]
            assert any("toward it" in c for c in names) and any("away from it" in c for c in names), prefix
    for prefix in ("range", "reruns range"):
        assert {f"{prefix}: a rise toward its upper side", f"{prefix}: a drop toward its lower side"} <= set(CASES)


@pytest.mark.parametrize("name", [n for n, f in RECORD_FAULTS.items() if f.check == COMPARE])
def test_each_compare_fault_turns_the_rules_red(name):
    """The rules above are not true by construction: under each fault of compare one of them fails."""
    with RECORD_FAULTS[name].activate(), pytest.raises(AssertionError):
        every_rule()
