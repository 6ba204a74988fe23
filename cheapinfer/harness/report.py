"""The reports rendered from a run record: ``errata.md`` (the author's list), ``evidence.md``, ``errata.json``.

``markdown`` and ``evidence_markdown`` render a record; they are pure functions of the record (no clock, no registry,
no machine), so a checked-in record pins the format (tests/data/run-record.json -> tests/data/errata-snapshot.md).
``write`` renders them and replaces the latest ``run.json`` and reports together (:func:`cheapinfer.harness.store.atomic_write`).
The record is built by :func:`cheapinfer.harness.record.build` and kept by :mod:`cheapinfer.harness.store`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import author, errata_sections, store, tables
from .numbers import fmt, value_text
from .schema import RECORD_NAME, ClaimEntry, ResultEntry, RunRecord
from .vocabulary import KEY_ENVIRONMENT, NO_TEST, NOT_RUN, SHAPE_HOLDS


def write(record: RunRecord, outdir: Path) -> tuple[Path, Path]:
    """The latest record and reports (``run.json``; ``errata.md``, the author's list; ``evidence.md``; ``errata.json``),
    replaced together: all are written in full before any is renamed into place, so a failure (a full disk) leaves
    the previous set as it was."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    rec, md = outdir / RECORD_NAME, outdir / store.ERRATA_NAME
    store.atomic_write((rec, store.record_json(record)), (md, markdown(record)), (outdir / author.EVIDENCE_NAME, evidence_markdown(record)),
                       (outdir / author.JSON_NAME, json.dumps(author.json_entries(record), indent=1, ensure_ascii=False, default=str) + "\n"))
    return rec, md


# ----------------------------------------------------------------------------------------------
# per section and per claim
# ----------------------------------------------------------------------------------------------


def _book_cell(claim: ClaimEntry) -> str:
    units = claim.get("units", {})
    return "; ".join(f"{k} {tables.with_unit(v, units.get(k))}" for k, v in claim["book"].items()) or "—"


def _compact_rows(cid: str, claim: ClaimEntry) -> list[list[Any]]:
    if claim["verdict"] == NO_TEST or not claim["results"]:
        return [[cid, _book_cell(claim), "—", "—", tables.BADGE[NO_TEST], "—"]]
    rows = []
    for r in claim["results"]:
        where = "—" if r["profile"] == "-" else r["profile"] if r["device"] in ("-", "") else f"{r['profile']} ({r['device']})"
        checks = r.get("checks", [])
        if r["verdict"] == NOT_RUN or not checks:
            rows.append([cid, _book_cell(claim), "—", "—", tables.BADGE[r["verdict"]], where])
            continue
        seen: dict[str, Any] = {}
        for chk in checks:
            seen.setdefault(chk["q"], chk["measured"])
        measured = "; ".join(f"{q} {tables.with_unit(v, claim.get('units', {}).get(q))}" for q, v in seen.items())
        tolerance = "; ".join(chk["expected"] + tables.check_mark(chk) for chk in checks)
        verdict = tables.BADGE[r["verdict"]] + (" (perturbed)" if r.get("perturbed") else "")
        rows.append([cid, _book_cell(claim), measured, tolerance, verdict, where])
    # One claim, several profiles: name the claim and its book values once.
    return [row if i == 0 else ["", "", *row[2:]] for i, row in enumerate(rows)]


def _result_lines(claim_id: str, claim: ClaimEntry, r: ResultEntry) -> list[str]:
    head = f"- **{r['profile']}** on {r['device']}: {tables.BADGE[r['verdict']]}" if r["profile"] != "-" else f"- {tables.BADGE[r['verdict']]}"
    if r.get("perturbed"):
        head += " (book values perturbed on purpose with --perturb)"
    lines = [head]
    if r["verdict"] == NOT_RUN:
        lines.append(f"  - why: {r.get('reason') or 'unknown'}")
        return lines
    for chk in r.get("checks", []):
        status = "undecided" if chk.get("decided") is False else "ok" if chk["passed"] else "FAILS"
        role = "asserted" if chk["asserted"] else "reported"
        noise = f" ± {value_text(chk['se'])} ({tables.noise_words(chk)})" if chk.get("se") is not None else ""
        lines.append(f"  - `{chk['q']}`: measured {value_text(chk['measured'])}{noise}; expected {chk['expected']} — {status}, {role} ({chk['why']})")
    checked = {chk["q"] for chk in r.get("checks", [])}
    others = {k: v for k, v in r.get("measured", {}).items() if k not in checked}
    if others:
        lines.append("  - also measured: " + "; ".join(f"`{k}` {value_text(v)}" for k, v in others.items()))
    for note in r.get("notes", []):
        lines.append(f"  - note: {note}")
    for w in r.get("warnings", []):
        lines.append(f"  - library warning: {tables.code_span(w)}")
    if r.get("test"):
        lines.append(f"  - test: `{r['test']}`" + (f" ({fmt(r['seconds'])} s)" if r.get("seconds") else ""))
    for t in r.get("tables", []):
        lines.append("")
        lines.append(f"  *{t['title']}*")
        lines.append("")
        lines += ["  " + row for row in tables.markdown_table(t["header"], t["rows"])]
        lines.append("")
    for fig in r.get("figures", []):
        if lines[-1]:
            lines.append("")
        lines.append(f"  ![{claim_id} on {r['profile']}: {Path(fig).stem}]({fig})")
    return lines


def _figures(record: RunRecord) -> list[tuple[str, str, str]]:
    out = []
    for cid, c in record["claims"].items():
        for r in c["results"]:
            for fig in r.get("figures", []):
                out.append((fig, cid, r["profile"]))
    return out


def _head(record: RunRecord, title: str) -> list[str]:
    env = record["environment"]
    versions = ", ".join(f"{k} {env[k]}" for k in KEY_ENVIRONMENT[4:] if k in env)
    return [
        f"# {title}: Making inference cheap",
        "",
        f"Generated by {record['suite']} on {record['created']}. "
        f"Device: {record['run'].get('device', '?')}; CPU: {env.get('cpu', '?')}; GPU: {env.get('gpu', '?')}"
        f" (driver {env.get('driver', '?')}, CUDA {env.get('cuda', '?')}); {versions}.",
        "",
        "Verdicts: *reproduced* — the book's digits hold within the stated tolerance; *" + tables.BADGE[SHAPE_HOLDS] + "* — on a "
        "stand-in or twin model, where the book's digits cannot be expected, the claim's invariant holds: the book's measured numbers "
        "were not run and are not confirmed; *erratum* — a confirmed erratum: the book's digits fail as the registry documents, with "
        "evidence; *inconclusive* — the measurement could not decide (a margin within its noise, or a range it could not search "
        "further), never an erratum; *deviates* — a candidate erratum, or a regression of the libraries; *not run* — with "
        "the reason and what to do; *no test yet*.",
        "",
    ]


def _not_run_lines(record: RunRecord) -> list[str]:
    by_reason: dict[str, list[str]] = {}  # one line per reason: the claims that need the book's weights are one line
    for cid, c in record["claims"].items():
        for why in dict.fromkeys(r.get("reason") or "no reason recorded" for r in c.get("results", []) if r["verdict"] == NOT_RUN):
            by_reason.setdefault(why, []).append(cid)
    rows = [f"- **{', '.join(ids)}**{f' ({len(ids)} claims)' if len(ids) > 1 else ''}: {why}" for why, ids in by_reason.items()]
    untested = [cid for cid, c in record["claims"].items() if c["verdict"] == NO_TEST]
    rows += [f"- No test yet: {', '.join(untested)}."] if untested else []
    return ["## Not run", "", *rows, ""] if rows else []


def markdown(record: RunRecord) -> str:
    """errata.md, the author's list: summary, graded entries with their places, candidate errata, inconclusive, not run."""
    lines = [*_head(record, "Errata report"), "## Summary", "", *tables.summary_table(record), ""]
    lines += author.author_lines(record)
    lines += errata_sections.errata_lines(record)
    lines += errata_sections.inconclusive_lines(record)
    lines += _not_run_lines(record)
    lines += errata_sections.fault_lines(record) if record.get("fault_run") else [
        "## Fault coverage", "", "No faults run is recorded: `python -m cheapinfer faults` measures which claims each known fault turns red.", ""]
    lines += author.closing_lines(record)
    return "\n".join(lines)


def evidence_markdown(record: RunRecord) -> str:
    """evidence.md: each claim's evidence (anchored by its ID, lower case), the confirmed errata's, figures, environment."""
    env = record["environment"]
    lines = [*_head(record, "Evidence"), f"The author's list is in [{store.ERRATA_NAME}]({store.ERRATA_NAME}).", ""]
    lines += errata_sections.confirmed_lines(record)
    figures = _figures(record)
    if figures:
        lines += ["## Figures", ""]
        lines += [f"- [{Path(fig).name}]({fig}): {cid} on {profile}" for fig, cid, profile in figures]
        lines.append("")
    sections = tables.section_titles(record)
    by_section: dict[str, list[str]] = {}
    for cid, c in record["claims"].items():
        by_section.setdefault(c["section"], []).append(cid)
    for key in [*sections, *(k for k in by_section if k not in sections)]:
        if key not in by_section:
            continue
        ids = by_section[key]
        lines += [f"## {sections.get(key, key)}", ""]
        rows = [row for cid in ids for row in _compact_rows(cid, record["claims"][cid])]
        lines += [*tables.markdown_table(["claim", "book", "measured", "tolerance", "verdict", "profile"], rows), ""]
        untested = [cid for cid in ids if record["claims"][cid]["verdict"] == NO_TEST]
        for cid in ids:
            c = record["claims"][cid]
            if cid in untested:
                continue
            lines += [f'<a id="{author.anchor(cid)}"></a>', ""]
            lines.append(f"### {cid} — {tables.BADGE[c['verdict']]}")
            lines.append("")
            lines.append(f"> {c['statement']}")
            lines.append("")
            if c["book"]:
                units = c.get("units", {})
                lines.append("Book: " + "; ".join(
                    f"`{k}` = {tables.with_unit(v, units.get(k))}" + (f" ({tables.printed_text(c, k)})" if tables.printed_text(c, k) else "")
                    for k, v in c["book"].items()))
                lines.append("")
            if c.get("note"):
                lines += [c["note"], ""]
            for r in c["results"]:
                lines += _result_lines(cid, c, r)
            lines.append("")
        if untested:
            lines += ["No test yet:", ""]
            lines += [f"- **{cid}**: {record['claims'][cid]['statement']}" for cid in untested]
            lines.append("")
    lines += ["## Environment", "", *tables.markdown_table(["what", "value"], [[k, str(v)] for k, v in env.items()]), ""]
    lines += ["## Run", "", *tables.markdown_table(["what", "value"], [[k, str(v)] for k, v in record["run"].items()]), ""]
    return "\n".join(lines)
