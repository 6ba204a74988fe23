"""The verdict: a pure function of (measured values, claim, profile, device, library versions), :func:`judge`.

Each check of a claim (:mod:`cheapinfer.harness.registry`) is compared with its measured value; a
non-finite or missing measurement fails every check that reads it, and a timing check within its noise
is left undecided (*inconclusive*). :func:`perturb` moves a book value (or a shape bound) beyond its
tolerance: it proves the comparator, and ``--perturb ID`` shows a claim turning red; that a
*measurement* can fail is shown by the fault catalogue (``cheapinfer.faults``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from . import registry, registry_fields
from .numbers import fmt, is_number, margin_text
from .vocabulary import DEVIATES, ERRATUM, INCONCLUSIVE, REPRODUCED, SHAPE_HOLDS


@dataclass
class Outcome:
    """The result of one check against one measurement."""

    check: registry.Check
    measured: Any
    target: Any
    passed: bool
    asserted: bool  # False where the check is only reported (wrong profile or device)
    documented: bool = False  # the claim's erratum documents this check as failing here
    decided: bool = True  # False: within its noise, or not found in the range searched (the claim is inconclusive)
    se: float | None = None  # noise = "rounds": the measured standard error

    def message(self, claim: registry.Claim) -> str:
        return (
            f"{claim.id} {self.check.q}: measured {fmt(self.measured)}, expected "
            f"{self.check.describe(claim.book)}{f' at the median of {self.check.draws} seeded draws' if self.check.draws else ''} ({self.check.why})"
        )


@dataclass
class Judgement:
    """The verdict of one measurement, with the claim it was judged against (perturbed where ``--perturb`` asked: the
    claim is perturbed once, in the recorder) and the measured values, so that its messages need nothing else."""

    verdict: str
    claim: registry.Claim
    measured: Mapping[str, Any]
    outcomes: list[Outcome] = field(default_factory=list)
    #: documented erratum checks that pass now: the book's digits reproduce, the erratum is stale
    stale: list[Outcome] = field(default_factory=list)

    @property
    def failures(self) -> list[Outcome]:
        """Asserted checks that failed and were decided (a margin within the noise is no failure)."""
        return [o for o in self.outcomes if o.asserted and o.decided and not o.passed]

    @property
    def undecided(self) -> list[Outcome]:
        """Asserted checks the measurement could not decide: within the noise, or not found in the range searched."""
        return [o for o in self.outcomes if o.asserted and not o.decided]

    def messages(self) -> list[str]:
        """Why the verdict is ``deviates``: each undocumented failure, and each stale erratum check."""
        claim = self.claim
        out = [o.message(claim) for o in self.failures if not o.documented]
        out += [
            f"{claim.id} {o.check.q}: documented erratum no longer holds: measured {fmt(o.measured)} now meets "
            f"{o.check.describe(claim.book)}; revise the registry's erratum entry"
            for o in self.stale
        ]
        return out

    def inconclusive_messages(self) -> list[str]:
        """Why the verdict is ``inconclusive``: each check the measurement could not decide, with its numbers and what to do."""
        claim, measured, out = self.claim, self.measured, []
        for o in self.undecided:
            if o.check.measurable:
                out.append(f"{claim.id} {o.check.q}: this device cannot measure it: {measured.get(o.check.q + '_why') or 'see the measured values'}; "
                           "measure on a device where it can")
            elif o.check.searched:
                ranges = "; ".join(f"{k} = {fmt(v)}" for k, v in measured.items() if "searched" in k) or "see the measured values"
                out.append(f"{claim.id} {o.check.q}: not found in the range this device could afford ({ranges}); "
                           "search further on a device with more memory or time")
            else:
                margin = abs(o.measured - o.target) / o.se if o.se else math.inf
                out.append(f"{claim.id} {o.check.q}: measured {fmt(o.measured)} +- {fmt(o.se)} ({registry.NOISE_WORDS[o.check.noise]}), "
                           f"expected {o.check.describe(claim.book)}: the margin is {margin_text(margin)} standard errors, fewer than the "
                           f"{registry.NOISE_SIGMAS:g} needed to decide; measure on a quieter machine or with more rounds")
        return out


_NON_FINITE = {"nan", "-nan", "inf", "+inf", "-inf", "infinity", "-infinity"}


def _non_finite(value: Any) -> bool:
    """NaN or infinity, as a float or as the string a JSON record holds it as."""
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, str) and value.strip().lower() in _NON_FINITE


def _compare(op: str, measured: Any, target: Any) -> bool:
    if isinstance(target, bool) != isinstance(measured, bool) or (is_number(target) and not is_number(measured)):
        return False  # True == 1 in Python; a boolean claim needs a boolean measurement
    try:
        return bool(registry.OPS[op](measured, target))
    except TypeError:
        return False


def _passes(check: registry.Check, measured: Any, target: Any) -> bool:
    """Whether ``measured`` meets ``check``. A missing, non-finite or wrongly typed measurement fails."""
    if measured is None or _non_finite(measured):
        return False
    if check.kind == "shape":
        return _compare(check.op, measured, target)
    if check.form == "exact":
        return _compare("==", measured, target)
    if check.form == "bound":
        return _compare(check.op, measured, target)
    if check.form == "one_of":
        return any(_compare("==", measured, t) for t in target)
    if not is_number(measured):
        return False
    if check.form == "rel":
        return abs(measured - target) <= check.tol * abs(target)
    return abs(measured - target) <= check.tol


def _se(check: registry.Check, measured: Mapping[str, Any]) -> float | None:
    """The standard error a noisy check's measurement handed with it: a number >= 0, ``inf`` where the noise could
    not be estimated (it then decides nothing), or None where none was handed (it then decides as any check)."""
    if not check.noise:
        return None
    se = measured.get(check.se_key)
    if isinstance(se, str) and se.strip().lower() in ("inf", "+inf", "infinity"):
        return math.inf  # as a JSON record holds it: a noise that could not be estimated (fewer than two rounds)
    return float(se) if is_number(se) and not math.isnan(se) and se >= 0 else None


def _decided(check: registry.Check, value: Any, target: Any, passed: bool, se: float | None) -> bool:
    """Whether an outcome decides: a noisy check whose margin is within :data:`NOISE_SIGMAS` standard errors does
    not, nor a searched existence that was not found. A noisy check without its standard error, or without a
    finite value, decides (it fails: a measurement that did not say how noisy it is cannot be inconclusive)."""
    if check.limit:
        return True  # a physical limit: within the noise it passed (judge), beyond it it failed; either decides
    if check.searched or check.measurable:
        return passed or value is not False  # not found (False) in the range searched, or not measurable here, decides nothing; a missing value fails
    if check.noise and se is not None and is_number(value) and math.isfinite(value):
        return abs(value - target) >= registry.NOISE_SIGMAS * se
    return True


def judge(claim: registry.Claim, measured: Mapping[str, Any], profile: str, device: str = "cpu", versions: Mapping[str, str] | None = None) -> Judgement:
    """Verdict of one measurement of ``claim`` on ``profile``.

    Shape checks are asserted on every profile; digits checks only on the claim's ``digits_on``
    profiles (and, with ``requires = "cuda"``, only on CUDA); elsewhere they are evaluated and
    reported. A measured quantity that a check needs but the measurement lacks fails the check.

    Where the claim has a confirmed erratum for ``profile``: the verdict is ``erratum`` when exactly
    the documented checks fail and every other asserted check passes; it is ``deviates`` when another
    check fails, or when a documented check passes (the book's digits reproduce: the erratum is stale,
    as a strict xfail that passes). An erratum that ``applies`` only to some library releases is left out
    where ``versions`` (library -> installed version) are others: there the book's digits are asserted.

    A check that cannot decide (a noisy margin within the noise, a searched existence not found in the
    range; see the module doc) makes the verdict ``inconclusive``, unless a decided check fails: never
    ``deviates`` by itself, and never green.
    """
    outcomes = []
    digits_here = profile in claim.digits_on
    documents = {q for e in claim.errata_on(profile, versions) for q in e.fails}
    for check in claim.checks:
        if not check.judged_on(profile):
            continue
        target = check.bound if check.kind == "shape" else claim.book[check.q]
        asserted = check.kind == "shape" or digits_here
        # a premise asked only on CUDA (device_bound: by construction elsewhere) that a measurement found failing is still said
        if check.requires == "cuda" and not device.startswith("cuda") and not (check.measurable and measured.get(check.q) is False):
            asserted = False
        if any(measured.get(w) is False for w in check.premises):  # nothing found to measure, or its premise fails here: reported only
            asserted = False
        value = measured.get(check.q)
        documented = asserted and check.kind == "digits" and check.q in documents
        passed = _passes(check, value, target) and (not check.draws or registry_fields.distribution_given(check.q, check.draws, measured))
        se = _se(check, measured)
        if check.limit and not passed and se is not None and is_number(value) and math.isfinite(value):
            passed = abs(value - target) < registry.NOISE_SIGMAS * se  # at a physical limit within the noise: no evidence beyond it
        outcomes.append(Outcome(check, value, target, passed, asserted, documented, _decided(check, value, target, passed, se), se))
    if not any(o.asserted for o in outcomes):
        raise registry.RegistryError(f"{claim.id}: no check of this claim is asserted on profile {profile!r} ({device})")
    judged = Judgement(DEVIATES, claim, dict(measured), outcomes, stale=[o for o in outcomes if o.documented and o.passed])
    failures = judged.failures
    if any(not o.documented for o in failures) or judged.stale:
        judged.verdict = DEVIATES
    elif judged.undecided:  # nothing failed that was decided, and something could not be decided
        judged.verdict = INCONCLUSIVE
    elif failures:  # exactly the documented checks fail, and nothing else
        judged.verdict = ERRATUM
    elif any(o.asserted and o.check.kind == "digits" for o in outcomes):
        judged.verdict = REPRODUCED
    else:
        judged.verdict = SHAPE_HOLDS
    return judged


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


def perturb(claim: registry.Claim, measured: Mapping[str, Any]) -> registry.Claim:
    """``claim`` with every book value and bound moved beyond its tolerance, away from ``measured``.

    Used by ``--perturb ID`` at run time and by the falsifiability self-test: a check whose
    verdict does not flip under this is a check that cannot fail.
    """
    book = dict(claim.book)
    checks = []
    for check in claim.checks:
        m = measured.get(check.q)
        if check.kind == "digits" and check.form == "one_of":
            book[check.q] = [_moved(m, m, 1.0)] if is_number(m) else [f"not {m!r}"]
            checks.append(check)
        elif check.kind == "digits" and check.form == "bound":
            book[check.q] = _beyond(check.op, m) if is_number(m) else f"not {m!r}"
            checks.append(check)
        elif check.kind == "digits":
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
            else:
                bound = _beyond(check.op, m, registry.NOISE_SIGMAS * (_se(check, measured) or 0.0))
            checks.append(replace(check, bound=bound, searched=False, measurable=False))
    # A perturbed claim is a demonstration of the comparator, never an erratum.
    return replace(claim, book=book, checks=tuple(checks), errata=())


def _beyond(op: str, m: float, noise: float = 0.0) -> float:
    """A bound that ``m`` fails under ``op``, by more than ``noise``."""
    step = max(abs(m), 1.0) + 2 * noise
    return m - step if op in ("<", "<=") else m + step


def over_draws(claim: registry.Claim, q: str, values: list[float]) -> dict[str, float]:
    """What :data:`registry_fields.DRAWS_RULE` judges a seeded quantity on, from its value on each workload (the seeded one and
    the draws): the median as ``q``, the 5th and 95th percentiles (inclusive method), how many workloads, and the share
    of them on which the claim's check of ``q`` holds, by the verdict's own comparison."""
    check = next((c for c in claim.checks if c.q == q and c.draws), None)
    if check is None:
        raise registry.RegistryError(f"{claim.id}: no check of {q!r} is judged over seeded draws ('draws')")
    target = check.bound if check.kind == "shape" else claim.book[check.q]
    band = spread(values)
    return {q: band["median"], f"{q}_p05": band["p05"], f"{q}_p95": band["p95"], f"{q}_draws": len(values),
            f"{q}_share_holding": sum(_passes(check, v, target) for v in values) / len(values)}


def spread(values: list[float]) -> dict[str, float]:
    """The median and the 5th and 95th percentiles of ``values`` (``statistics.quantiles``' inclusive method)."""
    import statistics

    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"median": statistics.median(values), "p05": cuts[4], "p95": cuts[94]}
