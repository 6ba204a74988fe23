"""Section 2, batching: the setting the batch claims share, and the batch curve's clocked quantities.

One interleaved run times a decode step at every batch size the selected claims need (``batch_sizes``), in the
model's serving dtype (``serving``); BAT-1-TO-16, BAT-KNEE, BAT-TRADEOFF and BAT-STATIC-CONT all read it. The
rounds go on while a noisy check cannot decide, so the quantities those checks judge are computed from every
round's step times (``curve_quantities``). The pytest fixtures that hold the run are ``fixtures/batch_curve.py``.
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterable, Mapping, Sequence

import torch

from ...runtime import models, timing
from . import batching, knee, workload

CONTEXT = 64  # tokens each request holds in its cache (the book's setting)
SLOTS = 8  # the continuous-batching slots of the book's workload
KNEE_GAIN = 1.25  # a doubling of the batch that buys less than this is past the knee
ROUNDS = 5  # median of 5 interleaved rounds (more while a noisy check cannot decide): the batch-128 step dominates on 2 CPU cores
#: The claims that read the batch curve, measured once for all of them (the rounds serve every one).
CURVE_CLAIMS = ("BAT-1-TO-16", "BAT-KNEE", "BAT-TRADEOFF", "BAT-STATIC-CONT")
#: Lengths of the real static-vs-continuous and paged runs are divided by this on CPU (same skew, fewer steps).
CPU_LENGTH_SCALE = 16
DRAWS = 200  # other workloads with the book's printed statistics, for the ratios' sensitivity to the lengths


def length_scale(device: torch.device) -> int:
    """What the real runs divide the workload's lengths by here: 1 on CUDA, ``CPU_LENGTH_SCALE`` elsewhere."""
    return 1 if device.type == "cuda" else CPU_LENGTH_SCALE


def powers(up_to: int) -> list[int]:
    return [2**i for i in range(up_to.bit_length()) if 2**i <= up_to]


def batch_sizes(claims: Iterable[str], device: torch.device) -> list[int]:
    """The batch sizes the selected claims need, measured together in one interleaved run.

    BAT-1-TO-16: 1, 2, 4, 8, 16. BAT-STATIC-CONT: 1..8 (the step costs of 1..8 occupied slots).
    BAT-KNEE and BAT-TRADEOFF: the powers of two up to 128 (256 on CUDA, where it is cheap), the rows of the
    chapter's table. Where the knee lies beyond them, BAT-KNEE's own search doubles on
    (:func:`cheapinfer.chapter.batching.knee.search_knee`): with AMX bf16 kernels one CPU thread still gained 1.31x at
    128 -> 256 and 1.07x at 256 -> 512. BAT-TRADEOFF compares every pair of what is measured here.
    """
    claims = set(claims)
    sizes = set(powers(16))
    if "BAT-STATIC-CONT" in claims:
        sizes |= set(range(1, SLOTS + 1))
    if "BAT-KNEE" in claims or "BAT-TRADEOFF" in claims:
        sizes |= set(powers(256 if device.type == "cuda" else 128))
    return sorted(sizes)


def name(b: int) -> str:
    """The timed variant of batch size ``b``."""
    return f"batch={b}"


def curve_quantities(sizes: Sequence[int], selected: Sequence[str]) -> Callable[[Mapping[str, float]], dict[str, float]]:
    """One set of step times (variant -> seconds) -> the clocked quantities the selected claims judge: BAT-1-TO-16's
    gains from 1 to 16, every doubling's gains (BAT-KNEE), and BAT-STATIC-CONT's seeded ratios (the schedules
    simulated with these step costs)."""
    lengths = workload.skewed_lengths()

    def quantities(t) -> dict[str, float]:
        step = {b: t[name(b)] for b in sizes}
        # A request's latency is what batching.request_latency says it waits (the whole step), here as everywhere
        out = {"throughput_gain": 16 * step[1] / step[16], "latency_gain": batching.request_latency(step[16], 16) / batching.request_latency(step[1], 1),
               **knee.doubling_quantities(step)}
        if "BAT-STATIC-CONT" in selected:
            r = workload.compare(lengths, SLOTS, {k: step[k] for k in range(1, SLOTS + 1)})
            out["seeded_throughput_ratio"], out["seeded_latency_ratio"] = r["throughput_ratio"], r["latency_ratio"]
        return out

    return quantities


def medians(rounds: Mapping[int, Sequence[float]]) -> dict[int, float]:
    """Batch size -> the median of its rounds' step seconds."""
    return {b: statistics.median(v) for b, v in rounds.items()}


def estimates(rounds: Mapping[int, Sequence[float]], selected: Sequence[str]) -> dict[str, timing.Estimate]:
    """The batch curve's clocked quantities with their standard errors over the rounds (:func:`curve_quantities`)."""
    samples = {name(b): timing.Samples(name(b), list(v)) for b, v in rounds.items()}
    return timing.estimates(samples, curve_quantities(sorted(rounds), selected))


def power_points(points):
    """The points at powers of two: the rows of the chapter's table."""
    return [p for p in points if p.batch & (p.batch - 1) == 0]


def serving(device: torch.device) -> dict[str, str]:
    """The dtype the batch claims step the model in here, and why (on a CPU: the kernel family this run may use)."""
    dtype = models.claim_dtype("serving", device)
    return {"serving_dtype": dtype, "serving_dtype_why": models.cpu_bf16_native()[1] if device.type == "cpu" else "fp16 on CUDA, as the chapter serves it"}
