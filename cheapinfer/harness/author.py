"""The author's list at the head of errata.md, and errata.json: every graded finding with its place in each
translation, its printed words and their replacement (cheapinfer/errata.toml, placed by :mod:`.locate`), the
grade :data:`.grades.GRADE_RULE` gives it, and whether this run measured it again.

:func:`text_record` reads the chapter's translations once, when the record is built; the rest are pure
functions of the record.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from . import explanations, grades, locate, tables, textchecks
from .errata import confirmed_errata, recorded_errata
from .schema import RunRecord

EVIDENCE_NAME = "evidence.md"
JSON_NAME = "errata.json"


def anchor(claim_id: str) -> str:
    """The claim's anchor in evidence.md."""
    return claim_id.lower()


def _checks(text: str, lang: str, entries: list[locate.Entry]) -> dict[str, Any]:
    units = next(e for e in entries if e.id == "units")
    return {
        "round_words": [{"id": w.id, "line": w.line, "word": w.word, "stated": w.stated, "value": w.value, "whole": w.whole,
                         "grade": w.grade, "verdict": w.verdict} for w in textchecks.round_words(text, lang)],
        "units": textchecks.unit_findings(text, lang, units),
        "formulas": textchecks.formula_findings(text),
    }


def text_record(seeds: Path = locate.SEEDS) -> dict[str, Any]:
    """What the record keeps of the chapter's text: each entry with its lines in each translation found here (an
    occurrence whose quote is not found exactly once keeps the reason instead of a line), and the text checks.
    A data file that does not load gives no entries and its reason (the record is still written)."""
    try:
        entries = locate.entries()
    except (locate.LocateError, OSError, ValueError) as exc:
        return {"translations": {}, "missing": f"cheapinfer/errata.toml does not load: {exc}", "entries": [], "checks": {}, "changes": []}
    texts: dict[str, tuple[str, str]] = {}
    if seeds.is_dir():
        for f in sorted(seeds.glob("*.txt")):
            text = f.read_text(encoding="utf-8")
            try:
                texts.setdefault(locate.language_of(text, entries), (f.name, text))
            except locate.LocateError:
                continue
    out: dict[str, Any] = {"translations": {lang: name for lang, (name, _) in texts.items()},
                           "missing": "" if texts else f"the chapter's translations were not found ({seeds.name}/ beside the checkout): no lines",
                           "entries": [], "checks": {}, "changes": []}
    for e in entries:
        occ = []
        for o in e.occurrences:
            lines, errors = {}, {}
            for lang, (_, text) in texts.items():
                try:
                    lines[lang] = locate.line_of(text, o.quotes[lang])
                except locate.LocateError as exc:
                    errors[lang] = str(exc)
            occ.append({"lines": lines, "errors": errors, "quotes": dict(o.quotes), "replacements": dict(o.replacements),
                        "changes": {lang: o.changes(lang) for lang in locate.LANGUAGES}})
        out["entries"].append({"id": e.id, "title": e.title, "grade": e.grade, "basis": e.basis, "claim": e.claim,
                               "erratum": e.erratum, "finding": e.finding, "occurrences": occ})
    for lang, (_, text) in texts.items():
        try:
            out["checks"][lang] = _checks(text, lang, entries)
        except locate.LocateError as exc:
            out["checks"][lang] = {"error": str(exc)}
    out["changes"] = tomllib.loads(locate.DATA.read_text(encoding="utf-8")).get("change", [])
    return out


def _status(record: RunRecord, entry: dict[str, Any]) -> str:
    cid = entry["claim"]
    if cid and entry["erratum"] is None and entry.get("id") in _contradicted():
        return f"found by checking the chapter's explanation against {cid}'s measurement (cheapinfer/explanations.toml)"
    if not cid or entry["erratum"] is None:
        return "found in the chapter's text by the text checks (no measurement needed)"
    claim = record["claims"].get(cid)
    if claim is None:
        return f"{cid} is not in this run's record"
    documented = recorded_errata(claim)
    mine = documented[entry["erratum"]] if entry["erratum"] < len(documented) else None
    if any(c == cid and e == mine for c, _, e, _ in confirmed_errata(record)):
        return "measured again in this run: confirmed"
    return f"not confirmed in this run ({tables.BADGE.get(claim['verdict'], claim['verdict'])})"


def _contradicted() -> set[str]:
    """The errata entries that place an explanation the suite's measurement contradicts (cheapinfer/explanations.toml)."""
    return {s.errata for s in explanations.sentences() if s.verdict == "contradicted"}


def _claim_link(record: RunRecord, entry: dict[str, Any]) -> str:
    if not entry["claim"]:
        return "No claim"
    return f"[{entry['claim']}]({EVIDENCE_NAME}#{anchor(entry['claim'])})" if entry["claim"] in record["claims"] else entry["claim"]


def _place(occ: dict[str, Any], lang: str) -> str:
    if lang in occ["lines"]:
        return str(occ["lines"][lang])
    return "**not found**" if lang in occ["errors"] else "—"


