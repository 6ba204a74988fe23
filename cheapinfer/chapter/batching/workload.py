"""Section 2, batching: the workload and the simulation of static against continuous batching.

:func:`skewed_lengths`: 64 output lengths with exactly the chapter's printed median (18), maximum (231) and
total (1,874), drawn deterministically from a seeded log-normal. The chapter prints only these statistics,
so they are the workload's parameters; :func:`sensitivity` repeats the comparison over other draws with
the same statistics. :func:`simulate` runs static or continuous batching over the lengths with a per-step
cost that depends only on the number of occupied slots (measured on the machine).

The scheduling model (stated once, used by both the simulation and the real run,
:mod:`cheapinfer.chapter.batching.scheduler`):

- all requests arrive at t = 0 and queue in a fixed, seeded order;
- ``slots`` requests decode at a time; one step emits one token for every occupied slot;
- a request of output length L occupies its slot for exactly L steps (its one-token prompt is
  consumed by its first step; end-of-sequence is ignored: lengths are imposed, as in a replay);
- static: the queue is cut into groups of ``slots``; a group runs until its longest member is done;
  finished members keep their slot and keep decoding as padding (the step cost stays that of a full
  batch); every member is returned when the group is done;
- continuous: a slot freed at step s admits the next queued request at step s + 1; when the queue
  is empty the batch shrinks, and the step cost is that of the occupied slots;
- the cost of a step depends only on the number of occupied slots (the contexts here are short,
  at most a few hundred tokens, so attention over the cache is a small part of a step);
- latency of a request = time from t = 0 (its arrival) until it is returned, so it includes its
  wait in the queue; the service latency (from admission) is reported beside it;
- throughput = generated tokens (padding excluded) / time until the last request is returned.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ... import SEED

# ----------------------------------------------------------------------------------------------
# the workload
# ----------------------------------------------------------------------------------------------


def skewed_lengths(n: int = 64, median: int = 18, longest: int = 231, total: int = 1_874, seed: int = SEED, sigma: float = 0.8) -> list[int]:
    """``n`` output lengths with exactly this median, maximum and total, in a seeded arrival order.

    Draw a log-normal around ``median`` (``sigma`` sets the skew), sort, pin the two middle values
    to ``median`` (``n`` even) and the largest to ``longest`` (the only request that long), then
    move the total to ``total`` by +-1 steps round-robin over the other values, largest first:
    those above the median stay within [median, longest - 1], those below within [1, median], so
    the three statistics hold exactly. The order is a seeded permutation (the arrival order).
    """
    if n % 2 or n < 4:
        raise ValueError("n must be even and >= 4 (the median is the mean of the two middle values)")
    rng = np.random.default_rng(seed)
    x = np.sort(np.clip(np.rint(median * np.exp(sigma * rng.standard_normal(n))), 1, longest)).astype(int)
    mid = n // 2
    x[:mid] = np.minimum(x[:mid], median)
    x[mid - 1] = x[mid] = median
    x[mid + 1 :] = np.clip(x[mid + 1 :], median, longest - 1)  # one longest request
    x[-1] = longest
    movable = [(i, median, longest - 1) for i in range(n - 2, mid, -1)] + [(i, 1, median) for i in range(mid - 2, -1, -1)]
    lowest = sum(lo for _, lo, _ in movable) + 2 * median + longest
    highest = sum(hi for _, _, hi in movable) + 2 * median + longest
    if not lowest <= total <= highest:
        raise ValueError(f"no {n} lengths with median {median}, maximum {longest} and total {total}")
    diff = total - int(x.sum())
    step = 1 if diff > 0 else -1
    while diff:  # terminates: the total is reachable within the bounds
        for i, lo, hi in movable:
            if diff and lo <= x[i] + step <= hi:
                x[i] += step
                diff -= step
    x = np.sort(x)
    return [int(v) for v in rng.permutation(x)]


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    return {"median_len": statistics.median(lengths), "max_len": max(lengths), "total_len": sum(lengths), "requests": len(lengths)}


def scaled(lengths: Sequence[int], factor: int) -> list[int]:
    """Lengths divided by ``factor``, rounded up (>= 1): the same skew, fewer steps."""
    return [max(1, math.ceil(L / factor)) for L in lengths]


# ----------------------------------------------------------------------------------------------
# static vs continuous batching: the simulation
# ----------------------------------------------------------------------------------------------


@dataclass
class PolicyResult:
    policy: str
    makespan_s: float
    tokens: int
    steps: int
    latency_s: list[float]  # per request, from t = 0 to return, in request order
    service_s: list[float]  # per request, from admission to return
    busy_slot_steps: int = 0  # slot-steps that carried a real token
    padded_slot_steps: int = 0  # slot-steps spent as padding (static only)
    step_s: list[float] = field(default_factory=list)  # a real run's steps, each one's seconds, in order (empty when simulated)

    @property
    def throughput(self) -> float:
        return self.tokens / self.makespan_s

    @property
    def mean_latency_s(self) -> float:
        return statistics.fmean(self.latency_s)

    @property
    def mean_service_s(self) -> float:
        return statistics.fmean(self.service_s)


def simulate(policy: str, lengths: Sequence[int], slots: int, step_cost: Mapping[int, float]) -> PolicyResult:
    """Static or continuous batching under the module's scheduling model; ``step_cost[k]`` = seconds of a step with k occupied slots."""
    if policy == "static":
        t, steps, latency, service, pad = 0.0, 0, [0.0] * len(lengths), [0.0] * len(lengths), 0
        for g in range(0, len(lengths), slots):
            group = range(g, min(g + slots, len(lengths)))
            longest = max(lengths[i] for i in group)
            start, t = t, t + longest * step_cost[len(group)]
            steps += longest
            pad += sum(longest - lengths[i] for i in group)
            for i in group:
                latency[i], service[i] = t, t - start
        return PolicyResult("static", t, sum(lengths), steps, latency, service, sum(lengths), pad)
    if policy != "continuous":
        raise ValueError(f"policy must be static or continuous, not {policy!r}")
    queue = list(range(len(lengths)))[::-1]
    active: dict[int, int] = {}  # request -> tokens still to generate
    admitted: dict[int, float] = {}
    latency, service = [0.0] * len(lengths), [0.0] * len(lengths)
    t, steps = 0.0, 0
    while queue or active:
        while queue and len(active) < slots:
            r = queue.pop()
            active[r], admitted[r] = lengths[r], t
        t += step_cost[len(active)]
        steps += 1
        for r in list(active):
            active[r] -= 1
            if active[r] == 0:
                del active[r]
                latency[r], service[r] = t, t - admitted[r]
    return PolicyResult("continuous", t, sum(lengths), steps, latency, service, sum(lengths), 0)


