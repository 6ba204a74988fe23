"""The run record (JSON) and the errata report (Markdown) written after every run.

``build`` turns recorded results into a record: per claim ID its statement, book values, the
result on each profile, and the claim's overall verdict; plus the environment. ``markdown``
renders a record; it is a pure function of the record, so a checked-in record pins the format.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from . import __version__, registry
from .record import overall
from .registry import DEVIATES, NO_TEST, NOT_RUN, REPRODUCED, SHAPE_HOLDS, VERDICTS, fmt

RECORD_NAME = "run.json"
ERRATA_NAME = "errata.md"
SCHEMA = 1


def build(results: list[dict[str, Any]], environment: dict[str, str], run: dict[str, Any], tested: dict[str, list[str]]) -> dict[str, Any]:
    claims = {}
    for claim_id, claim in registry.load().items():
        mine = [r for r in results if r["claim"] == claim_id]
        if not mine and claim_id in tested:
            mine = [{"claim": claim_id, "profile": "-", "device": "-", "verdict": NOT_RUN, "reason": "its test was not selected in this run", "measured": {}, "checks": []}]
        claims[claim_id] = {
            "section": claim.section,
            "statement": claim.statement,
            "book": dict(claim.book),
            "units": dict(claim.units),
            "note": claim.note,
            "has_test": claim_id in tested,
            "verdict": overall(mine),
            "results": mine,
        }
    return {
        "schema": SCHEMA,
        "suite": f"cheapinfer {__version__}",
        "created": run.get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run": run,
        "environment": environment,
        "summary": dict(Counter(c["verdict"] for c in claims.values())),
        "claims": claims,
    }


def write(record: dict[str, Any], outdir: Path) -> tuple[Path, Path]:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    rec = outdir / RECORD_NAME
    rec.write_text(json.dumps(record, indent=1, sort_keys=False, default=str) + "\n", encoding="utf-8")
    md = outdir / ERRATA_NAME
    md.write_text(markdown(record), encoding="utf-8")
    return rec, md


def load(path: Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_NAME
    return json.loads(path.read_text(encoding="utf-8"))


_BADGE = {REPRODUCED: "reproduced", SHAPE_HOLDS: "shape holds", DEVIATES: "**DEVIATES**", NOT_RUN: "not run", NO_TEST: "no test yet"}


def _value(v: Any) -> str:
    return fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(_value(c)) for c in row) + " |" for row in rows]
    return out


def summary_table(record: dict[str, Any]) -> list[str]:
    counts: dict[str, Counter] = {}
    for c in record["claims"].values():
        counts.setdefault(c["section"], Counter())[c["verdict"]] += 1
    rows = []
    for key, title in registry.SECTIONS.items():
        if key in counts:
            rows.append([title] + [counts[key].get(v, 0) for v in VERDICTS] + [sum(counts[key].values())])
    total = Counter(c["verdict"] for c in record["claims"].values())
    rows.append(["**all**"] + [total.get(v, 0) for v in VERDICTS] + [sum(total.values())])
    return _table(["section", *VERDICTS, "claims"], rows)


def _result_lines(claim_id: str, claim: dict[str, Any], r: dict[str, Any]) -> list[str]:
    head = f"- **{r['profile']}** on {r['device']}: {_BADGE[r['verdict']]}"
    if r.get("perturbed"):
        head += " (book values perturbed on purpose with --perturb)"
    lines = [head]
    if r["verdict"] == NOT_RUN:
        lines.append(f"  - why: {r.get('reason') or 'unknown'}")
        return lines
    for chk in r.get("checks", []):
        status = "ok" if chk["passed"] else "FAILS"
        role = "asserted" if chk["asserted"] else "reported"
        lines.append(f"  - `{chk['q']}`: measured {_value(chk['measured'])}; expected {chk['expected']} — {status}, {role} ({chk['why']})")
    checked = {chk["q"] for chk in r.get("checks", [])}
    others = {k: v for k, v in r.get("measured", {}).items() if k not in checked}
    if others:
        lines.append("  - also measured: " + "; ".join(f"`{k}` {_value(v)}" for k, v in others.items()))
    for note in r.get("notes", []):
        lines.append(f"  - note: {note}")
    for w in r.get("warnings", []):
        lines.append(f"  - library warning: `{w}`")
    for t in r.get("tables", []):
        lines.append("")
        lines.append(f"  *{t['title']}*")
        lines.append("")
        lines += ["  " + row for row in _table(t["header"], t["rows"])]
        lines.append("")
    for fig in r.get("figures", []):
        lines.append(f"  ![{claim_id} {r['profile']}]({fig})")
    return lines


def markdown(record: dict[str, Any]) -> str:
    env = record["environment"]
    lines = [
        "# Errata report: Making inference cheap",
        "",
        f"Generated by {record['suite']} on {record['created']}. "
        f"Device: {record['run'].get('device', '?')}; CPU: {env.get('cpu', '?')}; GPU: {env.get('gpu', '?')}.",
        "",
        "Verdicts: *reproduced* — the book's digits hold within the stated tolerance; *shape holds* — the "
        "claim's invariant holds on a model or device where the digits cannot be expected (digits reported beside); "
        "*deviates* — a candidate erratum, or a regression of the libraries; *not run* — with the reason and what to do; "
        "*no test yet*.",
        "",
        "## Summary",
        "",
        *summary_table(record),
        "",
    ]
    deviating = [(cid, c) for cid, c in record["claims"].items() if c["verdict"] == DEVIATES]
    if deviating:
        lines += ["## Candidate errata", ""]
        for cid, c in deviating:
            for r in c["results"]:
                for chk in r.get("checks", []):
                    if chk["asserted"] and not chk["passed"]:
                        lines.append(
                            f"- **{cid}** ({r['profile']}, {r['device']}): `{chk['q']}` measured {_value(chk['measured'])}, "
                            f"the book's claim is {chk['expected']}. {c['statement']}"
                        )
        lines.append("")
    current = None
    for cid, c in record["claims"].items():
        if c["section"] != current:
            current = c["section"]
            lines += [f"## {registry.SECTIONS[current]}", ""]
        lines.append(f"### {cid} — {_BADGE[c['verdict']]}")
        lines.append("")
        lines.append(f"> {c['statement']}")
        lines.append("")
        if c["book"]:
            units = c.get("units", {})
            lines.append("Book: " + "; ".join(f"`{k}` = {_value(v)}{(' ' + units[k]) if k in units else ''}" for k, v in c["book"].items()))
            lines.append("")
        if c.get("note"):
            lines += [c["note"], ""]
        if c["verdict"] == NO_TEST:
            lines += ["No test yet.", ""]
            continue
        for r in c["results"]:
            lines += _result_lines(cid, c, r)
        lines.append("")
    lines += ["## Environment", "", *_table(["what", "value"], [[k, v] for k, v in env.items()]), ""]
    lines += ["## Run", "", *_table(["what", "value"], [[k, v] for k, v in record["run"].items()]), ""]
    return "\n".join(lines)
