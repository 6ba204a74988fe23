"""Clocked values measured by several processes per side: ``compare --before-reruns ... --after-reruns ...``.

One run's standard error is the spread of its rounds; two processes of one environment can differ by more
(KV-HEAD-TIMING's recompute step at n = 4,096 takes 90 ms in some processes, 160 to 176 ms in others). Reruns
of a side's environment measure that spread, and :func:`welch_p` judges a move against it.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from . import schema
from .schema import ClaimEntry, RunRecord
from .vocabulary import NOT_RUN

#: Level of the test between processes: two-sided, the level of ``registry.NOISE_SIGMAS`` standard errors under normal noise
#: (erfc(3 / sqrt 2) = 0.27%), so that a move between processes is called at the level a verdict is decided at.
PROCESS_LEVEL = math.erfc(3.0 / math.sqrt(2.0))


def welch_p(xs: list[float], ys: list[float]) -> float:
    """Two-sided p-value of Welch's t-test for equal means of the processes' values ``xs`` and ``ys`` (each at least two).

    Where neither side varies, the means are equal (p = 1) or not (p = 0): a value every process measures alike
    (a count that the rounds' median lands on) moved or did not."""
    from scipy import stats

    if statistics.pvariance(xs) == 0 and statistics.pvariance(ys) == 0:
        return 1.0 if statistics.fmean(xs) == statistics.fmean(ys) else 0.0
    return float(stats.ttest_ind(xs, ys, equal_var=False).pvalue)


def by_profile(claim: ClaimEntry) -> dict[tuple[str, int], dict[str, Any]]:
    """Results keyed by (profile, n): the n-th result of that profile (usually n = 0)."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    seen: Counter = Counter()
    for r in claim.get("results", []):
        out[(r["profile"], seen[r["profile"]])] = r
        seen[r["profile"]] += 1
    return out


def rerun_values(reruns: list[RunRecord], cid: str, key: tuple[str, int], q: str) -> list[float]:
    """``q`` of claim ``cid``'s result ``key`` (profile, n) in each rerun that measured it: finite numbers, from results
    that are not *not run*. A rerun that did not select the claim adds nothing."""
    out = []
    for record in reruns:
        claim = record["claims"].get(cid)
        result = by_profile(claim).get(key) if claim else None
        if not result or result["verdict"] == NOT_RUN:
            continue
        x = next((finite(chk["measured"]) for chk in result.get("checks", []) if chk["q"] == q), None)
        if x is not None:
            out.append(x)
    return out


def finite(value: Any) -> float | None:
    x = schema.as_float(value)
    return x if x is not None and math.isfinite(x) else None


def identities(record: RunRecord, where: Path) -> list[str]:
    """A record's identities: its run id (a copy of the file has it too), its file, and its content (a copy of a
    record written before runs had ids)."""
    run_id = record.get("run", {}).get("id")
    content = hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return [f"run {run_id}"] * bool(run_id) + [f"file {schema.record_path(where).resolve()}", f"identical content {content}"]


def given_twice(records: list[RunRecord], paths: list[Path]) -> str:
    """"A and B are the same run (…)" when two of ``records`` are one run, or ""."""
    seen: dict[str, Path] = {}
    for record, where in zip(records, paths):
        for key in identities(record, where):
            if key in seen:
                return f"{where} and {seen[key]} are the same run ({key})"
            seen[key] = where
    return ""


def _measured_claims(record: RunRecord) -> set[str]:
    """The claims a run measured: those with a result on a profile (not the "-" of a test not selected)."""
    return {cid for cid, c in record["claims"].items() if any(r.get("profile") != "-" for r in c.get("results", []))}


def not_a_rerun(primary: RunRecord, record: RunRecord) -> str:
    """Why ``record`` cannot be a rerun of ``primary``, or "": a fault injected, another suite, other claims measured,
    or a clocked value that is no number (a rerun adds processes to those values, nothing else)."""
    fault = record.get("run", {}).get("fault")
    if fault:
        return f"it was run with the fault {fault} injected (a broken measurement on purpose)"
    if record.get("suite") != primary.get("suite"):
        return f"it was written by {record.get('suite')!r}, the primary by {primary.get('suite')!r}"
    mine, theirs = _measured_claims(record), _measured_claims(primary)
    if mine != theirs:
        differ = sorted(mine ^ theirs)
        return f"it measured another set of claims ({len(differ)} differ, e.g. {', '.join(differ[:3])})"
    for cid, claim in record["claims"].items():
        for r in claim.get("results", []):
            for chk in r.get("checks", []):
                if chk.get("se") is not None and schema.as_float(chk["measured"]) is None and chk["measured"] is not None \
                        and str(chk["measured"]).strip().lower() != "nan":  # nan: not measured, as a record holds it
                    return f"claim {cid}: {chk['q']} is {ascii(chk['measured'])[:40]}, not a number (a clocked value of a rerun must be one)"
    return ""
