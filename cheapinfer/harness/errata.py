"""Which errata a run record shows: the errata the registry documents for a claim, the confirmed ones that held in
the run, and the candidate errata (claims that deviate). Pure functions of a record; the report renders them
(:mod:`cheapinfer.harness.errata_sections`).
"""

from __future__ import annotations

from typing import Any, Mapping

from .numbers import value_text
from .schema import ResultEntry, RunRecord
from .vocabulary import DEVIATES, ERRATUM


def recorded_errata(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A run record's claim entry's errata (records of schema 1 held the first under ``erratum`` too, or only: read
    through :func:`cheapinfer.harness.schema.read_record`, they hold them under ``errata``)."""
    return list(claim.get("errata", []))


# ----------------------------------------------------------------------------------------------
# candidate errata
# ----------------------------------------------------------------------------------------------


def _conclusion(r: ResultEntry, failures: list[dict[str, Any]]) -> str:
    if any(f.get("stale") for f in failures):
        return (
            "A confirmed erratum no longer holds: the book's digits reproduce here. Either a library or the setup changed "
            "(compare with a run on the pinned versions), or the erratum was wrong: revise its registry entry."
        )
    if r.get("perturbed"):
        return (
            "The book's values were moved beyond their tolerance on purpose (`--perturb`): this entry shows "
            "that the check can fail. It is not an erratum."
        )
    if any(f["kind"] == "digits" for f in failures):
        measured = "; ".join(f"{f['q']} = {value_text(f['measured'])}" for f in failures if f["kind"] == "digits")
        return (
            f"The book's number does not hold on the {r['profile']} profile, where its digits are expected. "
            f"If the environment below matches the book's setup, the sentence is a candidate erratum and should give "
            f"the measured value ({measured}). If a library changed since the pinned versions, compare with a run on "
            "the pinned versions (`python -m cheapinfer compare`) before filing it."
        )
    return (
        f"The chapter's qualitative conclusion does not hold on the {r['profile']} profile ({r['device']}). Either the "
        "claim does not carry over to this model or device (the book should say where it holds), or a library update "
        "changed the behaviour: compare with a run on the pinned versions (`python -m cheapinfer compare`)."
    )


def candidate_errata(record: RunRecord) -> list[dict[str, Any]]:
    """One entry per result with a failed asserted check: what was measured, how, what a reader should conclude.

    Results deviating because their book values were perturbed on purpose come last.
    """
    out = []
    for cid, c in record["claims"].items():
        for r in c["results"]:
            if r["verdict"] != DEVIATES:
                continue  # a confirmed erratum is listed under "Errata", with its evidence
            failures = [
                {**{k: chk[k] for k in ("q", "kind", "measured", "expected", "why")}, "stale": bool(chk.get("documented"))}
                for chk in r.get("checks", [])
                if chk["asserted"] and (not chk["passed"]) != bool(chk.get("documented"))
            ]
            if failures:
                out.append(
                    {
                        "claim": cid,
                        "profile": r["profile"],
                        "device": r["device"],
                        "test": r.get("test", ""),
                        "perturbed": bool(r.get("perturbed")),
                        "failures": failures,
                        "notes": list(r.get("notes", [])),
                        "conclusion": _conclusion(r, failures),
                    }
                )
    return sorted(out, key=lambda e: e["perturbed"])


def confirmed_errata(record: RunRecord) -> list[tuple[str, dict[str, Any], dict[str, Any], list[dict[str, Any]]]]:
    """(claim ID, claim, erratum, results) for every documented erratum that held in this run: the results
    with verdict erratum on one of its profiles, where a check it documents failed as documented."""
    out = []
    for cid, c in record["claims"].items():
        for e in recorded_errata(c):
            rs = [r for r in c.get("results", []) if r["verdict"] == ERRATUM and r["profile"] in e["profiles"]
                  and any(chk.get("documented") and chk["q"] in e["fails"] for chk in r.get("checks", []))]
            if rs:
                out.append((cid, c, e, rs))
    return out
