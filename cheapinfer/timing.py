"""Timing that survives a noisy shared machine.

Ratios, not absolute times, are asserted. Every ratio is measured in one run with the variants
interleaved round by round (so drift in clock speed or load hits all of them alike), after
warm-up, with the device synchronised before each clock read, and summarised by the median. Each
call is timed by :func:`cheapinfer.accel.elapsed`: CUDA events on a GPU, ``perf_counter`` on a CPU.
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from .accel import elapsed, sync
from .cli import timing_threads


#: torch intra-op threads while timing on a CPU. One thread: on a CPU shared with other work a
#: multi-threaded matrix product waits at every barrier for a descheduled thread (a [2, 896] x
#: [896, 4864] product took 24 ms on two threads against 3 ms on one, and a decode step at
#: context 1,024 came out 2x slower than at 16 while the machine was busy). One thread gives
#: ratios that survive a busy machine. ``CHEAPINFER_TIMING_THREADS=0`` leaves torch's default.
#: A value that is not an integer >= 0 leaves the default here (an import must not fail): the commands
#: that time and the pytest plugin refuse it first, with one line (``cli.timing_threads``).
try:
    TIMING_THREADS = timing_threads()
except ValueError:
    TIMING_THREADS = 1


@contextlib.contextmanager
def cpu_threads(n: int | None = TIMING_THREADS):
    """Run the block with ``n`` torch intra-op threads (``None`` or 0: leave the setting alone)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Samples:
    name: str
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def iqr(self) -> float:
        if len(self.seconds) < 4:
            return 0.0
        q = statistics.quantiles(self.seconds, n=4)
        return q[2] - q[0]

    def summary(self) -> dict[str, float]:
        return {"median_s": self.median, "iqr_s": self.iqr, "min_s": min(self.seconds), "rounds": len(self.seconds)}


def interleaved(
    variants: Mapping[str, Callable[[], object]],
    rounds: int = 7,
    warmup: int = 1,
    device: torch.device | str = "cpu",
) -> dict[str, Samples]:
    """Time each callable ``rounds`` times, interleaved: a, b, c, a, b, c, ...

    Each variant runs ``warmup`` times first (allocator, caches, lazy init). The order within a
    round rotates so no variant always runs right after the same neighbour. On a CPU the block
    runs with ``TIMING_THREADS`` torch threads.
    """
    names = list(variants)
    threads = TIMING_THREADS if torch.device(device).type == "cpu" else None
    out = {name: Samples(name, []) for name in names}
    with torch.inference_mode(), cpu_threads(threads):
        for _ in range(warmup):
            for name in names:
                variants[name]()
        sync(device)
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                out[name].seconds.append(elapsed(variants[name], device))
    return out


def ratio(samples: Mapping[str, Samples], num: str, den: str) -> float:
    return samples[num].median / samples[den].median