def entry_lines(record: RunRecord, n: int, entry: dict[str, Any]) -> list[str]:
    lines = [f"### {n}. {entry['title']} — {entry['grade']}", "",
             f"{_claim_link(record, entry)}: {_status(record, entry)}. {entry['finding']}", ""]
    rows = []
    for occ in entry["occurrences"]:
        row = []
        for lang in locate.LANGUAGES:
            new = tables.code_span(occ["replacements"][lang]) if occ["changes"][lang] else "unchanged (listed, right as printed)"
            row += [_place(occ, lang), tables.code_span(occ["quotes"][lang]), new]
        rows.append(row)
    lines += tables.markdown_table(["nl line", "nl printed", "nl replacement", "vi line", "vi printed", "vi replacement"], rows)
    for occ in entry["occurrences"]:
        for lang, why in occ["errors"].items():
            lines.append(f"- **Not placed in the {lang} text:** {why}")
    return lines + [""]


def author_lines(record: RunRecord) -> list[str]:
    """The graded list: the rule, each entry with its places, the notes, the round words, the closing note."""
    text = record.get("text")
    if not text:
        return []
    order = [g for _, g, _ in reversed(grades.GRADE_RULE)]  # erratum first, then inconsistency, ...
    graded = sorted((e for e in text["entries"] if e["grade"] != "note"), key=lambda e: order.index(e["grade"]))
    notes = [e for e in text["entries"] if e["grade"] == "note"]
    lines = ["## Errata for the author", "",
             "Each entry gives its place in both translations (the line, found from the printed words), the words as printed and "
             "their replacement; `python -m cheapinfer errata --chapter FILE -o errata.patch` writes them as a patch. "
             f"The evidence of each claim is in [{EVIDENCE_NAME}]({EVIDENCE_NAME}). " + (text["missing"] or
             "Translations: " + ", ".join(f"{lang} {name}" for lang, name in text["translations"].items()) + "."), "",
             "Grades follow one rule (the first question that applies): " +
             "; ".join(f"*{g}*, {why}" for _, g, why in grades.GRADE_RULE) + ". " + grades.ROUND_WORD_RULE, "",
             *tables.markdown_table(["grade", "entries", "places"],
                                    [[g, sum(e["grade"] == g for e in text["entries"]), sum(len(e["occurrences"]) for e in text["entries"] if e["grade"] == g)]
                                     for _, g, _ in grades.GRADE_RULE]), ""]
    for n, e in enumerate(graded, 1):
        lines += entry_lines(record, n, e)
    if notes:
        lines += ["## Notes", "", "Documented, not errata: the evidence does not show the printed value wrong.", ""]
        for n, e in enumerate(notes, 1):
            lines += entry_lines(record, n, e)
    checks = text["checks"].get("nl") or next(iter(text["checks"].values()), None)
    if checks and "round_words" in checks:
        lines += ["## Round words", "", "Every round word the text checks measure, by the round-word rule (Dutch line):", "",
                  *tables.markdown_table(["line", "word", "states", "the printed numbers give", "verdict"],
                                         [[w["line"], w["word"], w["stated"], "—" if w["value"] is None else f"{w['value']:.4g}", w["verdict"]]
                                          for w in checks["round_words"]]), ""]
    for lang, c in text["checks"].items():
        if "error" in c:
            lines += [f"- **Text checks not run on the {lang} text:** {c['error']}", ""]
    return lines


def closing_lines(record: RunRecord) -> list[str]:
    text = record.get("text")
    if not text or not text.get("changes"):
        return []
    lines = ["## Closing note: changes of grade and new findings", ""]
    lines += [f"- **{c['entry']}**: {c['before']} → {c['after']}: {c['reason']}." for c in text["changes"]]
    return lines + [""]


def json_entries(record: RunRecord) -> list[dict[str, Any]]:
    """errata.json: one object per entry, with its grade, claim, places, quotes, replacements and evidence."""
    out = []
    for e in (record.get("text") or {}).get("entries", []):
        evidence: dict[str, Any] = {"finding": e["finding"], "status": _status(record, e)}
        claim = record["claims"].get(e["claim"]) if e["claim"] else None
        if claim is not None and e["erratum"] is not None:
            documented = recorded_errata(claim)
            if e["erratum"] < len(documented):
                doc = documented[e["erratum"]]
                evidence.update(says=doc["says"], holds=doc["holds"], assumption=doc["assumption"])
                evidence["measured"] = [{"profile": r["profile"], "device": r["device"], "q": chk["q"], "measured": chk["measured"], "expected": chk["expected"]}
                                        for r in claim.get("results", []) for chk in r.get("checks", []) if chk["q"] in doc["fails"]]
        out.append({"id": e["id"], "grade": e["grade"], "basis": e["basis"], "claim": e["claim"], "title": e["title"],
                    "locations": [occ["lines"] for occ in e["occurrences"]],
                    "quotes": [occ["quotes"] for occ in e["occurrences"]],
                    "replacements": [occ["replacements"] for occ in e["occurrences"]], "evidence": evidence})
    return out
