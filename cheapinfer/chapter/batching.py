"""Section 2, batching: the batch curve, its knee, and static vs continuous batching.

Three pieces, all usable without pytest:

- **The batch curve.** :func:`decode_step` builds, for a batch of ``B`` requests that each hold a
  ``context``-token KV cache, a callable that decodes one token for all of them (one forward pass
  of a transformers model over a real ``DynamicCache``). Timed at B = 1, 2, 4, ..., it gives the
  per-step latency (:func:`request_latency`: what every request in the step waits) and the
  throughput B / latency; :func:`curve` tabulates them, :func:`doublings` gives each doubling's gains
  with their standard errors over the rounds, :func:`knee` finds the first doubling past the steepest
  one whose throughput gain is below a threshold beyond the noise and :func:`knee_summary` the gains
  either side of it; :func:`tradeoff` compares every pair of batch sizes against the spread of the
  timing rounds.
- **The knee search.** A knee exists on every device, but where it is depends on the device. The
  curve is measured up to a fixed size; :func:`search_knee` doubles on past it, one size at a time,
  until the knee is found or :func:`plan_next` finds the next size beyond the device's memory or the
  search's time budget (:class:`Budget`), and says where it stopped and why.
- **The workload.** :func:`skewed_lengths`: 64 output lengths with exactly the chapter's printed
  median (18), maximum (231) and total (1,874), drawn deterministically from a seeded log-normal.
  The chapter prints only these statistics, so they are the workload's parameters;
  :func:`sensitivity` repeats the comparison over other draws with the same statistics.
- **Two schedulers.** :func:`simulate` runs static or continuous batching over the lengths with a
  per-step cost that depends only on the number of occupied slots (measured on the machine);
  :func:`run_policies` runs both policies for real: a scheduler over real decode steps of a model
  with a real batched KV cache whose rows are refilled (continuous) or padded (static);
  :func:`validate` runs both and simulates both with step costs probed on the same model during
  the run, so the simulation can be checked against reality.

The scheduling model (stated once, used by both the simulation and the real run):

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
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .. import SEED
from ..runtime import hf
from ..runtime.device import sync
from .kv import random_cache

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
            cache.crop(-1)  # back to ``context`` tokens
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


# ----------------------------------------------------------------------------------------------
# the knee: where a doubling of the batch stops paying, decided over the rounds' noise
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Doubling:
    """One doubling ``b -> 2b`` of the batch, both sizes timed in the same interleaved rounds.

    The gains are read from the two sizes' median step times; their standard errors from the same gain
    computed round by round (:func:`cheapinfer.runtime.timing.estimates`). Throughput is batch / step, so the
    throughput gain of a doubling is 2 t(b) / t(2b) and its latency gain t(2b) / t(b) = 2 / throughput gain.
    """

    small: int
    large: int
    gain: float  # throughput gain
    gain_se: float
    latency_gain: float
    latency_se: float
    rounds: int

    def side(self, threshold: float, sigmas: float) -> str:
        """Where this doubling lies against ``threshold`` (a throughput gain), decided over its noise.

        ``"below"``: it buys less than ``threshold``, by ``sigmas`` standard errors: its latency gain exceeds
        2 / ``threshold`` by ``sigmas`` of its own standard errors (the same rule as a noisy check of the
        registry, on the quantity the claim words: latency nearly doubles). ``"above"``: it buys more, by as
        much. ``"undecided"``: within the noise.
        """
        bound = 2 / threshold
        margin = self.latency_gain - bound
        if not math.isfinite(margin) or not abs(margin) >= sigmas * self.latency_se:
            return "undecided"
        return "below" if margin > 0 else "above"


def doubling_quantities(steps: Mapping[int, float]) -> dict[str, float]:
    """One set of step times (batch -> seconds) as the gains of every doubling in it: ``gain@b`` and ``latency@b``."""
    out = {}
    for b in sorted(steps):
        if 2 * b in steps:
            out[f"gain@{b}"] = 2 * steps[b] / steps[2 * b]
            out[f"latency@{b}"] = steps[2 * b] / steps[b]
    return out


def doublings(rounds: Mapping[int, Sequence[float]]) -> list[Doubling]:
    """Every doubling ``b -> 2b`` among the measured sizes (``rounds[b]``: batch b's step times, round by round,
    all sizes timed in the same rounds), in order of size."""
    from ..runtime.timing import Samples, estimates

    samples = {str(b): Samples(str(b), list(v)) for b, v in rounds.items()}
    found = estimates(samples, lambda t: doubling_quantities({int(b): s for b, s in t.items()}))
    return [
        Doubling(b, 2 * b, found[f"gain@{b}"].value, found[f"gain@{b}"].se, found[f"latency@{b}"].value, found[f"latency@{b}"].se, found[f"gain@{b}"].rounds)
        for b in sorted(rounds) if 2 * b in rounds
    ]


def request_latency_gain(rounds: Mapping[int, Sequence[float]], small: int):
    """The latency gain of ``small -> 2 small`` as a request sees it (:func:`request_latency` of each size), from
    step times timed side by side (``rounds[b]``: batch b's step times, round by round): a
    :class:`cheapinfer.runtime.timing.Estimate`, its value from the medians and its standard error from the rounds."""
    from ..runtime.timing import Samples, estimates

    samples = {str(b): Samples(str(b), list(v)) for b, v in rounds.items() if b in (small, 2 * small)}

    def gain(t: Mapping[str, float]) -> dict[str, float]:
        return {"latency_gain": request_latency(t[str(2 * small)], 2 * small) / request_latency(t[str(small)], small)}

    return estimates(samples, gain)["latency_gain"]


def _steepest(found: Sequence[Doubling]) -> int | None:
    """Index of the doubling with the largest throughput gain (by its median)."""
    return max(range(len(found)), key=lambda i: found[i].gain) if found else None


def knee(found: Sequence[Doubling], threshold: float = 1.25, sigmas: float = 3.0) -> int | None:
    """The knee: the batch ``b`` of the first doubling ``b -> 2b`` after the steepest one that buys less than
    ``threshold``, decided over the noise (:meth:`Doubling.side` is ``"below"``); None where no such doubling was
    measured. A doubling the noise leaves undecided is not a knee: the search goes on past it.

    Searching only past the steepest doubling skips a flat start that is no knee (on a CPU one row
    takes a matrix-vector kernel and two rows a matrix-matrix one, so 1 -> 2 can gain nothing).
    """
    steepest = _steepest(found)
    if steepest is None:
        return None
    for d in found[steepest + 1 :]:
        if d.side(threshold, sigmas) == "below":
            return d.small
    return None


def knee_on_book_curve(book_from: int, book_gain: float, gain_before: float = 1.9, threshold: float = 1.25, sigmas: float = 3.0) -> int:
    """The knee rule (:func:`knee`) applied to a curve whose knee is known: doublings 1 -> 2 up to ``book_from``
    that each gain ``gain_before`` (memory-bound: a doubling nearly doubles throughput), then the book's own
    doubling ``book_from`` -> 2 ``book_from`` at ``book_gain`` (BAT-KNEE: 16 -> 32 at 1.09x), every gain with a
    standard error of 1 % (far inside the threshold's margin). The rule must return ``book_from``; 0 where it
    finds no knee. BAT-KNEE runs it on every machine: a rule that stops after its first doubling or looks past
    the knee is red whatever range the measured curve could afford, where the measured search alone would end
    *inconclusive* at its budget."""
    found, b = [], 1
    while b <= book_from:
        gain = book_gain if b == book_from else gain_before
        se = 0.01 * gain
        found.append(Doubling(b, 2 * b, gain, se, 2 / gain, 2 * se / gain**2, 5))
        b *= 2
    return knee(found, threshold, sigmas) or 0


@dataclass(frozen=True)
class Knee:
    batch: int | None  # the knee doubling starts here (None: no knee found)
    throughput_gain: float  # of the knee doubling b -> 2b (nan without a knee)
    latency_gain: float  # of the knee doubling: 2 / throughput_gain, since throughput = batch / latency
    latency_se: float
    gain_before: float  # the steepest doubling before the knee (nan when the knee is the first doubling or absent)
    gain_before_se: float
    doublings: list[Doubling]
    undecided: list[int]  # doublings between the steepest and the knee (or the end) that the noise left undecided
    skipped: int  # doublings past the steepest decided below the threshold that come before the knee reported (or exist, where none is)


def knee_summary(found: Sequence[Doubling], threshold: float = 1.25, sigmas: float = 3.0) -> Knee:
    """The knee found by :func:`knee`, with the gains either side of it that the claim is about.

    ``skipped`` checks the rule against its definition: the doublings past the steepest one that are decided
    below ``threshold`` and come before the knee :func:`knee` reported (all of them, where it reported none).
    A search that returns early or looks past a knee counts them; the rule itself gives 0.
    """
    found = list(found)
    at = knee(found, threshold, sigmas)
    steepest = _steepest(found)
    past = found[steepest + 1 :] if steepest is not None else []
    end = next((i for i, d in enumerate(past) if d.small == at), len(past))
    skipped = sum(d.side(threshold, sigmas) == "below" for d in past[:end])
    undecided = [d.small for d in past[:end] if d.side(threshold, sigmas) == "undecided"]
    if at is None:
        return Knee(None, math.nan, math.nan, math.inf, math.nan, math.inf, found, undecided, skipped)
    i = next(i for i, d in enumerate(found) if d.small == at)
    before = max(found[:i], key=lambda d: d.gain, default=None)
    d = found[i]
    return Knee(at, d.gain, d.latency_gain, d.latency_se, before.gain if before else math.nan, before.gain_se if before else math.inf,
                found, undecided, skipped)


def knee_pending(found: Mapping[str, "timing.Estimate"], threshold: float, sigmas: float, before_bound: float) -> list[str]:
    """The doublings whose noise keeps the knee's verdict open, from the batch curve's estimates (``gain@b``,
    ``latency@b``): for :func:`cheapinfer.runtime.timing.interleaved_until_decided`, which measures more rounds while
    this is not empty. Open: no knee yet, and a doubling past the steepest is undecided (more rounds may decide
    it below); or a knee, and the steepest doubling before it within the noise of ``before_bound``."""
    sizes = sorted(int(k.split("@")[1]) for k in found if k.startswith("gain@"))
    ds = [Doubling(b, 2 * b, found[f"gain@{b}"].value, found[f"gain@{b}"].se, found[f"latency@{b}"].value, found[f"latency@{b}"].se,
                   found[f"gain@{b}"].rounds) for b in sizes]
    k = knee_summary(ds, threshold, sigmas)
    if k.batch is None:
        return [f"latency@{b}" for b in k.undecided]
    if not abs(k.gain_before - before_bound) >= sigmas * k.gain_before_se:
        return ["gain_before_knee"]
    return []


# ----------------------------------------------------------------------------------------------
# the knee search: doubling on past the batch curve until the knee is found or the device's budget is spent
# ----------------------------------------------------------------------------------------------

#: Seconds the knee search may spend beyond the batch curve (building caches, timing, tracing), on any device.
KNEE_SEARCH_SECONDS = 60.0
#: Share of the memory the device reports available (before the search) that a search step may take.
KNEE_SEARCH_MEMORY_FRACTION = 0.5


@dataclass(frozen=True)
class Budget:
    """What the knee search may spend: ``seconds`` of wall-clock time beyond the batch curve, and ``memory_bytes``
    for a step of the search (the resident weights included)."""

    seconds: float
    memory_bytes: int


def activation_bytes(config, batch: int, context: int, bytes_per_element: int) -> int:
    """An upper estimate of what one decode step over ``batch`` rows (one new token each, ``context`` cached
    tokens) allocates besides its weights and caches, per row: the logits (vocabulary x the step's dtype, and again
    in fp32 where a head or the argmax widens them), the keys and values widened to the query heads with their
    scores, the MLP's three intermediate vectors, and one layer's cache grown by the new token (the copy a
    concatenation makes)."""
    from .kv import config_head_dim

    head_dim, ctx = config_head_dim(config), context + 1
    per_row = (
        config.vocab_size * (bytes_per_element + 4)
        + 2 * config.num_attention_heads * ctx * head_dim * bytes_per_element + config.num_attention_heads * ctx * 4
        + 3 * config.intermediate_size * bytes_per_element
        + 2 * config.num_key_value_heads * ctx * head_dim * bytes_per_element
    )
    return batch * per_row


def cache_bytes(config, batch: int, context: int, bytes_per_element: int) -> int:
    """The KV cache of ``batch`` requests holding ``context`` tokens each (plus the step's new token)."""
    from .kv import config_head_dim, kv_bytes_per_token

    return batch * (context + 1) * kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, config_head_dim(config), bytes_per_element)


def stage_bytes(config, weight_bytes: int, small: int, large: int, context: int, bytes_per_element: int) -> int:
    """Memory of one search step ``small -> large``: the weights, both sizes' caches (they are timed side by side)
    and the larger step's activations."""
    return (weight_bytes + cache_bytes(config, small, context, bytes_per_element) + cache_bytes(config, large, context, bytes_per_element)
            + activation_bytes(config, large, context, bytes_per_element))


@dataclass(frozen=True)
class Plan:
    """The planner's answer: the next batch size to measure, or None with the reason the search stops."""

    batch: int | None
    reason: str
    predicted_step_s: float = math.nan
    predicted_stage_s: float = math.nan
    stage_bytes: int = 0


def plan_next(steps: Mapping[int, float], spent_s: float, budget: Budget, memory: Callable[[int, int], int], rounds: int,
              warmup: int = 1, setup_s: float = 0.0) -> Plan:
    """Whether the knee search can afford to double the largest batch measured, ``b``, once more (a pure function).

    ``steps``: batch -> median step seconds of the last sizes measured (``b``, and ``b / 2`` where it was
    measured with it); ``spent_s``: what the search has spent so far; ``memory(b, 2b)``: the bytes a step of the
    search needs (:func:`stage_bytes`); ``setup_s``: what building the last step's cache took. The rule:

    - the next step is predicted at t(2b) = t(b) max(2, t(b) / t(b/2)): in the cost model t(b) = w + b c a
      doubling at most doubles the step, and a growth measured beyond that (caches spilling) is carried forward;
    - a search step times b and 2b side by side for ``warmup + rounds`` rounds and runs 2b once more traced:
      (warmup + rounds) (t(b) + t(2b)) + t(2b), plus twice the last setup (a cache twice the size);
    - it is affordable when its memory is within ``budget.memory_bytes`` and ``spent_s`` plus its predicted
      time within ``budget.seconds``. The first limit reached is the reason the search stops.
    """
    b = max(steps)
    nb = 2 * b
    growth = max(2.0, steps[b] / steps[b // 2]) if b // 2 in steps and b > 1 else 2.0
    t_next = steps[b] * growth
    stage_s = (warmup + rounds) * (steps[b] + t_next) + t_next + 2 * setup_s
    need = memory(b, nb)
    if need > budget.memory_bytes:
        return Plan(None, f"batch {nb} would need {need / 1e9:.2f} GB (weights, the caches of {b} and {nb} requests, the activations of {nb}), "
                          f"more than the {budget.memory_bytes / 1e9:.2f} GB the search may use", t_next, stage_s, need)
    if spent_s + stage_s > budget.seconds:
        return Plan(None, f"batch {nb} would take about {stage_s:.1f} s (a step predicted at {t_next * 1e3:.1f} ms), beyond the "
                          f"{max(budget.seconds - spent_s, 0.0):.1f} s left of the search's {budget.seconds:.0f} s", t_next, stage_s, need)
    return Plan(nb, f"batch {nb}: about {stage_s:.1f} s and {need / 1e9:.2f} GB, within the budget", t_next, stage_s, need)


@dataclass(frozen=True)
class Stage:
    """One step of the knee search: ``small`` and ``large`` timed side by side."""

    small: int
    large: int
    rounds: dict[int, list[float]]
    seconds: float  # wall-clock time of the whole step (setup, timing, trace)
    setup_s: float
    plan: Plan
    evidence: dict = field(default_factory=dict)


@dataclass(frozen=True)
class KneeSearch:
    """Where the knee search ended: the knee over every doubling measured, how far it searched and why it stopped."""

    knee: Knee
    searched_up_to: int  # the largest batch measured
    stopped: str  # why the search stopped
    stages: list[Stage]
    spent_s: float
    last_steps: dict[int, float]  # the median step times the planner saw last
    last_setup_s: float


Measure = Callable[[int, int, float], tuple[dict[int, list[float]], float, dict]]


def search_knee(curve: Mapping[int, Sequence[float]], measure: Measure, budget: Budget, memory: Callable[[int, int], int], rounds: int,
                threshold: float = 1.25, sigmas: float = 3.0, warmup: int = 1, plan: Callable[..., Plan] | None = None,
                clock: Callable[[], float] = time.perf_counter) -> KneeSearch:
    """The knee over the batch curve (``curve``: batch -> step seconds per round, timed together), then, while no
    knee is found, one more doubling of the largest size at a time, as long as :func:`plan_next` (or ``plan``)
    finds it affordable.

    ``measure(b, 2b, seconds)`` times ``b`` and ``2b`` side by side and returns (their rounds, the seconds its
    setup took, the cache-use evidence of the traced step); ``seconds`` is what it may add in extra rounds while
    the new doubling is within the noise of ``threshold``: the budget left after this step and, where the planner
    would afford it, the next one. A doubling the noise leaves open is cheaper to pass than to decide: the next
    one gains less, so more often decides below; extra rounds only use what the next size could not.
    Only the powers of two of ``curve`` are read.
    """
    plan = plan or plan_next
    powers = {b: list(v) for b, v in curve.items() if b & (b - 1) == 0}
    found = doublings(powers)
    k = knee_summary(found, threshold, sigmas)
    largest = max(powers)
    last = {b: statistics.median(powers[b]) for b in (largest // 2, largest) if b in powers}
    spent, setup, stages = 0.0, 0.0, []
    stopped = ""
    while k.batch is None:
        p = plan(last, spent, budget, memory, rounds, warmup=warmup, setup_s=setup)
        if p.batch is None:
            stopped = p.reason
            break
        small = max(last)
        ahead = plan({small: last[small], p.batch: p.predicted_step_s}, spent + p.predicted_stage_s, budget, memory, rounds, warmup=warmup, setup_s=setup)
        reserve = ahead.predicted_stage_s if ahead.batch is not None else 0.0
        t0 = clock()
        timed, setup, used = measure(small, p.batch, max(budget.seconds - spent - p.predicted_stage_s - reserve, 0.0))
        took = clock() - t0
        spent += took
        stages.append(Stage(small, p.batch, {b: list(v) for b, v in timed.items()}, took, setup, p, used))
        found += doublings(timed)
        k = knee_summary(found, threshold, sigmas)
        last = {b: statistics.median(timed[b]) for b in (small, p.batch)}
    if k.batch is not None:
        stopped = f"the knee was found at {k.batch} -> {2 * k.batch}"
    return KneeSearch(k, max(last), stopped, stages, spent, last, setup)


def search_complete(search: KneeSearch, budget: Budget, memory: Callable[[int, int], int], rounds: int, warmup: int = 1) -> bool:
    """Whether the search ended where it had to: the knee found, or the next doubling beyond the budget by
    :func:`plan_next`, asked again from where the search stopped. A search that stops early, with budget left,
    reports a range the device could have extended: False."""
    if search.knee.batch is not None:
        return True
    return plan_next(search.last_steps, search.spent_s, budget, memory, rounds, warmup=warmup, setup_s=search.last_setup_s).batch is None


def measure_doubling(model, small: int, large: int, extra_seconds: float, context: int = 64, rounds: int = 5, warmup: int = 1,
                     threshold: float = 1.25, sigmas: float = 3.0, device: torch.device | str = "cpu") -> tuple[dict[int, list[float]], float, dict]:
    """One step of the knee search on ``model``: batches ``small`` and ``large`` (``context`` cached tokens per
    request) timed side by side (:func:`cheapinfer.runtime.timing.interleaved_until_decided`: more rounds, up to
    ``extra_seconds``, while the doubling is within the noise of ``threshold``), then ``large`` run once more
    traced, outside the clock. Returns (batch -> step seconds per round, the seconds building the steps took,
    the cache-use evidence of the traced step)."""
    from ..runtime import timing
    from ..runtime.evidence import traced_each

    t0 = time.perf_counter()
    steps = {b: decode_step(model, b, context) for b in (small, large)}
    setup = time.perf_counter() - t0
    names = {b: f"batch={b}" for b in steps}

    def quantities(t: Mapping[str, float]) -> dict[str, float]:
        return doubling_quantities({b: t[names[b]] for b in steps})

    def pending(found) -> list[str]:
        d = Doubling(small, large, found[f"gain@{small}"].value, found[f"gain@{small}"].se, found[f"latency@{small}"].value,
                     found[f"latency@{small}"].se, found[f"gain@{small}"].rounds)
        return [f"latency@{small}"] if d.side(threshold, sigmas) == "undecided" else []

    samples = timing.interleaved_until_decided({names[b]: steps[b] for b in steps}, quantities, {}, sigmas, rounds=rounds, warmup=warmup,
                                               device=device, pending=pending, extra_seconds=extra_seconds)
    used = traced_each(model, {names[large]: steps[large]})
    return {b: list(samples[names[b]].seconds) for b in steps}, setup, used


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
    from ..runtime import timing

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


# ----------------------------------------------------------------------------------------------
# static vs continuous batching: the real run
# ----------------------------------------------------------------------------------------------


class SlotBatch:
    """A real batched KV cache over occupied slots, for one model.

    Rows are requests; keys and values live in a transformers ``DynamicCache`` ([B, H_kv, C, D]
    per layer), left-padded: every row appends at the same column, and ``mask`` [B, C] marks the
    columns a row may attend to. A row admitted mid-flight starts with all older columns masked
    and position 0; columns no row attends to any more are cut away after each step.
    """

    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = hf.new_cache(model.config)
        self.requests: list[int] = []
        self.left: list[int] = []  # tokens still to generate, per row
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [B, C]
        self.pos = torch.zeros(0, dtype=torch.long, device=self.device)  # [B] next position
        self.tokens = torch.zeros(0, dtype=torch.long, device=self.device)  # [B] next input token

    def __len__(self) -> int:
        return len(self.requests)

    def admit(self, request: int, length: int, prompt_token: int, row: int | None = None) -> None:
        """Put ``request`` in ``row`` (a finished row is reused) or in a new row."""
        tok = torch.tensor([prompt_token], device=self.device)
        if row is None:
            if self.cache.get_seq_length() > 0:
                self._select(list(range(len(self))) + [0])  # a new row: a copy of row 0, then reset
            else:
                self.mask = torch.zeros(len(self) + 1, 0, dtype=torch.long, device=self.device)
                self.pos = torch.cat([self.pos, self.pos.new_zeros(1)])
                self.tokens = torch.cat([self.tokens, tok])
                self.requests.append(request)
                self.left.append(length)
                return
            row = len(self) - 1
            self.requests.append(request)
            self.left.append(length)
        self.requests[row], self.left[row] = request, length
        self.mask[row] = 0
        self.pos[row] = 0
        self.tokens[row] = tok[0]

    def _select(self, rows: list[int]) -> None:
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        if self.cache.get_seq_length() > 0:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        self.mask, self.pos, self.tokens = self.mask[idx], self.pos[idx], self.tokens[idx]

    def drop(self, rows: list[int]) -> None:
        keep = [i for i in range(len(self)) if i not in set(rows)]
        self._select(keep)
        self.requests = [self.requests[i] for i in keep]
        self.left = [self.left[i] for i in keep]

    def step(self) -> list[int]:
        """One decode step for every row; returns the rows whose request just finished."""
        mask = torch.cat([self.mask, self.mask.new_ones(len(self), 1)], dim=1)  # [B, C + 1]
        with torch.inference_mode():
            out = step_forward(self.model, self.tokens[:, None], self.cache, self.pos[:, None], mask)
        self.tokens = out.logits[:, -1].argmax(-1)  # [B] greedy
        self.mask, self.pos = mask, self.pos + 1
        self.left = [n - 1 for n in self.left]
        live = self.mask.any(dim=0)  # columns some row still attends to
        first = int(live.int().argmax()) if bool(live.any()) else self.mask.shape[1]
        if first > 0:
            for layer in self.cache.layers:
                if layer.keys is not None:  # a layer the forward never wrote holds nothing to cut (its cache was not used)
                    layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            self.mask = self.mask[:, first:]
        return [i for i, n in enumerate(self.left) if n <= 0]


def _policy_steps(model, policy: str, lengths: Sequence[int], slots: int, prompts: Sequence, out: PolicyResult, new_batch: Callable[[], object] | None = None):
    """The real scheduler as a generator: one decode step (plus its bookkeeping) per ``next``.

    Time is this policy's own clock: the wall-clock time of its steps only (device synced), so two
    policies advanced alternately share the machine's load alike. Results are written into ``out``.
    ``new_batch()`` makes the batch the scheduler fills (default: a :class:`SlotBatch`; a
    :class:`PagedSlotBatch` runs the same schedule on the paged cache).
    """
    dev = next(model.parameters()).device
    clock = 0.0
    new_batch = new_batch or (lambda: SlotBatch(model))

    def timed_step(batch: SlotBatch) -> list[int]:
        nonlocal clock
        sync(dev)
        t = time.perf_counter()
        finished = batch.step()
        sync(dev)
        took = time.perf_counter() - t
        clock += took
        out.step_s.append(took)
        out.steps += 1
        return finished

    if policy == "static":
        for g in range(0, len(lengths), slots):
            group = list(range(g, min(g + slots, len(lengths))))
            longest = max(lengths[r] for r in group)
            batch, start = new_batch(), clock
            for r in group:
                batch.admit(r, lengths[r], prompts[r])
            for _ in range(longest):  # finished rows keep decoding: padding
                timed_step(batch)
                yield
            out.padded_slot_steps += sum(longest - lengths[r] for r in group)
            for r in group:
                out.latency_s[r], out.service_s[r] = clock, clock - start
    elif policy == "continuous":
        queue = list(range(len(lengths)))[::-1]
        admitted = [0.0] * len(lengths)
        batch = new_batch()
        while queue and len(batch) < slots:
            r = queue.pop()
            batch.admit(r, lengths[r], prompts[r])
        while len(batch):
            finished = timed_step(batch)
            for row in finished:
                r = batch.requests[row]
                out.latency_s[r], out.service_s[r] = clock, clock - admitted[r]
            refill = [row for row in finished if queue]
            for row in refill:  # a freed slot admits the next queued request at the next step
                r = queue.pop()
                batch.admit(r, lengths[r], prompts[r], row=row)
                admitted[r] = clock
            if len(refill) < len(finished):
                batch.drop([row for row in finished if row not in refill])
            yield
    else:
        raise ValueError(f"policy must be static or continuous, not {policy!r}")
    out.makespan_s = clock


def run_policies(
    model,
    lengths: Sequence[int],
    slots: int,
    policies: Sequence[str] = ("static", "continuous"),
    probe_context: int = 8,
    seed: int = SEED,
    trace=None,
) -> tuple[dict[str, PolicyResult], dict[int, list[float]]]:
    """Static and continuous batching for real: real decode steps, a real batched cache, measured times.

    Each request's prompt is one seeded random token; it generates exactly ``lengths[r]`` tokens
    greedily (end-of-sequence ignored). The policies advance interleaved and paced so that they
    span the same stretch of wall-clock time (at each tick the policy least far through its steps
    moves; the step counts are known in advance, the schedule being deterministic), and after
    each tick one probe step of k = 1..slots occupied slots (round-robin, a ``probe_context``-token
    cache each) is timed: the per-step costs the simulation is fed come from the same stretch of
    time, so a change in the machine's load hits the real runs and the costs alike.
    Returns the results and the probe samples (seconds) per number of slots. ``trace``: a
    :class:`cheapinfer.runtime.hf.ForwardTrace` of ``model``, whose label is set to the policy (or ``"probe"``)
    whose forward runs.
    """
    prompts = torch.randint(0, model.config.vocab_size, (len(lengths),), generator=torch.Generator().manual_seed(seed)).tolist()
    unit = dict.fromkeys(range(1, slots + 1), 1.0)
    total = {p: simulate(p, lengths, slots, unit).steps for p in policies}
    results = {p: PolicyResult(p, 0.0, sum(lengths), 0, [0.0] * len(lengths), [0.0] * len(lengths), sum(lengths)) for p in policies}
    running = {p: _policy_steps(model, p, lengths, slots, prompts, results[p]) for p in policies}
    probes = {k: decode_step(model, k, probe_context, seed) for k in range(1, slots + 1)}
    label = (lambda name: setattr(trace, "label", name)) if trace is not None else (lambda name: None)
    label("probe")
    for k in probes:  # warm-up
        probes[k]()
    samples: dict[int, list[float]] = {k: [] for k in probes}
    dev = next(model.parameters()).device
    tick = 0
    while running:
        p = min(running, key=lambda name: results[name].steps / total[name])
        label(p)
        if next(running[p], StopIteration) is StopIteration:
            del running[p]
            continue
        label("probe")
        k = tick % slots + 1
        sync(dev)
        t = time.perf_counter()
        probes[k]()
        sync(dev)
        samples[k].append(time.perf_counter() - t)
        tick += 1
    return results, samples


class PagedSlotBatch:
    """The scheduler's batch on the paged cache (:func:`cheapinfer.chapter.paging.paged_cache`): the same interface as :class:`SlotBatch`.

    Each request is a sequence in one block pool, holding only its own tokens (no padding
    columns: rows are left-aligned, shorter rows masked). Admitting a request prefills its
    prompt but for the last token, which is the input of its first step; a finished request's
    blocks go back to the pool at once. With ``share_prefixes``, a request whose prompt starts
    with full blocks of a live request's prompt forks those blocks (reference-counted) and
    prefills only the rest, as a prefix cache does. ``snapshots`` records the pool after every step.
    """

    def __init__(self, model, pool, share_prefixes: bool = False):
        from .paging import paged_cache

        self.model, self.pool, self.share_prefixes = model, pool, share_prefixes
        self.device = next(model.parameters()).device
        self.cache = paged_cache(model.config, 0, pool=pool, rows=[])
        self.requests: list[int] = []
        self.left: list[int] = []
        self.tokens: list[int] = []  # next input token, per row
        self.prompts: dict[int, list[int]] = {}
        self.generated: dict[int, list[int]] = {}
        self.shared_tokens: dict[int, int] = {}  # request -> prompt tokens it took from another request's blocks
        self.snapshots: list[dict[str, object]] = []

    def __len__(self) -> int:
        return len(self.requests)

    def _shareable(self, prompt: list[int]) -> tuple[int | None, int]:
        """The live request whose cached prompt shares the most full blocks with ``prompt``, and those blocks' tokens."""
        best, best_n, bs = None, 0, self.pool.block_size
        for r in self.requests:
            other, common = self.prompts[r], 0
            limit = min(len(other), len(prompt) - 1, self.pool.lengths[r])  # cached tokens only; keep one prompt token to feed
            while common < limit and other[common] == prompt[common]:
                common += 1
            n = common // bs * bs
            if n > best_n:
                best, best_n = r, n
        return best, best_n

    def admit(self, request: int, length: int, prompt, row: int | None = None) -> None:
        """Put ``request`` (a prompt token or list of tokens, ``length`` tokens to generate) in ``row`` or a new row."""
        from .paging import paged_cache

        prompt = [int(prompt)] if isinstance(prompt, int) else [int(t) for t in prompt]
        if row is not None:
            self.pool.remove(self.requests[row])  # the finished request's blocks go back to the pool
        parent, n = self._shareable(prompt) if self.share_prefixes else (None, 0)
        if parent is not None:
            self.pool.fork(parent, request, n)
        else:
            self.pool.add(request)
        self.shared_tokens[request] = n
        if len(prompt) - 1 > n:  # prefill the prompt but its last token, on this request's own row
            view = paged_cache(self.model.config, 0, pool=self.pool, rows=[request])
            ids = torch.tensor([prompt[n:-1]], device=self.device)
            with torch.inference_mode():
                step_forward(self.model, ids, view, torch.arange(n, len(prompt) - 1, device=self.device)[None])
        self.prompts[request], self.generated[request] = prompt, []
        if row is None:
            self.requests.append(request)
            self.left.append(length)
            self.tokens.append(prompt[-1])
        else:
            self.requests[row], self.left[row], self.tokens[row] = request, length, prompt[-1]
        self.cache.rows = list(self.requests)

    def drop(self, rows: list[int]) -> None:
        for i in rows:
            self.pool.remove(self.requests[i])
        keep = [i for i in range(len(self)) if i not in set(rows)]
        self.requests = [self.requests[i] for i in keep]
        self.left = [self.left[i] for i in keep]
        self.tokens = [self.tokens[i] for i in keep]
        self.cache.rows = list(self.requests)

    def step(self) -> list[int]:
        """One decode step for every row; returns the rows whose request just finished."""
        ids = torch.tensor(self.tokens, device=self.device)[:, None]  # [B, 1]
        mask, pos = self.cache.attention_mask(1), self.cache.position_ids(1)  # [B, S_max + 1], [B, 1]
        with torch.inference_mode():
            out = step_forward(self.model, ids, self.cache, pos, mask)
        self.tokens = out.logits[:, -1].argmax(-1).tolist()  # greedy
        for r, t in zip(self.requests, self.tokens):
            self.generated[r].append(t)
        self.left = [n - 1 for n in self.left]
        self.snapshots.append(self.pool_state())
        return [i for i, n in enumerate(self.left) if n <= 0]

    def pool_state(self) -> dict[str, object]:
        """What the block tables hold now: per live request its tokens and unused slots, the blocks in use."""
        return {
            "tokens": [self.pool.lengths[r] for r in self.requests],
            "unused_slots": [self.pool.unused_slots(r) for r in self.requests],
            "blocks_in_use": self.pool.blocks_in_use,
            "shared_blocks": self.pool.shared_blocks,
            "consistent": self.pool.tables_consistent(),
        }


@dataclass
class PagedRun:
    """A continuous-batching run on the paged cache: the schedule's result and the block tables, step by step."""

    result: PolicyResult
    batch: PagedSlotBatch
    prompts: list[list[int]]

    @property
    def pool(self):
        return self.batch.pool


def run_paged(model, lengths: Sequence[int], slots: int, prompts: Sequence[Sequence[int]], num_blocks: int, block_size: int = 16, share_prefixes: bool = False) -> PagedRun:
    """Continuous batching of ``lengths`` on the paged cache: the suite's scheduler (:func:`_policy_steps`), one pool of ``num_blocks`` blocks."""
    from .paging import PagedKVCache, _model_dims

    p = next(model.parameters())
    layers, kv_heads, head_dim = _model_dims(model.config)
    pool = PagedKVCache(num_blocks, block_size, kv_heads, head_dim, p.dtype, p.device, layers)
    batch = PagedSlotBatch(model, pool, share_prefixes)
    out = PolicyResult("continuous", 0.0, sum(lengths), 0, [0.0] * len(lengths), [0.0] * len(lengths), sum(lengths))
    for _ in _policy_steps(model, "continuous", lengths, slots, [list(q) for q in prompts], out, new_batch=lambda: batch):
        pass
    return PagedRun(out, batch, [list(q) for q in prompts])


@dataclass
class Validation:
    simulated: dict[str, float]
    real: dict[str, float]
    results: dict[str, PolicyResult] = field(default_factory=dict)
    step_cost: dict[int, float] = field(default_factory=dict)  # seconds per step, by occupied slots
    evidence: dict[str, dict[str, object]] = field(default_factory=dict)  # cache use of each policy's steps and of the probes
    probes: dict[int, list[float]] = field(default_factory=dict)  # the probe steps' seconds, by occupied slots
    lengths: list[int] = field(default_factory=list)
    slots: int = 0

    @property
    def throughput_error(self) -> float:
        """Relative error of the simulated throughput ratio against the real one."""
        return abs(self.simulated["throughput_ratio"] - self.real["throughput_ratio"]) / self.real["throughput_ratio"]

    def noise(self) -> dict[str, float]:
        """Standard errors of the real throughput ratio and of the prediction error that the timing noise of this one
        run explains (the delta method; model error, the simulation's own bias, is not noise and is what the error measures):

        - one step's time has the relative noise the probes show: sigma, the median over occupancies of
          1.4826 MAD / median of that occupancy's probe times;
        - the real ratio is static time / continuous time (same tokens), each a sum of single steps with that
          noise, independent: its relative standard error is sigma sqrt(sum s_i^2 / S^2 + sum c_j^2 / C^2). Load that
          drifts over the run is not in it: the policies advance interleaved over the same stretch of time;
        - the simulated ratio moves with each occupancy's median probe cost by its standard error
          (:func:`cheapinfer.runtime.timing.robust_se`), summed in quadrature;
        - the prediction error |sim / real - 1| combines both.
        """
        from ..runtime.timing import robust_se

        s, c = self.results["static"], self.results["continuous"]
        cv = statistics.median(1.4826 * statistics.median(abs(x - statistics.median(v)) for x in v) / statistics.median(v)
                               for v in self.probes.values() if len(v) >= 2) if self.probes else math.inf
        S, C = sum(s.step_s), sum(c.step_s)
        real = S / C
        real_se = real * cv * math.sqrt(sum(x * x for x in s.step_s) / S**2 + sum(x * x for x in c.step_s) / C**2)
        sim = self.simulated["throughput_ratio"]
        moves = []
        for k, v in self.probes.items():
            se = robust_se(v)
            if not math.isfinite(se):
                return {"real_throughput_ratio_se": real_se, "prediction_error_se": math.inf, "step_noise": cv}
            moved = {**self.step_cost, k: self.step_cost[k] + se}
            moves.append(compare(self.lengths, self.slots, moved)["throughput_ratio"] - sim)
        sim_se = math.sqrt(sum(m * m for m in moves))
        error_se = math.sqrt((sim_se / real) ** 2 + (sim * real_se / real**2) ** 2)
        return {"real_throughput_ratio_se": real_se, "prediction_error_se": error_se, "simulated_throughput_ratio_se": sim_se, "step_noise": cv}


def validate(model, lengths: Sequence[int], slots: int) -> Validation:
    """Run both policies for real, and simulate them with step costs probed on the same model during the run (medians).

    The run is traced (:class:`cheapinfer.runtime.hf.ForwardTrace`): each policy's steps and the probes prove they used their cache."""
    from ..runtime.evidence import cache_use
    from ..runtime.hf import ForwardTrace

    with ForwardTrace(model) as trace:
        runs, samples = run_policies(model, lengths, slots, trace=trace)
    evidence = {name: cache_use(model, trace.labelled(name)) for name in ("static", "continuous", "probe")}
    step_cost = {k: statistics.median(v) for k, v in samples.items()}
    sim = compare(lengths, slots, step_cost)
    s, c = runs["static"], runs["continuous"]
    real = {
        "throughput_ratio": c.throughput / s.throughput,
        "latency_ratio": s.mean_latency_s / c.mean_latency_s,
        "service_latency_ratio": s.mean_service_s / c.mean_service_s,
        "static_steps": s.steps,
        "continuous_steps": c.steps,
        "static_s": s.makespan_s,
        "continuous_s": c.makespan_s,
    }
    return Validation(sim, real, {"static": s, "continuous": c}, step_cost, evidence, {k: list(v) for k, v in samples.items()}, list(lengths), slots)


@dataclass(frozen=True)
class Sensitivity:
    """Static vs continuous over many workloads that all have the book's printed statistics."""

    throughput: list[float]  # continuous / static throughput, one per workload (the seeded one first)
    latency: list[float]  # static / continuous mean latency (both from arrival), one per workload
    throughput_constant_cost: list[float]  # the same with every step costing what a full batch costs
    latency_constant_cost: list[float]
    mixed_latency: float  # the seeded workload: static latency from arrival, continuous from admission

    @staticmethod
    def quantile(values: Sequence[float], f: float) -> float:
        """The ``f`` quantile of ``values`` (``statistics.quantiles``' inclusive method; f in [0, 1])."""
        v = sorted(values)
        if f <= 0:
            return v[0]
        if f >= 1:
            return v[-1]
        return statistics.quantiles(v, n=1000, method="inclusive")[round(f * 1000) - 1]

    def share(self, values: Sequence[float], lo: float = -math.inf, hi: float = math.inf) -> float:
        """Fraction of the workloads whose value lies in [lo, hi]."""
        return sum(lo <= x <= hi for x in values) / len(values)


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
    )


# ----------------------------------------------------------------------------------------------
# the scheduler on the paged cache: reservation waste and shared prefixes, read from a real run
# ----------------------------------------------------------------------------------------------


def tokens_alone(model, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """Greedy tokens of one request run alone, on the model's own ``DynamicCache``: the reference a batched run must equal."""
    from .kv import greedy_cached

    ids = torch.tensor([list(prompt)], device=next(model.parameters()).device)
    return greedy_cached(model, ids, new_tokens)[0].tolist()


def paged_waste(model, lengths: Sequence[int], slots: int, prompt_tokens: int, max_new_tokens: int, block_size: int = 16, compare: Sequence[int] = (), seed: int = SEED) -> dict[str, object]:
    """Continuous batching of ``lengths`` on the paged cache; the reservation waste read from its block tables.

    Every request has ``prompt_tokens`` seeded random prompt tokens. The pool holds the memory
    max-context reservation would hold for ``slots`` slots (``prompt_tokens + max_new_tokens``
    each), so the run only fits if finished requests' blocks are freed and reused. Requests
    ``compare`` are run alone as well: their tokens must be the same, up to a near-tie of the
    two paths' rounding (:func:`cheapinfer.runtime.rounding.compare_greedy`).
    """
    if max(lengths) > max_new_tokens:
        raise ValueError(f"a request of {max(lengths)} tokens does not fit a max-context reservation of {max_new_tokens} new tokens")
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, model.config.vocab_size, (len(lengths), prompt_tokens), generator=g).tolist()
    reserved = prompt_tokens + max_new_tokens
    from ..runtime.evidence import traced

    run, evidence = traced(model, lambda: run_paged(model, lengths, slots, prompts, slots * math.ceil(reserved / block_size), block_size))
    snaps = run.batch.snapshots
    from .paging import run_waste
    from ..runtime.rounding import GreedyJudge

    judge = GreedyJudge(model)
    alone = {r: judge(prompts[r], tokens_alone(model, prompts[r], lengths[r]), run.batch.generated[r]) for r in compare}

    return {
        "waste": run_waste(snaps, reserved, block_size),
        "steps": run.result.steps,
        "num_blocks": len(run.pool.refs),
        "blocks_handed_out": run.pool.handed_out,
        "blocks_reused": run.pool.reused,
        "blocks_in_use_after": run.pool.blocks_in_use,
        "peak_blocks_in_use": max(s["blocks_in_use"] for s in snaps),
        "tables_consistent": all(s["consistent"] for s in snaps),
        "tokens_equal_alone": all(c.agree for c in alone.values()),
        "alone": alone,
        "compared": list(compare),
        "evidence": evidence,
    }


def paged_prefix(model, prefix: Sequence[int], suffixes: Sequence[Sequence[int]], new_tokens: int, block_size: int = 16) -> dict[str, object]:
    """Requests ``prefix + suffixes[i]`` through the scheduler on the paged cache, with and without prefix sharing.

    All requests are admitted at once (one slot each). With sharing, a request forks the full
    blocks of the prompt it shares with an earlier one (reference-counted) and prefills only the
    rest. Blocks are counted after the first step of both runs; every request's tokens are
    compared with the same request run alone, up to a near-tie of the two paths' rounding
    (:func:`cheapinfer.runtime.rounding.compare_greedy`).
    """
    from ..runtime.rounding import GreedyJudge

    prompts = [list(prefix) + list(s) for s in suffixes]
    lengths = [new_tokens] * len(prompts)
    size = sum(math.ceil((len(p) + new_tokens) / block_size) for p in prompts)
    from ..runtime.evidence import combine, traced
    from ..runtime.rounding import GreedyJudge

    shared, used_shared = traced(model, lambda: run_paged(model, lengths, len(prompts), prompts, size, block_size, share_prefixes=True))
    own, used_own = traced(model, lambda: run_paged(model, lengths, len(prompts), prompts, size, block_size, share_prefixes=False))
    judge = GreedyJudge(model)
    alone = [judge(p, tokens_alone(model, p, new_tokens), shared.batch.generated[i]) for i, p in enumerate(prompts)]
    unshared = [judge(p, own.batch.generated[i], shared.batch.generated[i]) for i, p in enumerate(prompts)]
    with_, without = shared.batch.snapshots[0], own.batch.snapshots[0]
    return {
        "blocks_with": with_["blocks_in_use"],
        "blocks_without": without["blocks_in_use"],
        "shared_full_blocks": sum(n // block_size for n in shared.batch.shared_tokens.values()),
        "shared_blocks": with_["shared_blocks"],
        "shared_prefix_tokens": len(prefix),
        "tables_consistent": all(s["consistent"] for s in shared.batch.snapshots + own.batch.snapshots),
        "tokens_equal_alone": all(c.agree for c in alone),
        "tokens_equal_unshared": all(c.agree for c in unshared),
        "alone": dict(enumerate(alone)),
        "blocks_in_use_after": shared.pool.blocks_in_use,
        "evidence": combine(used_shared, used_own),
    }