def ratios(static: PolicyResult, continuous: PolicyResult) -> dict[str, float]:
    """Throughput continuous / static; mean latency static / continuous (from arrival and from admission)."""
    return {
        "throughput_ratio": continuous.throughput / static.throughput,
        "latency_ratio": static.mean_latency_s / continuous.mean_latency_s,
        "service_latency_ratio": static.mean_service_s / continuous.mean_service_s,
        "static_steps": static.steps,
        "continuous_steps": continuous.steps,
    }


def compare(lengths: Sequence[int], slots: int, step_cost: Mapping[int, float]) -> dict[str, float]:
    """Both policies simulated; ratios continuous over static (throughput) and static over continuous (latency)."""
    s, c = simulate("static", lengths, slots, step_cost), simulate("continuous", lengths, slots, step_cost)
    return {**ratios(s, c), "static_padding_fraction": s.padded_slot_steps / (s.padded_slot_steps + s.busy_slot_steps)}


@dataclass(frozen=True)
class Sensitivity:
    """Static vs continuous over many workloads that all have the book's printed statistics."""

    throughput: list[float]  # continuous / static throughput, one per workload (the seeded one first)
    latency: list[float]  # static / continuous mean latency (both from arrival), one per workload
    throughput_constant_cost: list[float]  # the same with every step costing what a full batch costs
    latency_constant_cost: list[float]
    mixed_latency: float  # the seeded workload: static latency from arrival, continuous from admission
    workloads: tuple[tuple[int, ...], ...] = ()  # the length vectors simulated, in the order of the ratios

    def repeated_workloads(self) -> int:
        """How many of the ratios' workloads are not a length vector of their own (0 when every one was drawn anew;
        all of them when the workloads were not kept)."""
        return len(self.throughput) - len(set(self.workloads))


def sensitivity(lengths: Sequence[int], slots: int, step_cost: Mapping[int, float], draws: int = 200, seed: int = SEED) -> Sensitivity:
    """The seeded workload and ``draws`` other seeded workloads with the same median, maximum and total, each
    simulated under both policies with the measured step costs, and again with a constant step cost
    (every step costing ``step_cost[slots]``: the book's "measured per-step cost for eight slots" read as one
    cost for every step). The book printed only the three statistics, not its lengths: the spread over
    the draws is how much the ratios depend on the lengths the statistics leave open."""
    full = dict.fromkeys(step_cost, step_cost[slots])
    workloads = [list(lengths)] + [skewed_lengths(len(lengths), seed=seed + 1 + i) for i in range(draws)]
    measured = [compare(w, slots, step_cost) for w in workloads]
    constant = [compare(w, slots, full) for w in workloads]
    s, c = simulate("static", lengths, slots, step_cost), simulate("continuous", lengths, slots, step_cost)
    return Sensitivity(
        [m["throughput_ratio"] for m in measured],
        [m["latency_ratio"] for m in measured],
        [m["throughput_ratio"] for m in constant],
        [m["latency_ratio"] for m in constant],
        s.mean_latency_s / c.mean_service_s,
        tuple(tuple(w) for w in workloads),
    )
