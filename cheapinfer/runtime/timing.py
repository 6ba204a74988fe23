"""Timing that survives a noisy shared machine.

Ratios, not absolute times, are asserted. Every ratio is measured in one run with the variants
interleaved round by round (so drift in clock speed or load hits all of them alike), after
warm-up, with the device synchronised before each clock read, and summarised by the median. Each
call is timed by :func:`cheapinfer.runtime.accel.elapsed`: CUDA events on a GPU, ``perf_counter`` on a CPU.

**Noise, stated.** A quantity read from the rounds (a ratio of two variants' times, a growth factor)
is estimated from the variants' medians, and its noise from the same quantity computed round by
round (the variants of one round ran side by side, under the same load): :func:`estimates` gives the
value and its robust standard error, 1.4826 MAD x sqrt(pi / 2) / sqrt(n) (the median absolute
deviation as a normal sigma, the efficiency of a median). A check on it decides only where its margin
to the bound is at least ``registry.NOISE_SIGMAS`` standard errors; :func:`interleaved_until_decided`
measures more rounds while a margin is within the noise, up to a stated budget
(:data:`MAX_ROUNDS_FACTOR` times the planned rounds, :data:`EXTRA_SECONDS` of extra time, and
:data:`RUN_EXTRA_SECONDS` for all measurements of a run together), after which the claim is
*inconclusive*, with the numbers.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import torch

from .. import SEED
from .accel import elapsed, sync
from .settings import timing_threads

#: torch intra-op threads while timing on a CPU. One thread: on a CPU shared with other work a
#: multi-threaded matrix product waits at every barrier for a descheduled thread (a [2, 896] x
#: [896, 4864] product took 24 ms on two threads against 3 ms on one, and a decode step at
#: context 1,024 came out 2x slower than at 16 while the machine was busy). One thread gives
#: ratios that survive a busy machine. ``CHEAPINFER_TIMING_THREADS=0`` leaves torch's default.
#: A value that is not an integer >= 0 leaves the default here (an import must not fail): the commands
#: that time and the pytest plugin refuse it first, with one line (``settings.timing_threads``).
try:
    TIMING_THREADS = timing_threads()
except ValueError:
    TIMING_THREADS = 1


def device_threads(device: torch.device | str) -> int | None:
    """The torch threads a timed block runs with on ``device``: ``TIMING_THREADS`` on a CPU, None (the setting left alone) elsewhere."""
    return TIMING_THREADS if torch.device(device).type == "cpu" else None


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
    #: forwards of the counted model in each timed call, where the timing counted them (:func:`cheapinfer.runtime.evidence.counted`)
    forwards: list[int] = field(default_factory=list)

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


class Marks(dict):
    """What a timed variant may return: seconds from the start of its call to each of its marks (mark -> seconds),
    e.g. to token k of a generation, read after a device sync. :func:`interleaved` keeps each mark as a series of
    its own, named by :func:`mark_name`, so a quantity can read a time inside a run (token 12 of a 48-token
    generation) round by round, beside the other variants of that round."""


def mark_name(variant: str, mark: object) -> str:
    """The series of ``variant``'s times to ``mark``: ``"cached@12"``."""
    return f"{variant}@{mark}"


#: The order of the variants within each round of :func:`interleaved`: seeded once per process, so a run repeats.
ORDER = random.Random(SEED)


def interleaved(
    variants: Mapping[str, Callable[[], object]],
    rounds: int = 7,
    warmup: int = 1,
    device: torch.device | str = "cpu",
) -> dict[str, Samples]:
    """Time each callable ``rounds`` times, interleaved: a, b, c, a, b, c, ...

    Each variant runs ``warmup`` times first (allocator, caches, lazy init). Each round runs the variants in a
    fresh random order (:data:`ORDER`, seeded): a call is slowed by what ran just before it (a large step
    leaves the allocator and the caches cold: a 1-row decode step of the bf16 twin took 1.4x as long after a
    128-row step as after a 2-row one), so a fixed order, rotated or not (a rotation keeps every variant's
    predecessor), biases the variants it always puts after a heavy one; a random order turns that into noise
    the rounds' spread shows. On a CPU the block
    runs with ``TIMING_THREADS`` torch threads. A variant that returns :class:`Marks` adds one series per
    mark (:func:`mark_name`) beside its whole call's.
    """
    names = list(variants)
    threads = device_threads(device)
    out = {name: Samples(name, []) for name in names}
    with torch.inference_mode(), cpu_threads(threads):
        for _ in range(warmup):
            for name in names:
                variants[name]()
        sync(device)
        for r in range(rounds):
            order = ORDER.sample(names, len(names))
            for name in order:
                kept: list[Marks] = []
                out[name].seconds.append(elapsed(_keeping_marks(variants[name], kept), device))
                for mark, seconds in (kept[0] if kept else {}).items():
                    out.setdefault(mark_name(name, mark), Samples(mark_name(name, mark), [])).seconds.append(seconds)
    return out


def _keeping_marks(fn: Callable[[], object], kept: list) -> Callable[[], None]:
    """``fn`` as a call that keeps what it returns only where that is :class:`Marks` (anything else dies at once, as before)."""

    def call() -> None:
        got = fn()
        if isinstance(got, Marks):
            kept.append(got)

    return call


# ------------------------------------------------------------------------------------------------
# noise: estimates with their standard errors, and more rounds while a check cannot decide
# ------------------------------------------------------------------------------------------------

