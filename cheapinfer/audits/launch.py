"""Launching the suite's pytest in a child process, as the commands do (to its end, Ctrl-C passed on), and the one
interrupt wrapper of the commands that start others: Ctrl-C is exit 130, SIGTERM 143 (SIGHUP 129), one line each,
the children stopped and their temporary folders removed on the way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Callable, Mapping


#: The exit status of a command Ctrl-C interrupted (128 + SIGINT, as a shell reports it).
INTERRUPTED = 128 + signal.SIGINT


class _Interrupt(Exception):
    """Ctrl-C reached the waiting command (raised by its SIGINT handler, to end a blocking wait)."""


def run_interruptibly(cmd: list[str], env: dict[str, str]) -> tuple[int, bool]:
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
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # one is enough: a second must not break the cleanup
    raise Terminated(signum)


def _stop_signals() -> tuple[int, ...]:
    return tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


#: The signals that stop a command which starts others: SIGTERM, and SIGHUP (its terminal closed), both cleaned up.
STOP_SIGNALS = _stop_signals()


def on_stop(handler) -> dict[int, object]:
    """Install ``handler`` for every signal of :data:`STOP_SIGNALS`; the previous handlers, for :func:`restore`."""
    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}


def restore(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


class Interrupted(Exception):
    """Ctrl-C ended a claims run: nothing more starts (its message says what the run kept)."""


def interruptible(body: Callable[[], int], say: Callable[[str, str | None], str]) -> int:
    """``body()``, with Ctrl-C and SIGTERM (SIGHUP) as one line on stderr and exit 130 / 143 (129): whatever ``body``
    started is stopped on the way out, by the ``finally`` blocks the exception passes. ``say(how, kept)``: the line,
    ``how`` "interrupted" or "terminated (SIGTERM)", ``kept`` what an :class:`Interrupted` run kept (else None)."""
    previous = on_stop(terminate)  # SIGTERM and SIGHUP (the terminal closed) alike
    try:
        return body()
    except Interrupted as exc:
        print(say("interrupted", str(exc)), file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print(say("interrupted", None), file=sys.stderr)
        return INTERRUPTED
    except Terminated as exc:
        sig = signal.Signals(exc.args[0] if exc.args else signal.SIGTERM)
        print(say(f"terminated ({sig.name})", None), file=sys.stderr)
        return 128 + sig
    finally:
        restore(previous)
