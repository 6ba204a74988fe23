"""What the commands of ``python -m cheapinfer`` and the pytest plugin share: one-line usage errors, and the
settings they check before any work (imports nothing heavy: no torch)."""

from __future__ import annotations

import argparse
import os
from typing import Mapping

#: torch threads while timing on a CPU (read by :mod:`cheapinfer.runtime.timing`).
TIMING_THREADS_VARIABLE = "CHEAPINFER_TIMING_THREADS"
#: Its upper bound: more threads than the largest CPUs have cores (a few hundred) oversubscribe, and time that.
MAX_TIMING_THREADS = 1024


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


def path_arg(text: str):
    """A path argument (argparse type): an empty path is refused, never taken for the current directory."""
    from pathlib import Path

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


#: What a yes/no environment variable may say, in either case.
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def env_flag(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """A yes/no environment variable: 1, true, yes, on (any case) or 0, false, no, off, empty; ValueError, one line
    naming it, for anything else (a typo must not mean "no")."""
    text = environ.get(name, "").strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ValueError(f"{name}={environ.get(name)!r}: expected one of {', '.join(TRUE_WORDS)} (yes) or {', '.join(w for w in FALSE_WORDS if w)} (no)")


def printable(text: object) -> str:
    """``text`` as a terminal shows it safely: control characters (newlines, ESC of an ANSI sequence) written as
    escapes, never obeyed, so text read from a record cannot forge a line or a colour."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


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
    if not 0 <= n <= MAX_TIMING_THREADS:
        raise ValueError(f"{TIMING_THREADS_VARIABLE}={text!r}: expected an integer from 0 to {MAX_TIMING_THREADS} "
                         "(torch threads while timing on a CPU; 0 keeps torch's own count; more threads than any CPU has cores time nothing real)")
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
    """A SIGTERM (or SIGHUP) handler that raises :class:`Terminated` once, carrying the signal's number."""
    import signal

    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # one is enough: a second must not break the cleanup
    raise Terminated(signum)


def _stop_signals() -> tuple[int, ...]:
    import signal

    return tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


#: The signals that stop a command which starts others: SIGTERM, and SIGHUP (its terminal closed), both cleaned up.
STOP_SIGNALS = _stop_signals()


def on_stop(handler) -> dict[int, object]:
    """Install ``handler`` for every signal of :data:`STOP_SIGNALS`; the previous handlers, for :func:`restore`."""
    import signal

    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}


def restore(previous: dict[int, object]) -> None:
    import signal

    for sig, handler in previous.items():
        signal.signal(sig, handler)