#: A measurement that cannot decide takes at most this many times its planned rounds in all.
MAX_ROUNDS_FACTOR = 4
#: ... and at most this much extra time (seconds) beyond its planned rounds.
EXTRA_SECONDS = 90.0
#: All the measurements of one process together take at most this much extra time (seconds): a busy machine that
#: leaves many checks within their noise makes the later ones inconclusive once it is spent, rather than the run
#: many minutes longer (the quiet CPU suite stays within its ten minutes on two cores).
RUN_EXTRA_SECONDS = 150.0
_run_extra_spent = [0.0]


def run_extra_left() -> float:
    """Seconds of :data:`RUN_EXTRA_SECONDS` this process has not yet spent on extra rounds."""
    return max(0.0, RUN_EXTRA_SECONDS - _run_extra_spent[0])
#: sigma from the median absolute deviation (normal noise) times the median's standard-error factor sqrt(pi / 2).
_MAD_TO_SE = 1.4826 * math.sqrt(math.pi / 2)


def robust_se(values: Iterable[float]) -> float:
    """Standard error of the median of ``values``: 1.4826 MAD sqrt(pi/2) / sqrt(n) (``inf`` for fewer than 2)."""
    v = [float(x) for x in values]
    if len(v) < 2 or not all(math.isfinite(x) for x in v):
        return math.inf
    med = statistics.median(v)
    return _MAD_TO_SE * statistics.median(abs(x - med) for x in v) / math.sqrt(len(v))


@dataclass(frozen=True)
class Estimate:
    """A quantity read from timing rounds: its value (from the variants' medians) and its robust standard error."""

    value: float
    se: float
    rounds: int
    per_round: tuple[float, ...]


Quantities = Callable[[Mapping[str, float]], Mapping[str, float]]


def estimates(samples: Mapping[str, Samples], quantities: Quantities) -> dict[str, Estimate]:
    """``quantities(times)`` (variant -> seconds) computed from the medians (the values) and from each round (their noise)."""
    n = min(len(s.seconds) for s in samples.values())
    value = quantities({name: s.median for name, s in samples.items()})
    per_round = [quantities({name: s.seconds[i] for name, s in samples.items()}) for i in range(n)]
    return {q: Estimate(float(v), robust_se(r[q] for r in per_round), n, tuple(float(r[q]) for r in per_round)) for q, v in value.items()}


def measured(found: Mapping[str, Estimate]) -> dict[str, float]:
    """Estimates as measured values for a claim: ``<q>`` and its standard error ``<q>_se``."""
    out: dict[str, float] = {}
    for q, e in found.items():
        out[q], out[f"{q}_se"] = e.value, e.se
    return out


def undecided(found: Mapping[str, Estimate], bounds: Mapping[str, float], sigmas: float) -> list[str]:
    """The quantities whose margin to their bound is within ``sigmas`` standard errors."""
    return [q for q, b in bounds.items() if q in found and not abs(found[q].value - b) >= sigmas * found[q].se]


def interleaved_until_decided(
    variants: Mapping[str, Callable[[], object]],
    quantities: Quantities,
    bounds: Mapping[str, float],
    sigmas: float,
    rounds: int = 7,
    warmup: int = 1,
    device: torch.device | str = "cpu",
    run: Callable[..., dict[str, Samples]] | None = None,
    pending: Callable[[Mapping[str, Estimate]], list[str]] | None = None,
    extra_seconds: float = EXTRA_SECONDS,
) -> dict[str, Samples]:
    """:func:`interleaved`, then more rounds (a block of ``rounds`` at a time, each after one warm-up, none where the
    first block had none: the blocks run back to back, so a caller that warmed up outside the clock stays so) while a
    quantity's margin to its bound (``bounds``: quantity -> bound) is within ``sigmas`` standard errors, up to
    :data:`MAX_ROUNDS_FACTOR` x ``rounds`` in all and ``extra_seconds`` (default :data:`EXTRA_SECONDS`) of extra
    time, within what is left of the process's :data:`RUN_EXTRA_SECONDS`. ``pending(estimates)`` names further undecided quantities where a decision is a rule over several
    estimates rather than one bound (the knee of the batch curve: :func:`cheapinfer.chapter.batching.knee.knee_pending`).
    ``run`` times a block (default :func:`interleaved`; the suite's fixture records it with pytest-benchmark)."""
    run = run or (lambda v, r, w: interleaved(v, rounds=r, warmup=w, device=device))
    t0 = time.perf_counter()
    samples = run(variants, rounds, warmup)
    block = time.perf_counter() - t0  # a block of rounds with its warm-up: what one more block will take, about
    extra = 0.0
    while True:
        found = estimates(samples, quantities)
        if not (undecided(found, bounds, sigmas) or (pending is not None and pending(found))):
            break
        if len(next(iter(samples.values())).seconds) + rounds > MAX_ROUNDS_FACTOR * rounds or extra + block > extra_seconds:
            break
        if block > run_extra_left():  # the run's shared extra time is spent
            break
        t0 = time.perf_counter()
        more = run(variants, rounds, min(warmup, 1))
        spent = time.perf_counter() - t0
        extra += spent
        _run_extra_spent[0] += spent
        samples = {name: Samples(name, samples[name].seconds + more[name].seconds) for name in samples}
    return samples
