"""Launching the suite's pytest in a child process, as the commands do: to its end, Ctrl-C passed on."""

from __future__ import annotations

import signal
import subprocess


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
