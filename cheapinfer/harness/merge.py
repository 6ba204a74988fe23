"""``python -m cheapinfer merge``: several runs' records (one per machine) as one claims x machines matrix
(Markdown; ``--json`` for JSON), each machine labelled by its GPU (or CPU) name and the versions of torch,
transformers and bitsandbytes, and listed with the release of the suite that made its record (``suite``). ``-o FILE`` overwrites only a matrix ``merge`` wrote earlier (the Markdown
matrix begins with :data:`MATRIX_MARK`), never one of the records or any other file, unless ``--force``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .numbers import value_text
from .schema import ClaimEntry, RunRecord
from .tables import machine_label, markdown_table, section_key
from .vocabulary import DEVIATES, KEY_ENVIRONMENT, NOT_RUN, VERDICTS

# ----------------------------------------------------------------------------------------------
# merge
# ----------------------------------------------------------------------------------------------


def _labels(records: list[RunRecord]) -> list[str]:
    labels: list[str] = []
    for rec in records:
        base = machine_label(rec.get("environment", {}))
        label, n = base, 1
        while label in labels:
            n += 1
            label = f"{base} #{n}"
        labels.append(label)
    return labels


def _cell(claim: ClaimEntry | None) -> str:
    """Overall verdict, then for each profile that ran its first failed check, else its first asserted one."""
    if claim is None:
        return "—"
    verdict = claim["verdict"]
    parts = []
    for r in claim.get("results", []):
        checks = [c for c in r.get("checks", []) if c["asserted"]]
        if r["verdict"] != NOT_RUN and checks:
            shown = next((c for c in checks if not c["passed"]), checks[0])
            parts.append(f"{r['profile']}: {shown['q']} {value_text(shown['measured'])}")
    text = f"**{verdict}**" if verdict == DEVIATES else verdict
    return text + (" (" + "; ".join(parts) + ")" if parts else "")


def merge(records: list[RunRecord], sources: list[str]) -> dict[str, Any]:
    """Several run records as one claim x machine matrix (JSON-ready)."""
    labels = _labels(records)
    machines = [
        {"label": label, "source": src, "suite": rec.get("suite", "?"), "created": rec.get("created", ""), "device": rec.get("run", {}).get("device", ""),
         "environment": rec.get("environment", {})}
        for label, rec, src in zip(labels, records, sources)
    ]
    ids: list[str] = []
    for rec in records:
        ids += [cid for cid in rec["claims"] if cid not in ids]
    claims = {}
    for cid in ids:
        first = next(rec["claims"][cid] for rec in records if cid in rec["claims"])
        claims[cid] = {
            "section": section_key(first["section"]),
            "statement": first["statement"],
            "book": first.get("book", {}),
            "machines": {
                label: (
                    {"verdict": rec["claims"][cid]["verdict"], "results": [
                        {k: r.get(k) for k in ("profile", "device", "verdict", "measured", "reason")} for r in rec["claims"][cid].get("results", [])
                    ]}
                    if cid in rec["claims"] else None
                )
                for label, rec in zip(labels, records)
            },
        }
    summary = {label: dict(Counter(c["verdict"] for c in rec["claims"].values())) for label, rec in zip(labels, records)}
    return {"machines": machines, "summary": summary, "claims": claims}


#: The first line of every Markdown matrix: ``merge -o`` overwrites a Markdown file only when it begins with it.
MATRIX_MARK = "<!-- claims x machines matrix, written by python -m cheapinfer merge -->"


def merge_markdown(records: list[RunRecord], sources: list[str]) -> str:
    matrix = merge(records, sources)
    labels = [m["label"] for m in matrix["machines"]]
    lines = [MATRIX_MARK, "# Claims x machines", "", "## Machines", ""]
    lines += markdown_table(
        ["machine", "suite", "device", *KEY_ENVIRONMENT, "created", "record"],
        [[m["label"], m["suite"], m["device"], *(m["environment"].get(k, "?") for k in KEY_ENVIRONMENT), m["created"], m["source"]] for m in matrix["machines"]],
    )
    lines += ["", "## Summary", ""]
    lines += markdown_table(["verdict", *labels], [[v, *(matrix["summary"][label].get(v, 0) for label in labels)] for v in VERDICTS])
    lines += ["", "## Claims", ""]
    rows = []
    for cid in matrix["claims"]:
        rows.append([cid, *(_cell(rec["claims"].get(cid)) for rec in records)])
    lines += markdown_table(["claim", *labels], rows)
    lines.append("")
    return "\n".join(lines)
