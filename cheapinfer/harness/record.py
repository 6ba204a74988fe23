"""Collecting claim results during a run, independent of pytest, and the run record built from them.

A :class:`Recorder` gathers one :class:`Result` per (claim, profile) measurement. ``verify`` is the
one place where a measurement meets the registry: it judges, records and returns the judgement.
With ``--perturb ID`` it judges against the claim's book values moved beyond their tolerances
instead (a demonstration of the comparator; that the measurement itself can fail is shown by the
fault catalogue, ``cheapinfer.audits.faults``).

:func:`build` turns recorded results into a record: per claim ID its statement, book values, checks (with their
tolerances), the result on each profile, and the claim's overall verdict; plus the environment, the run and the
candidate errata. :mod:`cheapinfer.harness.store` keeps it and :mod:`cheapinfer.harness.report` renders it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from .. import __version__
from . import author, errata, registry, verdict
from .schema import RUN_SCHEMA, ClaimEntry, ResultEntry, RunRecord
from .vocabulary import DEVIATES, ERRATUM, INCONCLUSIVE, NO_TEST, NOT_RUN, REPRODUCED, SHAPE_HOLDS


def jsonable(value: Any) -> Any:
    """Measured values as JSON: tensors and numpy scalars become Python numbers."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value


@dataclass
class Result:
    claim: str
    profile: str
    device: str
    verdict: str
    measured: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    tables: list[dict[str, Any]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reason: str = ""
    test: str = ""
    seconds: float = 0.0
    perturbed: bool = False
    harness_error: bool = False  # not run because the test raised before a verdict (vocabulary.is_harness_error)
    load: dict[str, Any] = field(default_factory=dict)  # the machine's load around a clocked measurement (load average, CPU steal)
    memory: dict[str, Any] = field(default_factory=dict)  # after the test: the process's peak and current resident set (schema.ResultEntry)

    def to_dict(self) -> ResultEntry:
        """The result as the run record holds it (:class:`cheapinfer.harness.schema.ResultEntry`)."""
        return jsonable(asdict(self))


class Recorder:
    """``versions``: the installed library versions (``device.library_versions()``), for errata that hold on some releases only."""

    def __init__(self, perturb: Iterable[str] = (), versions: dict[str, str] | None = None):
        self.results: list[Result] = []
        self.perturb = set(perturb)
        self.versions = versions
        self.started = time.time()

    def verify(self, claim_id: str, profile: str, device: str, measured: dict[str, Any], **extra: Any) -> tuple[Result, verdict.Judgement]:
        claim = registry.get(claim_id)
        measured = jsonable(measured)
        if claim_id in self.perturb:
            claim = verdict.perturb(claim, measured)
        judged = verdict.judge(claim, measured, profile, device, self.versions)
        result = Result(
            claim=claim_id,
            profile=profile,
            device=device,
            verdict=judged.verdict,
            measured=measured,
            checks=[
                {
                    "q": o.check.q,
                    "kind": o.check.kind,
                    "expected": o.check.describe(claim.book),
                    "measured": o.measured,
                    "passed": o.passed,
                    "asserted": o.asserted,
                    "documented": o.documented,
                    "decided": o.decided,
                    "why": o.check.why,
                    **({"noise": o.check.noise, "se": o.se, "bound": o.target, "sigmas": registry.NOISE_SIGMAS} if o.check.noise else {}),
                    **({"searched": True} if o.check.searched else {}),
                    **({"measurable": True} if o.check.measurable else {}),
                    **({"limit": True} if o.check.limit else {}),
                }
                for o in judged.outcomes
            ],
            perturbed=claim_id in self.perturb,
            **extra,
        )
        self.results.append(result)
        return result, judged

    def not_run(self, claim_id: str, profile: str, device: str, reason: str, test: str = "", harness_error: bool = False) -> Result:
        result = Result(claim=claim_id, profile=profile, device=device, verdict=NOT_RUN, reason=reason, test=test, harness_error=harness_error)
        self.results.append(result)
        return result


_RANK = {DEVIATES: 0, INCONCLUSIVE: 1, ERRATUM: 2, REPRODUCED: 3, SHAPE_HOLDS: 4, NOT_RUN: 5, NO_TEST: 6}


def overall(results: list[dict[str, Any]]) -> str:
    """A claim's verdict over its profiles: any deviation wins, then a profile that could not decide, then a
    confirmed erratum, then reproduced digits, then shape."""
    if not results:
        return NO_TEST
    return min((r["verdict"] for r in results), key=_RANK.__getitem__)


# ----------------------------------------------------------------------------------------------
# the run record
# ----------------------------------------------------------------------------------------------

#: Why a selected claim has no result in an interrupted run.
INTERRUPTED_REASON = "interrupted: the run was stopped before its test finished"


def _check_spec(check: registry.Check) -> dict[str, Any]:
    """A registry check as JSON: what ``compare`` needs to tell a real move from noise."""
    spec: dict[str, Any] = {"q": check.q, "kind": check.kind, "why": check.why}
    if check.kind == "shape":
        spec.update(op=check.op, bound=check.bound)
    else:
        spec.update(form=check.form, tol=check.tol)
        if check.form == "bound":
            spec["op"] = check.op
    if check.requires:
        spec["requires"] = check.requires
    if check.profiles:
        spec["profiles"] = list(check.profiles)
    return spec


def _source_spec(src: registry.Source) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": src.kind, "text": src.text}
    if src.why:
        spec["why"] = src.why
    if src.inputs:
        spec["from"] = list(src.inputs)
    return spec


def _erratum_spec(e: registry.Erratum) -> dict[str, Any]:
    spec = {"says": e.says, "holds": e.holds, "assumption": e.assumption, "fails": list(e.fails),
            "stands_on": list(e.stands_on), "profiles": list(e.profiles), "grade": e.grade, "reader": e.reader}
    if e.applies:
        spec["applies"] = dict(e.applies)
    return spec


def build(
    results: list[dict[str, Any]],
    environment: dict[str, str],
    run: dict[str, Any],
    tested: dict[str, list[str]],
    faults: dict[str, list[str]] | None = None,
    fault_run: dict[str, Any] | None = None,
    unfinished: frozenset[str] | set[str] = frozenset(),
) -> RunRecord:
    """The run record. ``faults``: claim ID -> the known faults that turn it red (the catalogue);
    ``fault_run``: the last ``python -m cheapinfer faults`` result, if there is one; ``unfinished``: the claims
    whose tests were selected but not finished when the run was interrupted (not "not selected")."""
    claims: dict[str, ClaimEntry] = {}
    for claim_id, claim in registry.load().items():
        mine = [r for r in results if r["claim"] == claim_id]
        if not mine and claim_id in tested:
            reason = INTERRUPTED_REASON if claim_id in unfinished else "its test was not selected in this run"
            mine = [{"claim": claim_id, "profile": "-", "device": "-", "verdict": NOT_RUN, "reason": reason, "measured": {}, "checks": []}]
        claims[claim_id] = {
            "section": claim.section,
            "statement": claim.statement,
            "book": dict(claim.book),
            "source": {k: _source_spec(v) for k, v in claim.source.items()},
            "units": dict(claim.units),
            "errata": [_erratum_spec(e) for e in claim.errata],
            "faults": list((faults or {}).get(claim_id, [])),
            "note": claim.note,
            "has_test": claim_id in tested,
            "verdict": overall(mine),
            "runs_on": list(claim.runs_on),
            "digits_on": list(claim.digits_on),
            "checks": [_check_spec(c) for c in claim.checks],
            "results": mine,
        }
    record: RunRecord = {
        "schema": RUN_SCHEMA,
        "suite": f"cheapinfer {__version__}",
        "created": run.get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run": run,
        "environment": environment,
        "summary": dict(Counter(c["verdict"] for c in claims.values())),
        "sections": {k: t for k, t in registry.SECTIONS.items() if any(c["section"] == k for c in claims.values())},
        "claims": claims,
    }
    if fault_run:
        record["fault_run"] = fault_run
    record["errata"] = errata.candidate_errata(record)
    record["text"] = author.text_record()
    return record


def run_peak(results: list[ResultEntry], process_peak: int | None = None, top: int = 5) -> dict[str, Any]:
    """The run's peak resident set and the result that set it, from ``results`` in the order they ran (each with
    ``memory.peak_rss_bytes``, the process's peak after it: it never falls). ``process_peak``: the peak at the end of
    the run, if it was read (it includes what ran after the last claim).

    ``set_by``: the first result after which the peak stood at its maximum, i.e. the claim (its fixtures included)
    during which the process reached it. ``rises``: the ``top`` results that raised the peak most, largest first, each
    with ``rise_bytes`` over the peak before it. Empty where no result recorded its memory."""
    before, peak, set_by, rises = 0, 0, None, []
    for r in results:
        after = r.get("memory", {}).get("peak_rss_bytes")
        if after is None:
            continue
        who = {"claim": r.get("claim", "?"), "profile": r.get("profile", "?"), "test": r.get("test", "")}
        if after > before:
            rises.append({**who, "rise_bytes": after - before, "peak_rss_bytes": after})
        if after > peak:
            peak, set_by = after, {**who, "peak_rss_bytes": after}
        before = max(before, after)
    if set_by is None:
        return {}
    out: dict[str, Any] = {"peak_rss_bytes": max(peak, process_peak or 0), "set_by": set_by}
    out["rises"] = sorted(rises, key=lambda x: -x["rise_bytes"])[:top]
    return out


#: Options of a run's command that select part of the claims (or break them on purpose): its peak is not a whole run's.
_PARTIAL = ("--claims", "-k", "-m", "--fault", "--stop-on-red", "--perturb")


def memory_need(record: dict[str, Any], device: str) -> dict[str, Any] | None:
    """What a whole run needs, as ``record`` measured it: its ``run.memory`` (the peak, the claim that set it) and when,
    where ``record`` is a finished run of every claim on a device of ``device``'s kind (``cpu``, ``cuda``); else None."""
    run = record.get("run") or {}
    mem = run.get("memory") or {}
    words = str(run.get("command", "")).split()
    if not mem.get("peak_rss_bytes") or run.get("interrupted") or any(w.split("=")[0] in _PARTIAL for w in words):
        return None
    if str(run.get("device", "")).split(":")[0] != str(device).split(":")[0]:
        return None
    return {**mem, "created": record.get("created", "?")}


def memory_warning(record: dict[str, Any], device: str, available: int, where: str) -> str | None:
    """One line when the memory available now (``available`` bytes) is less than the peak ``record`` measured for a
    whole run on this kind of device (``where``: the record's path, to cite); None when it is enough or unknown."""
    need = memory_need(record, device)
    if need is None or available <= 0 or available >= need["peak_rss_bytes"]:
        return None
    by = need.get("set_by") or {}
    return (f"the last whole run here peaked at {need['peak_rss_bytes'] / 2**30:.1f} GiB resident ({where}, {need['created']}"
            f"{', in ' + by['claim'] if by.get('claim') else ''}), and {available / 2**30:.1f} GiB is available now: the system may stop "
            "this run; free memory first, or run part of it with --claims")
