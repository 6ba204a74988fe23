"""``python -m cheapinfer errata --chapter FILE -o errata.patch``: the unified diff of every replacement of
cheapinfer/errata.toml on one translation of the chapter, for an author to review and apply with
``patch -p1`` or ``git apply`` in the chapter's folder.

A quote found other than exactly once is refused with its line (exit 1); nothing is guessed and no patch is written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..runtime.settings import Parser, nonempty
from . import locate

#: The largest chapter file read (the chapter is about 100 KB): a bigger file is refused, not read.
MAX_BYTES = 8 * 2**20


def read_chapter(path: Path) -> str:
    """The chapter's text; ValueError with one line for a missing, oversized, binary or non-UTF-8 file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read it ({exc.strerror or exc})") from None
    if len(raw) > MAX_BYTES:
        raise ValueError(f"it is larger than {MAX_BYTES // 2**20} MiB: not the chapter's text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None


def errata_cli(argv: list[str]) -> int:
    p = Parser(prog="cheapinfer errata",
               description="Write the unified diff of every erratum's replacement for one translation of the chapter (Dutch or Vietnamese: "
                           "told from its text). Review it, then apply it beside the chapter with `patch -p1 < errata.patch` or `git apply errata.patch`.")
    p.add_argument("--chapter", metavar="FILE", required=True, type=lambda t: Path(nonempty(t)), help="the chapter's text file (either translation)")
    p.add_argument("-o", "--output", metavar="PATCH", required=True, type=lambda t: Path(nonempty(t)), help="where the diff is written ('-': standard output)")
    p.add_argument("--language", choices=locate.LANGUAGES, help="the translation (default: told from the text)")
    args = p.parse_args(argv)
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
    from .report import atomic_write

    try:
        atomic_write((args.output, diff))
    except OSError as exc:
        print(f"cheapinfer errata: -o {args.output}: cannot write it ({exc.strerror or exc})", file=sys.stderr)
        return 2
    changes = diff.count("\n-") - diff.count("\n---")
    print(f"{args.output}: {changes} changed line(s) of {args.chapter.name}; apply beside it with `patch -p1 < {args.output.name}` or `git apply {args.output.name}`")
    return 0
