"""Section 2, batching: the knee of the batch curve, and the search for it.

:func:`doublings` gives each doubling's gains with their standard errors over the rounds, :func:`knee`
finds the first doubling past the steepest one whose throughput gain is below a threshold beyond the
noise, and :func:`knee_summary` the gains either side of it. A knee exists on every device, but where it
is depends on the device: the curve is measured up to a fixed size, and :func:`search_knee` doubles on
past it, one size at a time, until the knee is found or :func:`plan_next` finds the next size beyond the
device's memory or the search's time budget (:class:`Budget`), and says where it stopped and why.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import torch

from . import batching

if TYPE_CHECKING:
    from ...runtime import timing

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
            out[f"latency@{b}"] = batching.request_latency(steps[2 * b], 2 * b) / batching.request_latency(steps[b], b)
    return out


def doublings(rounds: Mapping[int, Sequence[float]]) -> list[Doubling]:
    """Every doubling ``b -> 2b`` among the measured sizes (``rounds[b]``: batch b's step times, round by round,
    all sizes timed in the same rounds), in order of size."""
    from ...runtime.timing import Samples, estimates

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
    from ...runtime.timing import Samples, estimates

    samples = {str(b): Samples(str(b), list(v)) for b, v in rounds.items() if b in (small, 2 * small)}

    def gain(t: Mapping[str, float]) -> dict[str, float]:
        return {"latency_gain": batching.request_latency(t[str(2 * small)], 2 * small) / batching.request_latency(t[str(small)], small)}

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
    return knee(_book_curve(book_from, book_gain, gain_before), threshold, sigmas) or 0


def gain_before_on_book_curve(book_from: int, book_gain: float, gain_before: float = 1.9, threshold: float = 1.25, sigmas: float = 3.0) -> float:
    """The gain before the knee as :func:`knee_summary` reads it, on the curve of :func:`knee_on_book_curve`: must be
    ``gain_before`` (every doubling before the knee gains it), on every machine."""
    return knee_summary(_book_curve(book_from, book_gain, gain_before), threshold, sigmas).gain_before


def _book_curve(book_from: int, book_gain: float, gain_before: float) -> list["Doubling"]:
    found, b = [], 1
    while b <= book_from:
        gain = book_gain if b == book_from else gain_before
        se = 0.01 * gain
        found.append(Doubling(b, 2 * b, gain, se, 2 / gain, 2 * se / gain**2, 5))
        b *= 2
    return found


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
    from ..kv_cache.kv import config_head_dim

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
    from ..kv_cache.kv import config_head_dim, kv_bytes_per_token

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
    from ...runtime import timing
    from ...runtime.evidence import traced_each

    t0 = time.perf_counter()
    steps = {b: batching.decode_step(model, b, context) for b in (small, large)}
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
