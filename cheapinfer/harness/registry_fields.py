"""Two fields of a registry check beyond its tolerance.

- ``reads`` and ``guards``: a *cross-check* (a check that vouches for other quantities of its claim: a property of the
  quantizer for the error table, a calibration for a count) names in ``reads`` the measured path it is read off, the
  dotted name of the function whose result both it and the quantities it ``guards`` are derived from
  (``reads = "cheapinfer.chapter.quantization.quant_error.error_table"``, ``guards = ["tensor_over_row"]``). A check computed on
  another path than the number it guards (a fresh call of the quantizer beside the table) vouches for nothing:
  ``tests/test_crosscheck_paths.py`` runs each such claim's measurement on a tiny input with that function's results
  perturbed and fails where the check or a guarded quantity does not move with them, and the claim itself says so in
  its ``cross_checks_read_path``.
- ``draws``: the check's quantity comes from a seeded workload; it is judged by :data:`DRAWS_RULE`.
- ``fault``: the check's teeth, the catalogue's fault under which this check itself fails (not only its claim). The
  fault sweep (``cheapinfer faults``) runs the check's claim under it in every run and fails where the check holds
  there: a check that passes both on the correct system and under its own fault tests nothing
  (:data:`FAULT_RULE`; ``tests/test_faults.py`` holds that the fault exists and names the check's claim).
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

#: The fewest seeded draws a claim whose number comes from one seeded workload is judged on.
DRAWS_MIN = 100
#: The rule for every check whose quantity comes from a seeded workload (``draws = N`` in the registry).
DRAWS_RULE = (
    "a number of the book that comes from one seeded workload is measured on that workload and on N >= 100 other "
    "seeded draws of it (its generator with the same parameters, seeds SEED + 1 to SEED + N). The check is judged on "
    "the median over them; the record holds the median as <q>, its 5th and 95th percentiles as <q>_p05 and <q>_p95, "
    "the workloads as <q>_draws and the share of them on which the check holds as <q>_share_holding. A measurement "
    "without that distribution fails the check. The seeded workload's own value is reported as seeded_<q>; a check "
    "judged on it alone is named so and tests a mechanism (a direction within its noise), not the book's number"
)
#: The rule the fault sweep applies to every check that names its ``fault``.
FAULT_RULE = (
    "a check that names its fault must fail under it: in every run of the fault sweep its claim is run under that "
    "fault to the end (never stopped at an earlier red claim), and a run in which the check holds, or is not judged, "
    "fails the sweep"
)
#: A fault's name in the catalogue: lower-case words joined by hyphens.
_FAULT_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)+")
#: Where a cross-check's path may lie: the measured code (the chapter's measurements, the runtime they run on).
_PATH = re.compile(r"cheapinfer\.(chapter|runtime)(\.[a-z_][a-z0-9_]*)+")


def check_fields(claim_id: str, raw: Mapping[str, Any], error: type[Exception]) -> None:
    """Validate a check's ``reads``, ``guards`` and ``draws`` (raises ``error`` with one line naming the claim and check)."""
    q = raw.get("q")
    reads, guards = raw.get("reads"), raw.get("guards")
    if reads is not None and (not isinstance(reads, str) or not _PATH.fullmatch(reads)):
        raise error(f"{claim_id}: cross-check {q!r} reads {reads!r}, which is no dotted name of a function under cheapinfer.chapter or cheapinfer.runtime")
    if (reads is None) != (guards is None):
        raise error(f"{claim_id}: check {q!r}: a cross-check names both the path it reads ('reads') and the quantities it vouches for ('guards')")
    if guards is not None and (not isinstance(guards, list) or not guards or not all(isinstance(g, str) and g for g in guards) or q in guards):
        raise error(f"{claim_id}: cross-check {q!r}: 'guards' must list the other quantities of the claim it vouches for")
    draws = raw.get("draws")
    if draws is not None and (isinstance(draws, bool) or not isinstance(draws, int) or draws < DRAWS_MIN):
        raise error(f"{claim_id}: check {q!r}: 'draws' must be a whole number of seeded draws, at least {DRAWS_MIN}, not {draws!r}")
    if draws is not None and (raw.get("searched") or raw.get("measurable")):
        raise error(f"{claim_id}: check {q!r}: a searched or measurable condition is not judged over draws")
    fault = raw.get("fault")
    if fault is not None and (not isinstance(fault, str) or not _FAULT_NAME.fullmatch(fault)):
        raise error(f"{claim_id}: check {q!r}: 'fault' must name one fault of the catalogue (words joined by hyphens), not {fault!r}")


def field_values(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The values of a validated check's ``reads``, ``guards``, ``draws`` and ``fault``, as :class:`Check` takes them."""
    return {"reads": str(raw.get("reads", "")), "guards": tuple(raw.get("guards", ())), "draws": int(raw.get("draws", 0)),
            "fault": str(raw.get("fault", ""))}


def distribution_given(q: str, draws: int, measured: Mapping[str, Any]) -> bool:
    """Whether a measurement judged over ``draws`` seeded draws hands its distribution (:data:`DRAWS_RULE`): at least that
    many draws, finite 5th and 95th percentiles around the median, and the share of draws holding in [0, 1]."""
    values = [measured.get(k) for k in (f"{q}_p05", q, f"{q}_p95", f"{q}_draws", f"{q}_share_holding")]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        return False
    p05, median, p95, n, share = values
    return n >= draws and p05 <= median <= p95 and 0 <= share <= 1


def check_guards(claim_id: str, checks: list[Any], error: type[Exception]) -> None:
    """Every quantity a cross-check of the claim guards is named by a check of that claim."""
    unguarded = sorted({g for c in checks for g in c.guards} - {c.q for c in checks})
    if unguarded:
        raise error(f"{claim_id}: a cross-check guards {unguarded}, which no check of this claim names")
