"""The settings the commands and the pytest plugin check before any work (imports nothing heavy: no torch), and what
they share: a yes/no variable read strictly, and text shown safely."""

from __future__ import annotations

import os
from typing import Mapping

#: torch threads while timing on a CPU (read by :mod:`cheapinfer.runtime.timing`).
TIMING_THREADS_VARIABLE = "CHEAPINFER_TIMING_THREADS"
#: Its upper bound: more threads than the largest CPUs have cores (a few hundred) oversubscribe, and time that.
MAX_TIMING_THREADS = 1024


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
