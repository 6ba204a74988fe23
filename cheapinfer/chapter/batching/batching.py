"""Section 2, batching: the batch curve.

:func:`decode_step` builds, for a batch of ``B`` requests that each hold a ``context``-token KV cache, a
callable that decodes one token for all of them (one forward pass of a transformers model over a real
``DynamicCache``). Timed at B = 1, 2, 4, ..., it gives the per-step latency (:func:`request_latency`: what
every request in the step waits) and the throughput B / latency; :func:`curve` tabulates them, and
:func:`tradeoff` compares every pair of batch sizes against the spread of the timing rounds. The knee of
the curve is :mod:`cheapinfer.chapter.batching.knee`; static against continuous batching is
:mod:`cheapinfer.chapter.batching.workload` (the workload and the simulation), :mod:`cheapinfer.chapter.batching.scheduler`
(the real run) and :mod:`cheapinfer.chapter.batching.paged_scheduler` (the real run on the paged cache).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from ... import SEED
from ...runtime import hf
from ..kv_cache.kv import random_cache

# ----------------------------------------------------------------------------------------------
# the batch curve
# ----------------------------------------------------------------------------------------------


#: Requests whose random cache is drawn for a batch step; a larger batch repeats them. A step's cost depends on how
#: many cached tokens it reads, not on their values, and the knee search's large batches (thousands of rows on a GPU)
#: then build their caches on the device at once instead of drawing millions of random numbers on the CPU.
CACHE_TILE = 256


def decode_step(model, batch: int, context: int = 64, seed: int = SEED) -> Callable[[], torch.Tensor]:
    """One decode step for ``batch`` requests holding ``context`` cached tokens each.

    The returned callable runs one forward pass (one new token per request, at position
    ``context``) and drops the token it appended, so every call measures the same step. Beyond
    :data:`CACHE_TILE` requests the cached keys and values repeat those of the first ones.
    """
    p = next(model.parameters())
    cache = batch_cache(model, batch, context, seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), generator=torch.Generator().manual_seed(seed)).to(p.device)  # [B, 1]
    positions = torch.full((batch, 1), context, dtype=torch.long, device=p.device)  # [B, 1]

    def step() -> torch.Tensor:
        with torch.inference_mode():
            out = step_forward(model, ids, cache, positions)
            hf.crop(cache, context)  # back to ``context`` tokens: drop the token the step appended
            return out.logits[:, -1].argmax(-1)  # [B]

    return step


def step_forward(model, ids: torch.Tensor, cache, positions: torch.Tensor, attention_mask: torch.Tensor | None = None):
    """The batch's decode forward: ``ids`` [B, T] at ``positions`` [B, T] against ``cache``, which it extends.

    Every decode forward of the batch curve and of both schedulers goes through here."""
    extra = {} if attention_mask is None else {"attention_mask": attention_mask}
    return hf.forward(model, ids, cache=cache, position_ids=positions, use_cache=True, **extra)


def batch_cache(model, batch: int, context: int, seed: int = SEED):
    """A random ``DynamicCache`` of ``context`` tokens for each of ``batch`` requests, in the model's dtype and on its
    device; beyond :data:`CACHE_TILE` requests the keys and values repeat those of the first ones."""
    p = next(model.parameters())
    cache = random_cache(model.config, context, p.dtype, p.device, seed, min(batch, CACHE_TILE))
    if batch > CACHE_TILE:
        rows = torch.arange(batch, device=p.device) % CACHE_TILE
        for layer in cache.layers:  # [CACHE_TILE, H, C, D] -> [B, H, C, D]
            layer.keys, layer.values = layer.keys[rows], layer.values[rows]
    return cache


@dataclass(frozen=True)
class Point:
    batch: int
    latency_s: float  # one step: what every request in the batch waits for its token
    throughput: float  # tokens per second: batch / latency

    def row(self, base: "Point") -> list[object]:
        return [self.batch, f"{self.latency_s * 1e3:.1f}", f"{self.throughput:.2f}", f"{self.throughput / base.throughput:.2f}x", f"{self.latency_s / base.latency_s:.2f}x"]


CURVE_HEADER = ["batch", "latency per request (ms)", "throughput (tokens/s)", "throughput vs batch 1", "latency vs batch 1"]


def request_latency(step_s: float, batch: int) -> float:
    """What one request of a batch waits for its token: the whole step (every row's token comes out of the same pass)."""
    return step_s


def curve(step_seconds: Mapping[int, float]) -> list[Point]:
    """Batch size -> median step time, as points sorted by batch size."""
    out = []
    for b, s in sorted(step_seconds.items()):
        lat = request_latency(s, b)
        out.append(Point(b, lat, b / s))
    return out


def gains(points: Sequence[Point], small: int, large: int) -> tuple[float, float]:
    """(throughput gain, latency gain) from batch ``small`` to batch ``large``."""
    by = {p.batch: p for p in points}
    return by[large].throughput / by[small].throughput, by[large].latency_s / by[small].latency_s


def quartiles(seconds: Sequence[float]) -> tuple[float, float]:
    """(first, third) quartile of the rounds (``statistics.quantiles``, exclusive method); one value: (it, it)."""
    if len(seconds) < 2:
        return seconds[0], seconds[0]
    q = statistics.quantiles(seconds, n=4)
    return q[0], q[2]


def faster_beyond_noise(fast: Sequence[float], slow: Sequence[float]) -> bool:
    """The suite's rank test on two sets of rounds: ``fast``'s third quartile lies below ``slow``'s first (their
    interquartile ranges do not overlap). Its level on equal costs is :func:`equal_steps_false_alarm`."""
    return quartiles(fast)[1] < quartiles(slow)[0]


@dataclass(frozen=True)
class Tradeoff:
    pairs: int  # pairs (smaller, larger batch) compared
    beyond_noise: list[tuple[int, int]]  # the larger batch improves both, and its rounds' IQR lies below the smaller one's
    by_median: list[tuple[int, int]]  # the larger batch improves both by the medians alone (noise included)


def tradeoff(rounds: Mapping[int, Sequence[float]]) -> Tradeoff:
    """Every pair of measured batch sizes a < b: does b improve both throughput and per-request latency?

    ``rounds[b]`` are the step times of batch ``b`` over the interleaved rounds. Per-request latency is
    :func:`request_latency` of each round; throughput is b / step. Since b > a, a lower latency at b
    also means more throughput, so "both improve" is decided by latency. The noise band is the
    rounds' spread: b improves both *beyond noise* when the third quartile of its latencies lies
    below the first quartile of a's (the interquartile ranges do not overlap).
    """
    sizes = sorted(rounds)
    lat = {b: [request_latency(x, b) for x in rounds[b]] for b in sizes}
    tput = {b: b / statistics.median(rounds[b]) for b in sizes}
    beyond, median = [], []
    for i, a in enumerate(sizes):
        for b in sizes[i + 1 :]:
            if statistics.median(lat[b]) < statistics.median(lat[a]) and tput[b] > tput[a]:
                median.append((a, b))
                if faster_beyond_noise(lat[b], lat[a]):
                    beyond.append((a, b))
    return Tradeoff(len(sizes) * (len(sizes) - 1) // 2, beyond, median)


def weights_pass(model, batch: int, seed: int = SEED) -> Callable[[], None]:
    """Every matrix product of one decode step, alone: each ``nn.Linear`` of ``model`` (the LM head included) applied
    to ``batch`` rows in the model's dtype, no attention, no cache.

    The probe of BAT-TRADEOFF's premise: one read of the weights serves every row, so more rows never cost less.
    Where this pass is itself faster at ``b`` rows than at ``a < b`` (a kernel that takes a slower path for fewer
    rows), the device cannot show whether batching improves both: the kernel does, with or without a batch."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    p = next(model.parameters())
    g = torch.Generator().manual_seed(seed)
    inputs = {n: torch.randn(batch, n, generator=g).to(device=p.device, dtype=p.dtype) for n in {m.in_features for m in layers}}

    def run() -> None:
        with torch.inference_mode():
            for m in layers:
                m(inputs[m.in_features])

    return run


@dataclass(frozen=True)
class KernelProbe:
    rounds: dict[int, list[float]]  # batch -> seconds of :func:`weights_pass` over the interleaved rounds
    inverted: list[tuple[int, int]]  # pairs (a, b) of the asked ones where b's products alone are faster beyond noise

    def medians_ms(self, a: int, b: int) -> str:
        return f"{statistics.median(self.rounds[a]) * 1e3:.1f} ms at {a} rows, {statistics.median(self.rounds[b]) * 1e3:.1f} ms at {b}"


def kernel_probe(model, pairs: Sequence[tuple[int, int]], rounds: int, device: torch.device | str = "cpu") -> KernelProbe:
    """Time :func:`weights_pass` at the sizes of ``pairs`` (interleaved, random order, one warm-up) and name the pairs
    where the larger size's products alone are faster beyond the rounds' noise: the same rank test as :func:`tradeoff`'s
    (the larger size's third quartile below the smaller's first), on the products' own times."""
    from ...runtime import timing

    sizes = sorted({b for pair in pairs for b in pair})
    samples = timing.interleaved({f"batch={b}": weights_pass(model, b) for b in sizes}, rounds=rounds, warmup=1, device=device)
    times = {b: list(samples[f"batch={b}"].seconds) for b in sizes}
    # The raw times of the products, not a request's latency: what a step's rows wait for is not the probe's question.
    return KernelProbe(times, [(a, b) for a, b in pairs if faster_beyond_noise(times[b], times[a])])


def equal_steps_false_alarm(rounds: int = 5, draws: int = 20_000, noise: Callable[[random.Random], float] | None = None, seed: int = SEED) -> float:
    """The level of :func:`tradeoff`'s noise test: how often it says "b improves both" when b and a cost the same.

    Both sizes draw ``rounds`` step times from the same distribution (``noise``, a standard normal by
    default); the share of draws where b's third quartile lies below a's first is the chance that one
    pair of equal true step times turns BAT-TRADEOFF red.
    """
    rng = random.Random(seed)
    draw = noise or (lambda r: r.gauss(0.0, 1.0))
    hits = 0
    for _ in range(draws):
        a = [draw(rng) for _ in range(rounds)]
        b = [draw(rng) for _ in range(rounds)]
        hits += faster_beyond_noise(b, a)
    return hits / draws
