"""The process's memory, without torch: its peak and current resident set, what the machine has available, and
handing freed memory back to the system.

- :func:`peak_rss` is the process's maximum resident set since it started (``getrusage``'s ``ru_maxrss``, what
  ``/usr/bin/time -v`` reports as "Maximum resident set size"): it never goes down, so after each claim it is the
  peak of the run so far, and the claim after which it last rose is the one that set the run's peak.
- :func:`rss` is the resident set now (``/proc/self/statm``).
- :func:`available` is the kernel's estimate of memory available without swapping (``MemAvailable``).
- :func:`release` collects garbage and asks the C allocator to return its free pages (glibc's ``malloc_trim``):
  a model dropped by Python leaves its pages with the allocator otherwise, and the resident set does not fall.

What cannot be read on this system is ``None`` (``available``: 0, so that nothing is planned beyond it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import sys

GIB = 2**30


def peak_rss() -> int | None:
    """The process's maximum resident set so far, in bytes (None where ``resource`` is missing: Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # bytes on macOS, KiB on Linux and the BSDs


def rss() -> int | None:
    """The process's resident set now, in bytes (``/proc/self/statm``; None where it cannot be read)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def meminfo(key: str, path: str = "/proc/meminfo") -> int | None:
    """One field of ``/proc/meminfo`` in bytes (``MemAvailable``, ``MemTotal``), or None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def available() -> int:
    """Bytes the kernel estimates are available without swapping (``MemAvailable``); 0 where it cannot be read."""
    return meminfo("MemAvailable") or 0


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release() -> None:
    """Collect what Python no longer references, then hand the allocator's free pages back to the system."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def gib(nbytes: int | float | None) -> str:
    """Bytes as GiB with one decimal (``"?"`` for None)."""
    return "?" if nbytes is None else f"{nbytes / GIB:.1f} GiB"


def snapshot() -> dict[str, int]:
    """What a claim's result records after it: the process's peak resident set so far and its resident set now, in
    bytes (a value that cannot be read is left out)."""
    now, peak = rss(), peak_rss()
    if now is not None and peak is not None:
        peak = max(peak, now)  # the kernel updates the high-water mark lazily: it may lag the resident set by a few pages
    out = {"peak_rss_bytes": peak, "rss_bytes": now}
    return {k: v for k, v in out.items() if v is not None}
