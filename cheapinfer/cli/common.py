"""What every command of the command line shares: the parser whose usage errors are one line, the argparse
validators of numbers and paths (one set for every command), and what a command is."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (``prog: error: message``), exit status 2.

    argparse's own error prints the whole usage first; ``--help`` still prints it.
    """

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ----------------------------------------------------------------------------------------------
# validators (argparse types): a bad value is one line naming the option
# ----------------------------------------------------------------------------------------------


def nonempty(text: str) -> str:
    """An option's value that must say something (argparse type): an empty value is not the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty (leave the option out for its default)")
    return text


def nonempty_path(text: str) -> Path:
    """A path option whose empty value is refused as :func:`nonempty` refuses it."""
    return Path(nonempty(text))


def path_arg(text: str) -> Path:
    """A path argument (argparse type): an empty path is refused, never taken for the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file (it is not the current directory)")
    return Path(text)


def bounded_count(what: str, low: int, high: int, why: str):
    """An argparse type: an integer from ``low`` to ``high``; ``why`` says where the upper bound comes from."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number of {what}, not {text!r}") from None
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high} {what} ({why}), not {n}")
        return n

    return parse


def finite_number(what: str, positive: bool, hint: str = ""):
    """An argparse type: a finite number ``> 0`` (``positive``) or ``>= 0``, called ``what`` in the error (``hint``:
    what it means, said when it is out of range)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}") from None
        if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
            bound = f"{'>' if positive else '>='} 0" + (f" ({hint})" if hint else "")
            raise argparse.ArgumentTypeError(f"must be a finite {what.removeprefix('a ').removeprefix('an ')} {bound}, not {text}")
        return value

    return parse


def positive(option: str):
    """An argparse type: a finite number > 0, the error naming ``option`` (``--gpu-gib must be > 0, not -8``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} must be a number, not {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{option} must be > 0, not {text}")
        return value

    return parse


# ----------------------------------------------------------------------------------------------
# a command
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One subcommand: its arguments (added to its parser), what it runs with them, and its help.

    ``run(parser, args, rest)``: ``rest`` holds the arguments the parser did not know, which only a command that
    ``passes_on`` (to pytest) takes; for the others they are a usage error."""

    description: str
    arguments: Callable[[Parser], None]
    run: Callable[[Parser, argparse.Namespace, list[str]], int]
    epilog: str | None = None
    passes_on: bool = False

    def parser(self, name: str, parser: Parser | None = None) -> Parser:
        """The command's parser, ``cheapinfer NAME`` (``parser``: one a subparsers action made, filled here)."""
        p = parser or Parser(prog=f"cheapinfer {name}", description=self.description, epilog=self.epilog)
        self.arguments(p)
        return p

    def invoke(self, p: Parser, argv: list[str]) -> int:
        """Parse ``argv`` with ``p`` (this command's parser) and run."""
        if self.passes_on:
            args, rest = p.parse_known_args(argv)
        else:
            args, rest = p.parse_args(argv), []
        return self.run(p, args, rest)

    def __call__(self, name: str, argv: list[str]) -> int:
        return self.invoke(self.parser(name), argv)
