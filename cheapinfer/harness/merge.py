"""``python -m cheapinfer merge``: several runs' records (one per machine) as one claims x machines matrix
(Markdown; ``--json`` for JSON), each machine labelled by its GPU (or CPU) name and the versions of torch,
transformers and bitsandbytes. ``-o FILE`` overwrites only a matrix ``merge`` wrote earlier (the Markdown
matrix begins with :data:`MATRIX_MARK`), never one of the records or any other file, unless ``--force``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from ..runtime.cli import Parser, path_arg, printable
from ..runtime.files import loads_strict, read_bounded, why_not_a_directory
from .registry import DEVIATES, NOT_RUN, VERDICTS
from .report import KEY_ENVIRONMENT
from .tables import machine_label, markdown_table
from . import compare, processes, report, schema
from .schema import ClaimEntry, RunRecord

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
            parts.append(f"{r['profile']}: {shown['q']} {compare.short_value(shown['measured'])}")
    text = f"**{verdict}**" if verdict == DEVIATES else verdict
    return text + (" (" + "; ".join(parts) + ")" if parts else "")


def merge(records: list[RunRecord], sources: list[str]) -> dict[str, Any]:
    """Several run records as one claim x machine matrix (JSON-ready)."""
    labels = _labels(records)
    machines = [
        {"label": label, "source": src, "created": rec.get("created", ""), "device": rec.get("run", {}).get("device", ""), "environment": rec.get("environment", {})}
        for label, rec, src in zip(labels, records, sources)
    ]
    ids: list[str] = []
    for rec in records:
        ids += [cid for cid in rec["claims"] if cid not in ids]
    claims = {}
    for cid in ids:
        first = next(rec["claims"][cid] for rec in records if cid in rec["claims"])
        claims[cid] = {
            "section": first["section"],
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
        ["machine", "device", *KEY_ENVIRONMENT, "created", "record"],
        [[m["label"], m["device"], *(m["environment"].get(k, "?") for k in KEY_ENVIRONMENT), m["created"], m["source"]] for m in matrix["machines"]],
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


def _why_no_output(path: Path) -> str:
    """Why ``-o path`` can take no file, naming the real cause (a directory, a symlink loop), or "" (an existing file
    is judged by the overwrite check)."""
    if path.is_dir():
        return "it is a directory"
    return "" if path.exists() else why_not_a_directory(path)


def merge_cli(argv: list[str]) -> int:
    p = Parser(prog="cheapinfer merge", description="Several run records (from different machines) as one claim x machine matrix.")
    p.add_argument("records", nargs="+", type=path_arg, help="run.json files, or the report directories holding them")
    p.add_argument("--json", action="store_true", help="write JSON instead of Markdown")
    p.add_argument("-o", "--output", type=path_arg, help="write to this file instead of standard output")
    p.add_argument("--force", action="store_true", help="overwrite the output even if it is one of the records or not a previous matrix")
    args = p.parse_args(argv)
    if args.output:
        parent = args.output.parent
        refusal = (f"its directory {parent}: {why}" if (why := why_not_a_directory(parent)) else "") or _why_no_output(args.output)
        if not refusal:
            try:
                report.writable_dir(args.output.parent)
            except ValueError as exc:
                refusal = f"its directory: {exc}"
        if refusal:
            compare.usage_error(p.prog, f"-o {args.output}: {refusal}; nothing was written")
    if args.output and not args.force:
        refusal = _overwrite_refusal(args.output, args.records, args.json)
        if refusal:
            compare.usage_error(p.prog, f"-o {args.output}: {refusal}; nothing was written (pass --force to overwrite it)")
    records = [compare.read_record(p.prog, path) for path in args.records]
    sources = [str(path) for path in args.records]
    twice = processes.given_twice(records, args.records)
    if twice:
        compare.usage_error(p.prog, f"{twice}: each machine's run once, or the matrix counts one run as two machines")
    try:
        text = json.dumps(merge(records, sources), indent=1, default=str) + "\n" if args.json else merge_markdown(records, sources)
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:  # a shape check_record does not cover
        compare.usage_error(p.prog, f"a record is not a well-formed run record of this suite ({type(exc).__name__}: {exc})")
    if args.output:
        try:
            report.atomic_write((args.output, text))
        except OSError as exc:  # a full disk: the temporary file is removed, the previous matrix is untouched
            kept = "the previous file is as it was" if args.output.exists() else "nothing was written"
            compare.usage_error(p.prog, f"-o {args.output}: cannot write it ({exc.strerror or exc}); {kept}")
    else:  # a terminal: what a record says is shown, never obeyed (a newline inside a value stays one line)
        sys.stdout.write("\n".join(printable(line) for line in text.split("\n")))
    return 0


def _overwrite_refusal(output: Path, records: list[Path], as_json: bool) -> str | None:
    """Why writing the matrix to ``output`` would destroy something: one of the input records, or a file of another kind."""
    if output.is_dir():
        return "it is a directory"
    if not output.exists():
        return None
    inputs = {schema.record_path(r).resolve() for r in records}
    if output.resolve() in inputs:
        return "it is one of the records being merged"
    try:
        text = read_bounded(output).decode("utf-8")
    except (OSError, ValueError):
        text = None
    if not as_json:
        if text is not None and text.split("\n", 1)[0] == MATRIX_MARK:
            return None
        return "it exists and is not a Markdown matrix written by merge (its first line is not the matrix's mark)"
    try:
        previous = loads_strict(text) if text is not None else None
    except ValueError:
        previous = None
    if isinstance(previous, dict) and {"machines", "summary", "claims"} <= set(previous):
        return None
    return "it exists and is not a matrix written by merge --json"
