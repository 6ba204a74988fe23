"""``verify``: every claim of the chapter on this machine, the errata report written; ``isa`` and ``stress``: the
suite's checks of its own verdicts (:mod:`cheapinfer.audits.matrix`), also reached as ``verify --isa-matrix`` and
``verify --stress N`` for a release."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import CHECKOUT
from ..audits.launch import claims_outcome, interruptible, run_claims, warn_memory
from ..audits.launch import run_interruptibly as _run_interruptibly
from .common import Command, Parser, bounded_count, nonempty, nonempty_path

ROOT = CHECKOUT
#: The busy processes of ``stress``: from 1 to this many.
MAX_BUSY = 64
_stress_count = bounded_count("busy processes", 1, MAX_BUSY, "each a CPU-bound process beside the claims run")


def _run_arguments(p: Parser) -> None:
    """What every claims run takes: the book model, the device, the fast selection, the report folder, the claims."""
    p.add_argument("--book-model", metavar="PATH", type=nonempty, help="local copy of Qwen2.5-0.5B-Instruct (default: Hugging Face cache, offline)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (CUDA_VISIBLE_DEVICES picks among the cards first)")
    p.add_argument("--fast", action="store_true", help="skip the claims marked slow")
    p.add_argument("--report-dir", metavar="DIR", type=nonempty_path, default=ROOT / "reports",
                   help="where run.json and errata.md are written (default: reports/ of the checkout)")
    p.add_argument("--claims", metavar="ID,ID", type=nonempty, help="run only the tests of these claims")


def _families_help() -> str:
    from ..audits.families import FAMILIES

    return f"these kernel families only (default: all of {', '.join(FAMILIES)})"


def _verify_arguments(p: Parser) -> None:
    _run_arguments(p)
    checks = p.add_argument_group("the suite's checks of its own verdicts, as flags (deprecated: cheapinfer isa, cheapinfer stress)")
    checks.add_argument("--isa-matrix", action="store_true", help="the same as cheapinfer isa (deprecated)")
    checks.add_argument("--families", metavar="NAME,NAME", type=nonempty, help=f"with --isa-matrix: {_families_help()}")
    checks.add_argument("--stress", metavar="N", type=_stress_count, nargs="?", const=2, help="the same as cheapinfer stress --busy N (deprecated)")
    checks.add_argument("--quiet-record", metavar="PATH", type=nonempty_path, help="with --stress: as cheapinfer stress --quiet-record")


def _isa_arguments(p: Parser) -> None:
    _run_arguments(p)
    p.add_argument("--families", metavar="NAME,NAME", type=nonempty, help=_families_help())


def _stress_arguments(p: Parser) -> None:
    _run_arguments(p)
    p.add_argument("--busy", metavar="N", type=_stress_count, default=2, help="busy processes beside the second run (default 2)")
    p.add_argument("--quiet-record", metavar="PATH", type=nonempty_path,
                   help="take the quiet run's verdicts from this run record (run.json or its directory) instead of running it")


def _needs_checkout(p: Parser) -> None:
    if not (ROOT / "claims").is_dir():
        p.error(f"the claims/ folder is not next to the package ({ROOT}); run from a checkout of the suite")


def _pytest_args(args: argparse.Namespace, device, rest: list[str]) -> list[str]:
    """What a claims run of verify, isa and stress passes its pytest besides the claims and the report folder."""
    extra = ["--device", str(device)]
    if args.book_model:
        extra += ["--book-model", args.book_model]
    if args.fast:
        extra += ["-m", "not slow"]
    return extra + ["-r", "fE"] + rest  # skip reasons are in the report


def _device(name: str):
    """The device a claims run uses (``--device``), or None after one line on stderr."""
    from ..runtime.device import DeviceUnavailable, pick

    try:
        return pick(name)
    except DeviceUnavailable as exc:
        print(f"cheapinfer verify: {exc}", file=sys.stderr)
        return None


def _verify(p: Parser, args: argparse.Namespace, rest: list[str]) -> int:
    _needs_checkout(p)
    if args.isa_matrix and args.stress is not None:
        p.error("--isa-matrix and --stress are two checks: run one at a time")
    if args.families is not None and not args.isa_matrix:
        p.error("--families goes with --isa-matrix")
    if args.quiet_record is not None and args.stress is None:
        p.error("--quiet-record goes with --stress")
    if args.isa_matrix:
        print("cheapinfer verify: --isa-matrix is deprecated: it is cheapinfer isa now", file=sys.stderr)
        return _isa(p, args, rest, prog="cheapinfer verify --isa-matrix")
    if args.stress is not None:
        print(f"cheapinfer verify: --stress is deprecated: it is cheapinfer stress --busy {args.stress} now", file=sys.stderr)
        args.busy = args.stress
        return _stress(p, args, rest, prog="cheapinfer verify --stress")
    from ..audits.launch import child_environment
    from ..harness import schema, store

    device = _device(args.device)
    if device is None:
        return 2
    report_dir = args.report_dir.expanduser().absolute()
    # This run's record is runs/<stamp>-<run id>.json: an id, not a pid, which another run (in another PID
    # namespace, or later) can have too. After a usage error there is no record, and no summary is shown.
    run_id = store.new_run_id()
    # From the caller's directory, so that relative paths mean what the caller meant; the rootdir is the checkout's.
    claims = [args.claims] if args.claims else None

    def body() -> int:
        if not claims:
            warn_memory(report_dir, str(device), "cheapinfer verify")
        got = run_claims(claims, report_dir, env=child_environment(), pytest_args=_pytest_args(args, device, rest), run_id=run_id,
                         runner=lambda cmd, env: _run_interruptibly(cmd, env))  # looked up at the call: a test stands in for it
        return claims_outcome(got, report_dir, "cheapinfer verify")

    def say(how: str, kept: str | None) -> str:
        # SIGTERM (or Ctrl-C outside the claims run, which reports its own): the claims run is stopped, its record lost
        stopped = "the running claims run was stopped; " if how != "interrupted" else ""
        return (f"cheapinfer verify: {how}; {stopped}the latest {schema.RECORD_NAME} and {store.ERRATA_NAME} were not replaced")

    return interruptible(body, say)


def _select(p: Parser, args: argparse.Namespace, allowed: list[str], what: str) -> list[str]:
    """``--claims`` within ``allowed``; a usage error, one line, for an ID unknown or outside."""
    from ..audits import matrix

    try:
        return matrix.select(args.claims, allowed, what)
    except ValueError as exc:
        p.error(f"--claims: {exc}")


def _out_dir(p: Parser, args: argparse.Namespace, name: str) -> Path:
    from ..harness import store

    out = args.report_dir.expanduser().absolute() / name
    try:
        store.writable_dir(out)
    except ValueError as exc:
        p.error(f"--report-dir: cannot write {out}: {exc}")
    return out


def _isa(p: Parser, args: argparse.Namespace, rest: list[str], prog: str = "cheapinfer isa") -> int:
    """``isa`` (``verify --isa-matrix``): the usage checks, then :func:`cheapinfer.audits.matrix.isa_main`."""
    from ..audits import families as kernel_families
    from ..audits import matrix

    _needs_checkout(p)
    if args.device not in ("auto", "cpu"):
        p.error(f"{'--isa-matrix' if 'verify' in prog else 'isa'} caps the CPU's kernels: it runs on the CPU, not --device {args.device}")
    device = _device("cpu")
    if device is None:
        return 2
    claims = _select(p, args, matrix.isa_claims(), "kernel-dependent (measured on a model, or clocked)")
    names = [n.strip() for n in (args.families or ",".join(kernel_families.FAMILIES)).split(",") if n.strip()]
    unknown = [n for n in names if n not in kernel_families.FAMILIES]
    if unknown or not names:
        p.error(f"--families: no such kernel family: {', '.join(unknown) or '(none given)'} (families: {', '.join(kernel_families.FAMILIES)})")
    out = _out_dir(p, args, "isa")
    return matrix.isa_main(claims, [n for n in kernel_families.FAMILIES if n in names], out, _pytest_args(args, device, rest),
                           _run_interruptibly, prog=prog)


def _stress(p: Parser, args: argparse.Namespace, rest: list[str], prog: str = "cheapinfer stress") -> int:
    """``stress`` (``verify --stress N``): the usage checks, then :func:`cheapinfer.audits.stress.stress_main`."""
    from ..audits import matrix, stress
    from ..harness.schema import RecordError, read_record

    _needs_checkout(p)
    device = _device(args.device)
    if device is None:
        return 2
    claims = _select(p, args, matrix.stress_claims(), "clocked (its test reads no clock, so load cannot move it)")
    out = _out_dir(p, args, "stress")
    quiet = None
    if args.quiet_record is not None:
        try:
            quiet = read_record(args.quiet_record)
        except RecordError as exc:
            p.error(f"--quiet-record {args.quiet_record}: not a well-formed run record of this suite: {exc}")
        except (OSError, ValueError) as exc:
            p.error(f"--quiet-record {args.quiet_record}: no readable run record ({exc.strerror if isinstance(exc, OSError) and exc.strerror else exc})")
        if quiet.get("run", {}).get("fault"):
            p.error(f"--quiet-record {args.quiet_record}: a run with the fault {quiet['run']['fault']} injected, not a quiet run of the clean suite")
        lacking = [cid for cid in claims if not any(r.get("profile") != "-" for r in quiet["claims"].get(cid, {}).get("results", []))]
        if lacking:
            p.error(f"--quiet-record {args.quiet_record}: no result for {', '.join(lacking)} (run without --quiet-record, or restrict --claims)")
    return stress.stress_main(claims, args.busy, out, _pytest_args(args, device, rest), _run_interruptibly, quiet,
                              str(args.quiet_record) if quiet else None, prog=prog)


COMMANDS = {
    "verify": Command("Verify the chapter's claims on this machine; write reports/errata.md and reports/run.json.", _verify_arguments, _verify,
                      passes_on=True),
    "isa": Command("Run the kernel-dependent claims under each CPU kernel family, one pytest run each (reports/isa/); exit 1 when a "
                   "claim is green in one family and deviates in another.", _isa_arguments, _isa, passes_on=True),
    "stress": Command("Run the clocked claims quietly, then beside N busy processes (reports/stress/); exit 1 when a claim green quietly "
                      "deviates under stress.", _stress_arguments, _stress, passes_on=True),
}
