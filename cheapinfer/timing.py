"""Timing that survives a noisy shared machine.

Ratios, not absolute times, are asserted. Every ratio is measured in one run with the variants
interleaved round by round (so drift in clock speed or load hits all of them alike), after
warm-up, with the device synchronised before each clock read, and summarised by the median.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from .device import sync


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
    round rotates so no variant always runs right after the same neighbour.
    """
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    sync(device)
    out = {name: Samples(name, []) for name in names}
    with torch.inference_mode():
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                sync(device)
                t0 = time.perf_counter()
                variants[name]()
                sync(device)
                out[name].seconds.append(time.perf_counter() - t0)
    return out


def ratio(samples: Mapping[str, Samples], num: str, den: str) -> float:
    return samples[num].median / samples[den].median
