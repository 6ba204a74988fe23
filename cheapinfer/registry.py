"""The claim registry: the book's values, their tolerances, and the verdict function.

``registry.toml`` (next to this file) is the single source of truth for every number the book
prints. Each claim holds:

- ``statement``: the book's sentence, paraphrased in English;
- ``book``: the book's values by name, ``units`` their units;
- ``runs_on``: the profiles the claim is measured on (``arithmetic``, ``twin``, ``stand-in``, ``book``);
- ``digits_on``: the profiles on which the book's digits are asserted (elsewhere they are reported);
- ``checks``: a list of checks. A *digits* check compares a measured value with ``book[q]``
  (``form`` = ``exact`` | ``rel`` | ``abs``, with ``tol``); a *shape* check compares a measured
  value with a ``bound`` (``op`` = ``>``, ``>=``, ``<``, ``<=``, ``==``) and holds on every profile.
  Every check says ``why`` its tolerance is what it is. A check may carry ``requires = "cuda"``:
  then it is asserted only on a CUDA device and reported elsewhere.

The verdict is a pure function of (measured values, claim, profile, device): :func:`judge`.
:func:`perturb` moves a book value (or a shape bound) beyond its tolerance; the suite uses it to
prove that every check can fail.
"""

from __future__ import annotations

import math
import operator
import tomllib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

REPRODUCED = "reproduced"
SHAPE_HOLDS = "shape holds"
DEVIATES = "deviates"
NOT_RUN = "not run"
NO_TEST = "no test yet"
VERDICTS = (REPRODUCED, SHAPE_HOLDS, DEVIATES, NOT_RUN, NO_TEST)

PROFILES = ("arithmetic", "twin", "stand-in", "book")
SECTIONS = {
    "KV": "1. KV cache",
    "BAT": "2. Batching",
    "Q": "3. Weight quantization",
    "OUT": "4. Activation outliers",
    "EVAL": "5. Does quantization hurt?",
    "SPEC": "6. Speculative decoding",
    "DIST": "7. Distillation",
    "BUD": "8. The budget",
    "ASIDE": "9. Asides",
}
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq}
_FORMS = ("exact", "rel", "abs")


class RegistryError(ValueError):
    """The registry file is malformed."""


@dataclass(frozen=True)
class Check:
    """One assertion of a claim. ``kind`` is ``digits`` (against the book) or ``shape`` (against a bound)."""

    q: str
    kind: str
    why: str
    form: str = ""  # digits: exact | rel | abs
    tol: float = 0.0  # digits: relative or absolute tolerance
    op: str = ""  # shape: comparison operator
    bound: Any = None  # shape: the bound
    requires: str = ""  # "" or "cuda"

    def describe(self, book: Mapping[str, Any]) -> str:
        if self.kind == "shape":
            return f"{self.q} {self.op} {fmt(self.bound)}"
        if self.form == "exact":
            return f"{self.q} == {fmt(book[self.q])}"
        if self.form == "rel":
            return f"{self.q} = {fmt(book[self.q])} ± {self.tol:.3g} (relative)"
        return f"{self.q} = {fmt(book[self.q])} ± {fmt(self.tol)}"


@dataclass(frozen=True)
class Claim:
    id: str
    section: str
    statement: str
    book: Mapping[str, Any]
    units: Mapping[str, str]
    runs_on: tuple[str, ...]
    digits_on: tuple[str, ...]
    checks: tuple[Check, ...]
    note: str = ""

    def with_book(self, **values: Any) -> "Claim":
        return replace(self, book={**self.book, **values})


@dataclass
class Outcome:
    """The result of one check against one measurement."""

    check: Check
    measured: Any
    target: Any
    passed: bool
    asserted: bool  # False where the check is only reported (wrong profile or device)

    def message(self, claim: Claim) -> str:
        return (
            f"{claim.id} {self.check.q}: measured {fmt(self.measured)}, expected "
            f"{self.check.describe(claim.book)} ({self.check.why})"
        )


@dataclass
class Judgement:
    verdict: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.asserted and not o.passed]


def fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return str(value)
        if abs(value) >= 1e6 or abs(value) < 1e-3:
            return f"{value:.4g}"
        return f"{value:.6g}"
    return str(value)


def _check_from(claim_id: str, raw: Mapping[str, Any], book: Mapping[str, Any]) -> Check:
    kind = raw.get("kind", "digits")
    if "why" not in raw:
        raise RegistryError(f"{claim_id}: check {raw.get('q')!r} says nothing about why its tolerance is what it is")
    if kind == "digits":
        if raw.get("q") not in book:
            raise RegistryError(f"{claim_id}: digits check {raw.get('q')!r} names no book value")
        if raw.get("form") not in _FORMS:
            raise RegistryError(f"{claim_id}: digits check form must be one of {_FORMS}")
        if raw["form"] != "exact" and not (0 < float(raw.get("tol", 0)) < math.inf):
            raise RegistryError(f"{claim_id}: {raw['form']} check of {raw['q']!r} needs a finite tol > 0")
    elif kind == "shape":
        if raw.get("op") not in _OPS or "bound" not in raw:
            raise RegistryError(f"{claim_id}: shape check {raw.get('q')!r} needs op in {tuple(_OPS)} and a bound")
    else:
        raise RegistryError(f"{claim_id}: unknown check kind {kind!r}")
    return Check(
        q=raw["q"],
        kind=kind,
        why=raw["why"],
        form=raw.get("form", ""),
        tol=float(raw.get("tol", 0.0)),
        op=raw.get("op", ""),
        bound=raw.get("bound"),
        requires=raw.get("requires", ""),
    )


