"""The commands that read records and write reports from them: ``compare`` (two run records), ``merge`` (several as
one claim x machine matrix) and ``errata`` (the chapter's patch)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from ..harness import compare, locate, reruns, schema, store
from ..harness.compare import BAND, CLAIM, annotate, check_reruns, environment_changes, read_record, usage_error
from ..harness.errata_patch import read_chapter
from ..harness.merge import MATRIX_MARK, merge, merge_markdown
from ..harness.tables import machine_label
from ..runtime.files import loads_strict, read_bounded, why_not_a_directory
from ..runtime.settings import printable
from .common import Command, Parser, finite_number, nonempty, path_arg


def _compare_arguments(p: Parser) -> None:
    p.add_argument("before", type=path_arg, help="run.json, or the report directory holding it (e.g. reports)")
    p.add_argument("after", type=path_arg, help="run.json, or the report directory holding it (e.g. reports/latest)")
    p.add_argument("--before-reruns", type=path_arg, nargs="+", default=[], metavar="RECORD",
                   help="more run records of BEFORE's environment (reruns of its claims): clocked values are then judged on the spread between processes")
    p.add_argument("--after-reruns", type=path_arg, nargs="+", default=[], metavar="RECORD", help="the same for AFTER")
    p.add_argument("--band", type=finite_number("a number", positive=False, hint="a relative band, e.g. 0.25"), default=BAND, help=f"relative band for values checked by shape only, e.g. timing ratios (default {BAND})")
    p.add_argument("--verdicts-only", action="store_true", help="a value that moved is printed but is not a regression; only verdicts decide the exit status")
    p.add_argument("--json", action="store_true", help="print the changes as JSON")


def _compare(p: Parser, args: argparse.Namespace, rest: list[str]) -> int:
    before, after = read_record(p.prog, args.before), read_record(p.prog, args.after)
    reruns = ([read_record(p.prog, path) for path in args.before_reruns], [read_record(p.prog, path) for path in args.after_reruns])
    problem = check_reruns((before, after), reruns, (args.before, args.after), (args.before_reruns, args.after_reruns))
    if problem:
        usage_error(p.prog, problem)
    try:
        changes = annotate(compare.compare(before, after, args.band, reruns), after)
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:  # a shape check_record does not cover
        usage_error(p.prog, f"{args.before} or {args.after} is not a well-formed run record of this suite ({type(exc).__name__}: {exc})")
    if args.verdicts_only:
        for c in changes:
            c.regression = c.regression and c.what in ("verdict", CLAIM)
    regressions = [c for c in changes if c.regression]
    harness = [c for c in changes if c.harness]
    if args.json:
        print(json.dumps({"before": str(args.before), "after": str(args.after), "before_reruns": list(map(str, args.before_reruns)),
                          "after_reruns": list(map(str, args.after_reruns)), "environment": environment_changes(before, after),
                          "changes": [asdict(c) for c in changes], "regressions": len(regressions), "harness_errors": len(harness)}, indent=1, default=str))
    else:
        for label, path, record, more in (("before:", args.before, before, args.before_reruns), ("after: ", args.after, after, args.after_reruns)):
            also = f" (and {len(more)} rerun(s): {', '.join(map(str, more))})" if more else ""
            print(printable(f"{label} {path}: {record.get('suite', '?')} on {machine_label(record.get('environment', {}))}, {record.get('created', '?')}{also}"))
        for line in environment_changes(before, after):
            print(printable(f"  environment {line}"))
        # Claims that changed first, then the harness errors (a test raised before its verdict), then the rest.
        for c in sorted(changes, key=lambda c: (c.harness, not c.regression)):
            print(printable(c.line()))
        n = len(set(before["claims"]) | set(after["claims"]))
        claimed = [c for c in regressions if not c.harness]
        others = [c for c in changes if not c.regression and not c.harness]
        print(f"{n} claims compared: {len(claimed)} regression(s), {len(others)} other change(s), "
              f"{len(harness)} harness error(s) (a test raised before its verdict: the suite or a library broke, not the claim).")
    return 1 if regressions else 0


def _merge_arguments(p: Parser) -> None:
    p.add_argument("records", nargs="+", type=path_arg, help="run.json files, or the report directories holding them")
    p.add_argument("--json", action="store_true", help="write JSON instead of Markdown")
    p.add_argument("-o", "--output", type=path_arg, help="write to this file instead of standard output")
    p.add_argument("--force", action="store_true", help="overwrite the output even if it is one of the records or not a previous matrix")


def _why_no_output(path: Path) -> str:
    """Why ``-o path`` can take no file, naming the real cause (a directory, a symlink loop), or "" (an existing file
    is judged by the overwrite check)."""
    if path.is_dir():
        return "it is a directory"
    return "" if path.exists() else why_not_a_directory(path)


def _merge(p: Parser, args: argparse.Namespace, rest: list[str]) -> int:
    if args.output:
        parent = args.output.parent
        refusal = (f"its directory {parent}: {why}" if (why := why_not_a_directory(parent)) else "") or _why_no_output(args.output)
        if not refusal:
            try:
                store.writable_dir(args.output.parent)
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
    twice = reruns.given_twice(records, args.records)
    if twice:
        compare.usage_error(p.prog, f"{twice}: each machine's run once, or the matrix counts one run as two machines")
    try:
        text = json.dumps(merge(records, sources), indent=1, default=str) + "\n" if args.json else merge_markdown(records, sources)
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:  # a shape check_record does not cover
        compare.usage_error(p.prog, f"a record is not a well-formed run record of this suite ({type(exc).__name__}: {exc})")
    if args.output:
        try:
            store.atomic_write((args.output, text))
        except OSError as exc:  # a full disk: the temporary file is removed, the previous matrix is untouched
            kept = "the previous file is as it was" if args.output.exists() else "nothing was written"
            compare.usage_error(p.prog, f"-o {args.output}: cannot write it ({exc.strerror or exc}); {kept}")
    else:  # a terminal: what a record says is shown, never obeyed (a newline inside a value stays one line)
        sys.stdout.write("\n".join(printable(line) for line in text.split("\n")))
    return 0



def _errata_arguments(p: Parser) -> None:
    p.add_argument("--chapter", metavar="FILE", required=True, type=lambda t: Path(nonempty(t)), help="the chapter's text file (either translation)")
    p.add_argument("-o", "--output", metavar="PATCH", required=True, type=lambda t: Path(nonempty(t)), help="where the diff is written ('-': standard output)")
    p.add_argument("--language", choices=locate.LANGUAGES, help="the translation (default: told from the text)")


def _errata(p: Parser, args: argparse.Namespace, rest: list[str]) -> int:
    try:
        text = read_chapter(args.chapter)
    except ValueError as exc:
        print(f"cheapinfer errata: --chapter {args.chapter}: {exc}", file=sys.stderr)
        return 2
    try:
        diff = locate.unified_diff(text, args.chapter.name, args.language)
    except locate.LocateError as exc:
        print(f"cheapinfer errata: {args.chapter}: refused, no patch written: {exc}", file=sys.stderr)
        return 1
    if str(args.output) == "-":
        sys.stdout.write(diff)
        return 0
    from ..harness.store import atomic_write

    try:
        atomic_write((args.output, diff))
    except OSError as exc:
        print(f"cheapinfer errata: -o {args.output}: cannot write it ({exc.strerror or exc})", file=sys.stderr)
        return 2
    changes = diff.count("\n-") - diff.count("\n---")
    print(f"{args.output}: {changes} changed line(s) of {args.chapter.name}; apply beside it with `patch -p1 < {args.output.name}` or `git apply {args.output.name}`")
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


COMMANDS = {
    "compare": Command("Claims whose verdict changed or whose measured value moved beyond its tolerance between two run records. Exit 1 on a regression.", _compare_arguments, _compare),
    "merge": Command("Several run records (from different machines) as one claim x machine matrix.", _merge_arguments, _merge),
    "errata": Command("Write the unified diff of every erratum's replacement for one translation of the chapter (Dutch or Vietnamese: "
                           "told from its text). Review it, then apply it beside the chapter with `patch -p1 < errata.patch` or `git apply errata.patch`.", _errata_arguments, _errata),
}


def compare_cli(argv: list[str]) -> int:
    return COMMANDS["compare"]("compare", argv)


def merge_cli(argv: list[str]) -> int:
    return COMMANDS["merge"]("merge", argv)


def errata_cli(argv: list[str]) -> int:
    return COMMANDS["errata"]("errata", argv)
