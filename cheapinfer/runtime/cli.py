"""What the commands of ``python -m cheapinfer`` and the pytest plugin share: one-line usage errors, and the
settings they check before any work (imports nothing heavy: no torch)."""

from __future__ import annotations

import argparse
import os
from typing import Mapping

#: torch threads while timing on a CPU (read by :mod:`cheapinfer.runtime.timing`).
TIMING_THREADS_VARIABLE = "CHEAPINFER_TIMING_THREADS"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (``prog: error: message``), exit status 2.

    argparse's own error prints the whole usage first; ``--help`` still prints it.
    """

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def nonempty(text: str) -> str:
    """An option's value that must say something (argparse type): an empty value is not the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty (leave the option out for its default)")
    return text


def finite_number(what: str, positive: bool, hint: str = ""):
    """An argparse type: a finite number ``> 0`` (``positive``) or ``>= 0``, called ``what`` in the error (``hint``:
    what it means, said when it is out of range)."""
    import math

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


def timing_threads(environ: Mapping[str, str] = os.environ) -> int:
    """``CHEAPINFER_TIMING_THREADS`` (default 1); ValueError, one line naming it, unless it is an integer >= 0."""
    text = environ.get(TIMING_THREADS_VARIABLE, "1")
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{TIMING_THREADS_VARIABLE}={text!r}: expected an integer >= 0 "
                         "(torch threads while timing on a CPU; 0 keeps torch's own count)")
    return n


#: What an xdist worker puts in its environment: a pytest started from it (a child run of the suite) would
#: take itself for a worker too, and pytest-benchmark would then time nothing.
_XDIST_PREFIX = "PYTEST_XDIST_"


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``environ`` (default: this process's) for a child pytest run, a session of its own: without the
    variables of the xdist worker this process may be (the suite's own checks run under ``pytest -n 2 tests``)."""
    return {k: v for k, v in (os.environ if environ is None else environ).items() if not k.startswith(_XDIST_PREFIX)}


class Terminated(Exception):
    """SIGTERM reached a command that runs others (``faults``, ``verify --isa-matrix``): it cleans up and exits."""


def terminate(signum, frame) -> None:
    """A SIGTERM handler that raises :class:`Terminated` once."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: a second must not break the cleanup
    raise Terminated()