def parse(text: str) -> dict[str, Claim]:
    data = tomllib.loads(text)
    claims = {}
    for claim_id, raw in data.items():
        section = raw.get("section")
        if section not in SECTIONS:
            raise RegistryError(f"{claim_id}: section {section!r} not in {tuple(SECTIONS)}")
        book = raw.get("book", {})
        runs_on = tuple(raw.get("runs_on", ()))
        digits_on = tuple(raw.get("digits_on", ()))
        for p in runs_on + digits_on:
            if p not in PROFILES:
                raise RegistryError(f"{claim_id}: unknown profile {p!r}")
        claims[claim_id] = Claim(
            id=claim_id,
            section=section,
            statement=raw["statement"],
            book=book,
            units=raw.get("units", {}),
            runs_on=runs_on,
            digits_on=digits_on,
            checks=tuple(_check_from(claim_id, c, book) for c in raw.get("checks", ())),
            note=raw.get("note", ""),
        )
    return claims


@lru_cache(maxsize=1)
def load() -> dict[str, Claim]:
    """All claims of the chapter, keyed by ID, in the book's order."""
    return parse(resources.files("cheapinfer").joinpath("registry.toml").read_text(encoding="utf-8"))


def get(claim_id: str) -> Claim:
    try:
        return load()[claim_id]
    except KeyError:
        raise KeyError(f"claim {claim_id!r} is not in the registry") from None


def _passes(check: Check, measured: Any, target: Any) -> bool:
    if measured is None:
        return False
    if check.kind == "shape":
        try:
            return bool(_OPS[check.op](measured, target))
        except TypeError:
            return False
    if check.form == "exact":
        return measured == target
    if isinstance(measured, float) and not math.isfinite(measured):
        return False
    if check.form == "rel":
        return abs(measured - target) <= check.tol * abs(target)
    return abs(measured - target) <= check.tol


def judge(claim: Claim, measured: Mapping[str, Any], profile: str, device: str = "cpu") -> Judgement:
    """Verdict of one measurement of ``claim`` on ``profile``.

    Shape checks are asserted on every profile; digits checks only on the claim's ``digits_on``
    profiles (and, with ``requires = "cuda"``, only on CUDA); elsewhere they are evaluated and
    reported. A measured quantity that a check needs but the measurement lacks fails the check.
    """
    outcomes = []
    digits_here = profile in claim.digits_on
    for check in claim.checks:
        target = check.bound if check.kind == "shape" else claim.book[check.q]
        asserted = check.kind == "shape" or digits_here
        if check.requires == "cuda" and not device.startswith("cuda"):
            asserted = False
        outcomes.append(Outcome(check, measured.get(check.q), target, _passes(check, measured.get(check.q), target), asserted))
    if any(o.asserted and not o.passed for o in outcomes):
        verdict = DEVIATES
    elif any(o.asserted and o.check.kind == "digits" for o in outcomes):
        verdict = REPRODUCED
    elif any(o.asserted for o in outcomes):
        verdict = SHAPE_HOLDS
    else:
        raise RegistryError(f"{claim.id}: no check of this claim is asserted on profile {profile!r} ({device})")
    return Judgement(verdict, outcomes)


def _moved(value: Any, away_from: Any, width: float) -> Any:
    """A value at least two tolerance widths beyond ``away_from`` on the side opposite to ``value``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"not {value!r}" if not isinstance(value, bool) else not value
    if not isinstance(away_from, (int, float)):  # nothing measured: any move beyond the band will do
        away_from = value
    step = max(abs(away_from - value), 0.0) + 2 * width + 1e-9 * max(1.0, abs(value))
    direction = 1.0 if away_from <= value else -1.0
    moved = value + direction * step
    return int(math.ceil(moved) if direction > 0 else math.floor(moved)) if isinstance(value, int) else moved


def perturb(claim: Claim, measured: Mapping[str, Any]) -> Claim:
    """``claim`` with every book value and bound moved beyond its tolerance, away from ``measured``.

    Used by ``--perturb ID`` at run time and by the falsifiability self-test: a check whose
    verdict does not flip under this is a check that cannot fail.
    """
    book = dict(claim.book)
    checks = []
    for check in claim.checks:
        m = measured.get(check.q)
        if check.kind == "digits":
            b = book[check.q]
            if isinstance(b, (int, float)) and not isinstance(b, bool):
                width = check.tol * abs(b) if check.form == "rel" else check.tol
                moved = _moved(b, m, width)
                # A relative band widens with the book value: keep moving until the measurement is outside it.
                while check.form == "rel" and isinstance(m, (int, float)) and abs(m - moved) <= check.tol * abs(moved):
                    moved = moved * 2 if moved > m else moved / 2 - 1
                book[check.q] = moved
            else:
                book[check.q] = _moved(b, m, 0)
            checks.append(check)
        else:
            if isinstance(m, bool) or not isinstance(m, (int, float)):
                bound = not m if isinstance(m, bool) else f"not {m!r}"
            elif check.op in (">", ">="):
                bound = m + max(abs(m), 1.0)
            elif check.op in ("<", "<="):
                bound = m - max(abs(m), 1.0)
            else:
                bound = m + max(abs(m), 1.0)
            checks.append(replace(check, bound=bound))
    return replace(claim, book=book, checks=tuple(checks))
