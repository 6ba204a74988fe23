"""``faults``: each fault of the catalogue injected into the measured system; the claims it names must turn red."""

from __future__ import annotations

import argparse

from .. import CHECKOUT
from .common import Command, Parser, bounded_count, finite_number, path_arg

#: ``--runs``: a run of every fault takes minutes; a thousand is weeks, and the record holds every run's verdicts.
MAX_RUNS = 1000
#: ``--workers``: each is a pytest loading its claims' models beside the others.
MAX_WORKERS = 64


def _faults_arguments(p: Parser) -> None:
    p.add_argument("names", nargs="*", metavar="FAULT", help="faults to run (default: all)")
    p.add_argument("--runs", type=bounded_count("runs", 1, MAX_RUNS, f"each run of a fault takes seconds to minutes; {MAX_RUNS} is days"), default=1,
                   help="runs of each fault (default 1; a fault must be caught in every run)")
    p.add_argument("--list", action="store_true", help="list the faults and the claims each must turn red, and exit")
    p.add_argument("--report-dir", type=path_arg, default=CHECKOUT / "reports", help="where faults.json is written (default reports/)")
    p.add_argument("--timeout", type=finite_number("a number of seconds", positive=True), default=600.0, help="seconds one fault run may take (default 600)")
    p.add_argument("--workers", type=bounded_count("workers", 1, MAX_WORKERS, "processes beside each other, each loading a model"), default=2, help="faults run this many at a time on claims that read no clock (default 2); clocked claims always run alone")
    p.add_argument("--all-targets", action="store_true",
                   help="run every claim each fault names, in every run (the per-claim coverage); default: the sweep, which stops each run at the fault's first red claim")


def _faults(p: Parser, args: argparse.Namespace, rest: list[str]) -> int:
    """SIGTERM stops the fault runs, removes their temporary directory, exit 143."""
    from ..audits.faults import faults_main
    from ..audits.launch import interruptible

    return interruptible(lambda: faults_main(p, args), lambda how, kept: f"cheapinfer faults: {how}: the running fault runs were stopped and "
                         "their temporary directory removed; nothing was written")


COMMANDS = {
    "faults": Command("Inject each known fault into the measured system and check that it turns its claims red. Exit 1 when a fault "
                      "goes unnoticed in any run.", _faults_arguments, _faults),
}


def faults_cli(argv: list[str]) -> int:
    return COMMANDS["faults"]("faults", argv)
