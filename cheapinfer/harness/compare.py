"""Two run records side by side: ``python -m cheapinfer compare`` (``merge`` puts several into a matrix:
:mod:`cheapinfer.harness.merge`).

``python -m cheapinfer compare BEFORE AFTER`` takes two run records (``run.json`` files or the report
directories holding them), e.g. the pinned libraries and the newest ones (``tox -e latest``), or two
machines. It prints every claim whose verdict changed on a profile, and every checked value that
moved beyond its tolerance, and exits 1 on a regression:

- a result that was *reproduced*, *shape holds* or a confirmed *erratum* and now *deviates* (for an
  erratum: its digits reproduce now, or something else broke), or is *not run* because its
  test raised before a verdict (e.g. a library update broke an import); a skip is not a regression;
- a claim of BEFORE that AFTER lacks (it *vanished*); a claim new in AFTER is a change, not a regression;
- a value that moved beyond its tolerance. For a quantity with a digits check the tolerance is the
  check's own (``exact``: any change; ``rel``: ``tol`` x the book's value; ``abs``: ``tol``). For a
  quantity checked only by shape (ratios of timings, growth factors, fractions) against a bound, it
  regresses when it moves toward the bound by more than ``--band`` (default 0.25) relative, on a
  check that was asserted: a drop toward a lower bound (``>``, ``>=``), a rise toward an upper one (``<``, ``<=``),
  either toward a range's (``0 < x < 1``: every bound of the quantity on the result's profile counts); a larger
  move away from the bound, or of a value that was only reported, is printed as a change, not a regression. The shape values are ratios
  of medians of interleaved rounds; 25% is a stated margin for their run-to-run noise on a shared
  machine, not a measured one. Tighten it on a quiet, dedicated CI runner; widen it when comparing
  machines of different kinds. A clocked value recorded with its standard error in both runs moves
  only beyond that band and 3 combined standard errors; and since those errors are one process's
  spread of rounds, which two processes of one environment have exceeded (KV-HEAD-TIMING: 840 and
  1,520 in two runs of one commit), such a move is printed as a change with that reason, not a
  regression, while the value still holds its bound: its verdict, compared apart, is what decides.
  ``--before-reruns`` and ``--after-reruns`` take more records of each side's environment (reruns of the
  claims, e.g. ``pytest claims --claims ID --report-dir DIR``): a clocked value measured by at least two
  processes on each side is then judged on the spread between processes, by Welch's t-test on the
  processes' values at the verdicts' own level (0.27%, :data:`PROCESS_LEVEL`) and the band on their means,
  and a move toward its bound beyond both is a regression (:func:`process_change`).

Every change to *not run* is printed with its reason; one whose test raised before a verdict is a
*harness error* (the suite or a library broke, not the claim) and is listed apart from the claims that
changed. Exit status: 0 no regression, 1 regression (harness errors of a passing claim included), 2 usage
error or a record that cannot be read or is ill-formed (one line): a rerun of another environment than its
side's, or one run given twice; not JSON, another suite's record or a
schema this version does not read, a verdict it does not know (``vocabulary.VERDICTS``), or a value it cannot
read (an integer beyond the range of a float, text that is not Unicode).
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.settings import printable
from . import registry, schema
from .errata import recorded_errata
from .numbers import fmt, value_text
from .reruns import PROCESS_LEVEL, by_profile, finite, identities, not_a_rerun, rerun_values, welch_p
from .schema import ClaimEntry, RunRecord
from .vocabulary import BREAKABLE, DEVIATES, KEY_ENVIRONMENT, NO_TEST, NOT_RUN, is_harness_error

#: Default relative band for values judged by shape only (timing ratios and the like); see the module doc.
BAND = 0.25
#: ``Change.what`` of a claim that one of the records lacks: vanished from AFTER (a regression), or new in it.
CLAIM = "claim"


@dataclass
class Change:
    """One difference between two runs of a claim on one profile."""

    claim: str
    profile: str
    what: str  # "verdict", or the name of the measured quantity
    before: Any
    after: Any
    tolerance: str  # how far the value may move, or "" for a verdict
    regression: bool
    reason: str = ""  # why the claim is now *not run* (a verdict change to not run), or why a value rightly moved
    harness: bool = False  # now not run because its test raised before a verdict: the suite or a library broke, not the claim

    def line(self) -> str:
        tag = "HARNESS" if self.harness else "REGRESSION" if self.regression else "changed"
        if self.what == CLAIM:
            body = f"vanished: {self.before} -> absent from the later record" if self.regression else f"new: absent from the earlier record -> {self.after}"
        elif self.what == "verdict":
            body = f"verdict: {self.before} -> {self.after}" + (f" ({self.reason})" if self.reason else "")
        else:
            body = f"{self.what}: {value_text(self.before)} -> {value_text(self.after)} (moved beyond {self.tolerance}" + (f"; {self.reason})" if self.reason else ")")
        return f"{tag:<11} {self.claim} [{self.profile}] {body}"


def _unselected(results: dict[tuple[str, int], dict[str, Any]]) -> bool:
    """No result at all, or only the placeholder ``record.build`` writes for a test not selected in the run."""
    return not results or all(profile == "-" for profile, _ in results)


def _tolerance(q: str, claim: ClaimEntry, band: float) -> tuple[str, Any]:
    """How far quantity ``q`` of ``claim`` may move between runs: (form, width).

    A digits check decides (its form and tolerance, relative to the book's value); a quantity
    checked only by shape gets the relative ``band``.
    """
    for spec in claim.get("checks", []):
        if spec["q"] == q and spec["kind"] == "digits":
            if spec["form"] in ("exact", "one_of"):
                return "exact", 0
            if spec["form"] == "bound":  # a printed bound: judged like a shape bound (see shape_bound)
                return "rel", band
            if spec["form"] == "rel":
                book = schema.as_float(claim.get("book", {}).get(q))
                if book is not None:
                    return "abs", spec["tol"] * abs(book)
                return "rel", spec["tol"]
            return "abs", spec["tol"]
    return "rel", band


def _moved(before: Any, after: Any, form: str, width: float) -> bool:
    a, b = schema.as_float(before), schema.as_float(after)
    if a is None or b is None or form == "exact":
        return before != after
    if not (math.isfinite(a) and math.isfinite(b)):
        return not (a == b or (math.isnan(a) and math.isnan(b)))
    if form == "abs":
        return abs(b - a) > width
    return abs(b - a) > width * abs(a) if a != 0 else b != 0


def shape_bounds(q: str, claim: ClaimEntry, profile: str = "") -> tuple[tuple[str, float], ...]:
    """Every numeric (op, bound) of ``q``'s shape checks (or of its printed-bound digits check) that applies on
    ``profile`` (all of them where it is ""): one for a one-sided bound, two for a range (Q-NF4's ``0 < block_share < 1``)."""
    out = []
    for spec in claim.get("checks", []):
        if spec["q"] != q or spec.get("op") not in ("<", "<=", ">", ">=") or (profile and spec.get("profiles") and profile not in spec["profiles"]):
            continue
        if spec["kind"] == "shape" and schema.as_float(spec.get("bound")) is not None:
            out.append((spec["op"], schema.as_float(spec["bound"])))
        elif spec["kind"] == "digits" and spec.get("form") == "bound" and schema.as_float(claim.get("book", {}).get(q)) is not None:
            out.append((spec["op"], schema.as_float(claim["book"][q])))
    return tuple(out)


def shape_bound(q: str, claim: ClaimEntry) -> tuple[str, float] | None:
    """(op, bound) of the first numeric shape check of ``q`` (or of its printed-bound digits check), if it has one."""
    return next(iter(shape_bounds(q, claim)), None)


def _direction(bounds: tuple[tuple[str, float], ...], before: float, after: float) -> tuple[bool, str]:
    """Whether a move from ``before`` to ``after`` goes toward one of ``bounds`` (a rise toward an upper bound ``<``,
    ``<=``; a drop toward a lower one ``>``, ``>=``), and the words for it, naming that bound (or, moving away, the first)."""
    upward = after > before
    toward = [(op, bound) for op, bound in bounds if upward == (op in ("<", "<="))]
    op, bound = (toward or bounds)[0]
    return bool(toward), f"{'toward' if toward else 'away from'} the bound {op} {fmt(bound)}"


def _shape_change(cid: str, profile: str, q: str, before: Any, after: Any, shape: tuple[tuple[str, float], ...], band: float, asserted: bool,
                  se: tuple[Any, Any] = (None, None)) -> Change | None:
    """A shape-checked value regresses when it moves toward its bound by more than ``band`` (relative)
    on a check that was asserted; a move away from the bound, or on a check that was only reported
    (e.g. a CUDA-only bound on a CPU run), is a change, not a regression. A value measured with its
    standard error in both runs (a noisy check) has moved only where the difference also exceeds
    ``registry.NOISE_SIGMAS`` combined standard errors (a two-sample z-test at the verdicts' own level):
    two runs of one commit on a shared machine differ by their noise, and that is no regression."""
    from .registry import NOISE_SIGMAS

    a, b = schema.as_float(before), schema.as_float(after)
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return Change(cid, profile, q, before, after, "a finite number", asserted) if before != after else None
    if not _moved(a, b, "rel", band):
        return None
    se_a, se_b = (schema.as_float(float(x)) if x in ("inf", "nan") else schema.as_float(x) for x in se)  # the record writes a non-finite error as text
    noise = ""
    if se_a is not None and se_b is not None:
        combined = math.hypot(se_a, se_b)
        if not abs(b - a) > NOISE_SIGMAS * combined:  # within the noise (an infinite error decides nothing)
            return None
        noise = f" and {NOISE_SIGMAS:g} combined standard errors ({fmt(combined)})"
    toward, side = _direction(shape, a, b)
    holds = all(registry.OPS[op](b, bound) for op, bound in shape)
    if noise and toward and asserted and holds:  # beyond each run's noise of rounds, which says nothing of the spread between processes
        return Change(cid, profile, q, before, after, f"±{band:.0%} relative{noise}, {side}", False, BETWEEN_PROCESSES_REASON)
    return Change(cid, profile, q, before, after, f"±{band:.0%} relative{noise}, {side}", toward and asserted)


#: Why a clocked value that moved toward its bound beyond both runs' standard errors is still no regression (its verdict,
#: compared apart, held): those errors are the spread of one process's rounds. Two runs of one commit on one set of
#: libraries have differed by more, by a property of the process (KV-HEAD-TIMING's recompute step at n = 4,096 takes
#: 90 ms in some processes and 160 to 176 ms in others, each steady within itself), so one run per side cannot tell a
#: library's effect from the process's. Reruns of the claim on both sides can.
BETWEEN_PROCESSES_REASON = ("beyond each run's noise of rounds, not beyond the spread between two processes, which one run per side "
                            "cannot measure: rerun the claim on both sides and give the reruns (--before-reruns, --after-reruns) "
                            "before calling it the library's")


def process_change(cid: str, profile: str, q: str, xs: list[float], ys: list[float], shape: tuple[tuple[str, float], ...], band: float,
                   asserted: bool) -> Change | None:
    """A clocked value measured by several processes per side (``xs`` before, ``ys`` after, the records' first):
    moved where the means differ by more than ``band`` (relative) and Welch's t-test rejects equal means at
    :data:`PROCESS_LEVEL`. The spread between processes is measured here, not assumed: a move toward the bound on
    an asserted check is a regression, whether or not the bound still holds; one away from it a change."""
    # On a common scale: the relative band and Welch's t do not depend on it, and values near the largest float
    # (1e308, legal JSON) no longer overflow the sums of the means and variances.
    scale = max(abs(v) for v in (*xs, *ys)) or 1.0
    a, b = statistics.fmean([x / scale for x in xs]) * scale, statistics.fmean([y / scale for y in ys]) * scale
    if not _moved(a, b, "rel", band):
        return None
    p = welch_p([x / scale for x in xs], [y / scale for y in ys])
    if not p < PROCESS_LEVEL:
        return None
    toward, side = _direction(shape, a, b)
    return Change(cid, profile, q, a, b, f"±{band:.0%} relative and Welch's t-test at level {PROCESS_LEVEL:.2%} (p = {p:.2g}), "
                  f"{side}", toward and asserted,
                  f"means of {len(xs)} and {len(ys)} processes: {', '.join(fmt(x) for x in xs)} -> {', '.join(fmt(y) for y in ys)}")


def _release_bound(q: str, claim: ClaimEntry, before: RunRecord, after: RunRecord) -> str:
    """Why ``q`` may rightly differ between the two runs: the claim's erratum stands on it and is limited to some
    releases (``applies``) of a library whose version differs between them (KV-API: ``past_key_values`` is the
    4.x name, ``cache`` the 5.x one). Empty where no such reason exists: the move is then a regression."""
    ea, eb = before.get("environment", {}), after.get("environment", {})
    for erratum in recorded_errata(claim):
        if q not in erratum.get("stands_on", ()) or not isinstance(erratum.get("applies"), dict):
            continue
        moved = [f"{lib} {ea.get(lib, '-')} -> {eb.get(lib, '-')}" for lib in erratum["applies"] if ea.get(lib) != eb.get(lib)]
        if moved:
            ranges = ", ".join(f"{lib} {spec}" for lib, spec in erratum["applies"].items())
            return f"expected: the erratum stands on it and applies to {ranges} only, and {'; '.join(moved)}"
    return ""


def _describe(form: str, width: float) -> str:
    if form == "exact":
        return "exact equality"
    if form == "abs":
        return f"±{fmt(width)}"
    return f"±{width:.0%} relative"


def compare(before: RunRecord, after: RunRecord, band: float = BAND,
            reruns: tuple[list[RunRecord], list[RunRecord]] = ([], [])) -> list[Change]:
    """Differences from ``before`` to ``after``: verdict changes per profile and values moved beyond tolerance.

    ``reruns``: more records of each side's environment (see :func:`check_reruns`); they add processes to the clocked
    values (:func:`process_change`), never verdicts: the verdicts compared are ``before``'s and ``after``'s."""
    changes: list[Change] = []
    ids = list(after["claims"]) + [cid for cid in before["claims"] if cid not in after["claims"]]
    for cid in ids:
        a_claim, b_claim = before["claims"].get(cid), after["claims"].get(cid)
        if a_claim is None or b_claim is None:  # a claim that vanished is a regression; a new one is a change
            changes.append(Change(cid, "-", CLAIM, a_claim["verdict"] if a_claim else "absent", b_claim["verdict"] if b_claim else "absent", "", b_claim is None))
            continue
        a_results, b_results = by_profile(a_claim), by_profile(b_claim)
        if _unselected(a_results) or _unselected(b_results):
            # No test, or its test was not selected in one of the runs: nothing per profile to compare.
            if a_claim["verdict"] != b_claim["verdict"]:
                changes.append(Change(cid, "-", "verdict", a_claim["verdict"], b_claim["verdict"], "", False))
            continue
        for key in list(b_results) + [k for k in a_results if k not in b_results]:
            ra, rb = a_results.get(key), b_results.get(key)
            va = ra["verdict"] if ra else NO_TEST
            vb = rb["verdict"] if rb else NO_TEST
            if va != vb:
                broke = vb == DEVIATES or (rb is not None and is_harness_error(rb))
                changes.append(Change(cid, key[0], "verdict", va, vb, "", va in BREAKABLE and broke))
            if not ra or not rb or NOT_RUN in (va, vb):
                continue
            a_measured = {c["q"]: c["measured"] for c in ra.get("checks", [])}
            a_se = {c["q"]: c.get("se") for c in ra.get("checks", [])}
            undecided = {c["q"] for r in (ra, rb) for c in r.get("checks", []) if c.get("decided") is False}
            done = set()
            for chk in rb.get("checks", []):
                q = chk["q"]
                if q in done or q not in a_measured or a_measured[q] is None or chk["measured"] is None:
                    continue
                done.add(q)
                form, width = _tolerance(q, b_claim, band)
                shape = shape_bounds(q, b_claim, key[0]) if form == "rel" else ()
                # A clocked value (its standard error in both records): the processes that measured it, on each side.
                xs, ys = ([], [])
                if shape and a_se.get(q) is not None and chk.get("se") is not None:
                    xs, ys = ([finite(m)] + rerun_values(side, cid, key, q) for m, side in ((a_measured[q], reruns[0]), (chk["measured"], reruns[1])))
                if len(xs) >= 2 and len(ys) >= 2 and None not in (xs[0], ys[0]):
                    change = process_change(cid, key[0], q, xs, ys, shape, band, chk.get("asserted", True))
                elif shape:
                    change = _shape_change(cid, key[0], q, a_measured[q], chk["measured"], shape, band, chk.get("asserted", True),
                                           (a_se.get(q), chk.get("se")))
                elif _moved(a_measured[q], chk["measured"], form, width):
                    release = _release_bound(q, b_claim, before, after)
                    change = Change(cid, key[0], q, a_measured[q], chk["measured"], _describe(form, width), not release, release)
                else:
                    change = None
                if change and (q in undecided or _unmeasured(a_measured[q]) or _unmeasured(chk["measured"])):
                    change.regression, change.reason = False, UNDECIDED_REASON
                if change:
                    changes.append(change)
    return changes


#: Why a moved value is no regression where one run could not decide it or did not measure it: a search that
#: ran out of range (BAT-KNEE's knee not found, its gains nan) or a margin within the noise says nothing, and the
#: verdicts of the two runs, compared above, are what changed.
UNDECIDED_REASON = "one run could not decide it (inconclusive) or did not measure it (nan): the verdicts tell the change"


def _unmeasured(value: Any) -> bool:
    """NaN as a record holds it: a quantity the run did not measure (nothing found to measure)."""
    return (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and value.strip().lower() == "nan")


def environment_changes(before: RunRecord, after: RunRecord, keys: tuple[str, ...] | None = None) -> list[str]:
    """The entries of the environment that differ between the two runs: ``keys``, or those that decide verdicts
    (``KEY_ENVIRONMENT``) followed by every other entry of ``after``."""
    ea, eb = before.get("environment", {}), after.get("environment", {})
    keys = keys or (*KEY_ENVIRONMENT, *(k for k in eb if k not in KEY_ENVIRONMENT))
    return [f"{k}: {ea.get(k, '-')} -> {eb.get(k, '-')}" for k in keys if ea.get(k) != eb.get(k)]


def check_reruns(primaries: tuple[RunRecord, RunRecord], reruns: tuple[list[RunRecord], list[RunRecord]],
                 primary_paths: tuple[Path, Path], rerun_paths: tuple[list[Path], list[Path]]) -> str:
    """Why these reruns cannot measure their side's spread between processes, or "": each must be of its side's
    environment (the entries that decide verdicts, ``KEY_ENVIRONMENT``), and no run may be given twice (a process
    counted twice understates the spread)."""
    # BEFORE and AFTER may be one run (a record compared with itself: nothing moves)
    seen = {key: where for r, where in zip(primaries, primary_paths) for key in identities(r, where)}
    for primary, path, side_reruns, side_paths in zip(primaries, primary_paths, reruns, rerun_paths):
        for record, where in zip(side_reruns, side_paths):
            for key in identities(record, where):
                if key in seen:
                    return f"{where} and {seen[key]} are the same run ({key}): give each process once"
                seen[key] = where
            moved = environment_changes(primary, record, KEY_ENVIRONMENT)
            if moved:
                return f"{where} is not a rerun of {path}'s environment ({'; '.join(moved)}): a rerun measures one side's spread between processes"
            problem = not_a_rerun(primary, record)
            if problem:
                return f"{where} is not a rerun of {path}: {problem}"
    if bool(reruns[0]) != bool(reruns[1]):
        given, missing = ("--before-reruns", "--after-reruns") if reruns[0] else ("--after-reruns", "--before-reruns")
        return (f"{given} without {missing}: the spread between processes must be measured on both sides, "
                "or a clocked value is judged on one run per side (give both, or neither)")
    return ""


def usage_error(prog: str, message: str) -> None:
    """One line on standard error, exit status 2."""
    print(f"{prog}: error: {printable(message)}", file=sys.stderr)
    raise SystemExit(2)


def read_record(prog: str, path: Path) -> schema.RunRecord:
    """A run record, read and checked; anything else is one line and exit status 2."""
    try:
        record = schema.read_record(path)
    except schema.RecordError as exc:
        usage_error(prog, f"{path} is not a well-formed run record of this suite: {exc}")
    except (OSError, ValueError, RecursionError) as exc:  # missing, unreadable, not UTF-8, not JSON
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        usage_error(prog, f"no readable run record at {path} (give a run.json, or the report directory holding it): {reason}")
    return record


def _not_run_result(record: RunRecord, cid: str, profile: str) -> dict[str, Any] | None:
    """``cid``'s first *not run* result on ``profile`` in ``record``."""
    for r in record["claims"].get(cid, {}).get("results", []):
        if r["verdict"] == NOT_RUN and profile in ("-", r["profile"]):
            return r
    return None


def annotate(changes: list[Change], after: RunRecord) -> list[Change]:
    """Give every change to *not run* its reason, and mark those whose test raised before a verdict as harness errors."""
    for c in changes:
        if c.what == "verdict" and c.after == NOT_RUN:
            result = _not_run_result(after, c.claim, c.profile)
            c.reason = (result.get("reason") or "no reason recorded") if result else ""
            c.harness = result is not None and is_harness_error(result)
    return changes
