"""Launching the suite's pytest in a child process, as the commands do (to its end, Ctrl-C passed on), and the one
interrupt wrapper of the commands that start others: Ctrl-C is exit 130, SIGTERM 143 (SIGHUP 129), one line each,
the children stopped and their temporary folders removed on the way out.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .forks import child_environment

#: The exit status of a command Ctrl-C interrupted (128 + SIGINT, as a shell reports it).
INTERRUPTED = 128 + signal.SIGINT
#: pytest's exit status when it selected no test (``pytest.ExitCode.NO_TESTS_COLLECTED``; pytest is not imported here).
NOTHING_SELECTED = 5
#: pytest.ExitCode.INTERNAL_ERROR: the plugin could not write the record (fixtures/recording.py).
_INTERNAL_ERROR = 3


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


# ----------------------------------------------------------------------------------------------
# the one launcher of the claims' pytest
# ----------------------------------------------------------------------------------------------


#: ``runner(cmd, env)``: (exit status, whether Ctrl-C interrupted it), how a foreground run starts its pytest
#: (:func:`run_interruptibly`; a test stands in for it).
Runner = Callable[[list[str], dict[str, str]], tuple[int, bool]]


@dataclass
class ClaimsRun:
    """One pytest run of claims in a child: its exit status (None: it timed out), the record it kept and its path
    (None: it kept none, or not one that reads), its seconds, the last line of its output (where it was captured),
    and whether Ctrl-C interrupted it."""

    exit_status: int | None
    record_path: Path | None
    record: dict[str, Any] | None
    seconds: float
    tail: str = ""
    interrupted: bool = False


def claims_args(claims: Sequence[str] | None, report_dir: Path, *, fault: str | None = None, stop_on_red: bool = False,
                pytest_args: Sequence[str] = (), folder: str = "claims") -> list[str]:
    """The arguments of the claims' pytest: the checkout's ``claims/`` (or ``folder``: ``tests`` for the suite's own
    tests), quiet, no cache, the report folder, the claims selected, the fault injected, ``--stop-on-red``, then
    ``pytest_args``."""
    from .. import CHECKOUT

    args = [str(CHECKOUT / folder), "-q", "-p", "no:cacheprovider", "--report-dir", str(report_dir)]
    if fault:
        args += ["--fault", fault]
    if claims:
        args += ["--claims", ",".join(claims)]
    return args + (["--stop-on-red"] if stop_on_red else []) + list(pytest_args)


def run_claims(claims: Sequence[str] | None, report_dir: Path, *, env: Mapping[str, str] | None = None, fault: str | None = None,
               threads: int | None = None, timeout: float | None = None, stop_on_red: bool = False, pytest_args: Sequence[str] = (),
               runner: Runner | None = None, run_id: str | None = None, folder: str = "claims") -> ClaimsRun:
    """Run the tests of ``claims`` (all: None) in a child pytest into ``report_dir``; what it kept. ``folder``: the
    checkout's folder of tests it runs (``claims``; ``tests``: the suite's own, as ``gpu-check`` runs them).

    With a ``timeout`` the run is a batch job (the fault runner's): forked from the fork server that has torch and the
    suite loaded (:mod:`cheapinfer.audits.forks`), ``threads`` torch threads, its output in ``report_dir/pytest.log``,
    killed at the timeout or by :func:`cheapinfer.audits.forks.halt`. Without one it runs in the foreground, its output
    on the terminal, Ctrl-C passed on (``runner``, default :func:`run_interruptibly`). Either way the run is told
    its id (``run_id``, else a new one), and its record is the one it kept under that id."""
    import time

    from ..harness import schema, store

    run_id = run_id or store.new_run_id()
    report_dir = Path(report_dir)
    env = {**child_environment(env), store.RUN_ID_VARIABLE: run_id}
    args = claims_args(claims, report_dir, fault=fault, stop_on_red=stop_on_red, pytest_args=pytest_args, folder=folder)
    t0 = time.monotonic()
    tail, interrupted = "", False
    if timeout is not None:
        from .. import CHECKOUT
        from .forks import pytest_run

        report_dir.mkdir(parents=True, exist_ok=True)
        code, tail = pytest_run(args, CHECKOUT, threads, timeout, report_dir / "pytest.log", env=env)
    else:
        code, interrupted = (runner or run_interruptibly)([sys.executable, "-m", "pytest", *args], env)
    path = store.own_record(report_dir, run_id)
    record = None
    if path is not None:
        try:
            record = schema.read_record(path)
        except (OSError, ValueError):
            record = None
    return ClaimsRun(code, path, record, round(time.monotonic() - t0, 1), tail, interrupted)


def claims_outcome(got: ClaimsRun, report_dir: Path, prog: str) -> int:
    """What a foreground run of every claim (``verify``, ``gpu-check``'s claims step) says after it: the verdict table, the
    record and the errata report, or why the latest ``run.json`` and ``errata.md`` were not replaced; its exit status
    (pytest's: 1 when a claim deviates, a finding; 130 when Ctrl-C interrupted it)."""
    from ..harness import schema, store, tables

    code, mine = got.exit_status, got.record_path
    if got.interrupted:
        kept = f"its record so far: {mine}" if mine else "it recorded nothing"
        print(f"{prog}: interrupted; {kept}; the latest {schema.RECORD_NAME} and {store.ERRATA_NAME} were not replaced", file=sys.stderr)
        return INTERRUPTED
    if code == NOTHING_SELECTED:  # the plugin wrote no record: an empty one would replace the latest verdicts
        print(f"{prog}: no test was selected, nothing was run; the latest {schema.RECORD_NAME} and {store.ERRATA_NAME} "
              "were not replaced", file=sys.stderr)
        return code
    if mine:
        record = got.record if got.record is not None else schema.read_record(mine)
        fault = record.get("run", {}).get("fault")
        last = (f"The fault {fault} was injected: the latest {schema.RECORD_NAME} and {store.ERRATA_NAME} were not replaced" if fault
                else f"The latest {schema.RECORD_NAME} and {store.ERRATA_NAME} were not replaced: see the error above"
                if code == _INTERNAL_ERROR else f"Errata report: {Path(report_dir) / store.ERRATA_NAME}")
        print("\n".join(["", *tables.summary_table(record), "", f"Run record: {mine}", last]))
    return code


def warn_memory(report_dir: Path, device: str, prog: str) -> None:
    """One line on stderr, before a run of every claim, when this machine has less memory available than the latest whole
    run in ``report_dir`` measured as its peak (nothing when there is no such record, or it cannot be read)."""
    from ..harness import record as records
    from ..harness import schema
    from ..runtime import memory

    path = Path(report_dir) / schema.RECORD_NAME
    try:
        latest = schema.read_record(path)
    except (OSError, ValueError):
        return
    line = records.memory_warning(latest, device, memory.available(), str(path))
    if line:
        print(f"{prog}: warning: {line}", file=sys.stderr)
