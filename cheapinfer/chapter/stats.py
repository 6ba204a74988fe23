"""The statistics of the chapter's measurements: tests, intervals and design effects, each with its test, level and
assumption stated. The measurements that use them live in the sections (:mod:`cheapinfer.chapter.evaluation`).

**Seeded draws**: a quantity measured on many seeded workloads is summarised by its quantiles (:func:`quantile`) and the
share of the workloads on which it lies in a range (:func:`share`).

**A proportion and a paired change** (the factual battery, :mod:`cheapinfer.chapter.evaluation.battery`): a single score
k of n gets an exact (Clopper-Pearson) interval at :data:`CONFIDENCE`; a change between two schemes on the same
questions is judged by McNemar's exact test (two-sided, binomial(lost + gained, 1/2) on the questions one scheme
answers and the other misses; level :data:`PAIRED_LEVEL`). Assumption: each question is an independent Bernoulli trial
per scheme. :func:`resolution` says what n questions can resolve at all.

**Are the agreement column's positions the independent observations a proportion's statistics assume?**

The chapter calls the agreement column "144 independent observations": 3 prompts x 48 consecutive
positions, each the model's greedy guess at the reference's own context. Two ways they could fail to be:

- **Serial dependence within a prompt**: disagreements that come in runs (a passage the quantized model
  finds hard, or a measurement that lets one miss cause the next, as free-running generation does once
  it leaves the reference's path). Tested with a permutation test of within-prompt exchangeability:
  the statistic is the number of adjacent positions that both disagree, summed over every scheme and
  prompt; under exchangeability every order of a prompt's outcomes is equally likely, so shuffling each
  sequence on its own gives the statistic's law. One-sided (runs give more adjacent pairs), level
  :data:`SERIAL_LEVEL`, :data:`SERIAL_ROUNDS` seeded shuffles; p = (1 + #{shuffled >= observed}) / (1 + rounds).
- **Clustering by prompt**: prompts that differ in difficulty make positions of one prompt alike. The
  one-way ANOVA estimate of the intra-prompt correlation gives the design effect 1 + (m - 1) rho and the
  effective number of observations N / (1 + (m - 1) rho). With three prompts the estimate is rough: it
  is reported, not asserted.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

CONFIDENCE = 0.95  # of the exact binomial interval of one battery score
PAIRED_LEVEL = 0.05  # two-sided significance level of the paired exact (McNemar) test
SERIAL_LEVEL = 0.05  # one-sided level of the permutation test of within-prompt exchangeability
SERIAL_ROUNDS = 20_000  # its seeded shuffles
SERIAL_SEED = 0


# ------------------------------------------------------------------------------------------------
# seeded draws
# ------------------------------------------------------------------------------------------------


def quantile(values: Sequence[float], f: float) -> float:
    """The ``f`` quantile of ``values`` (``statistics.quantiles``' inclusive method; f in [0, 1])."""
    v = sorted(values)
    if f <= 0:
        return v[0]
    if f >= 1:
        return v[-1]
    return statistics.quantiles(v, n=1000, method="inclusive")[round(f * 1000) - 1]


def share(values: Sequence[float], lo: float = -math.inf, hi: float = math.inf) -> float:
    """Fraction of the values (one per workload) that lie in [lo, hi]."""
    return sum(lo <= x <= hi for x in values) / len(values)


# ------------------------------------------------------------------------------------------------
# a proportion and a paired change
# ------------------------------------------------------------------------------------------------

def binomial_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval for a proportion k/n."""
    from scipy import stats as scipy_stats

    ci = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def intervals_overlap(k: int, j: int, n: int, confidence: float = CONFIDENCE) -> bool:
    """Whether the exact intervals of two scores k/n and j/n overlap (the interval cannot tell them apart)."""
    (lo_k, hi_k), (lo_j, hi_j) = binomial_interval(k, n, confidence), binomial_interval(j, n, confidence)
    return lo_k <= hi_j and lo_j <= hi_k


@dataclass
class PairedChange:
    """Two schemes on the same questions: answers lost and gained by the second, and McNemar's exact p."""

    lost: int  # right under the first, wrong under the second
    gained: int  # wrong under the first, right under the second
    p_value: float  # two-sided exact McNemar: binomial(lost + gained, 1/2); 1.0 when nothing changed

    @property
    def significant(self) -> bool:
        return self.p_value < PAIRED_LEVEL


def mcnemar_exact(first: Sequence[bool], second: Sequence[bool]) -> PairedChange:
    """McNemar's exact test on paired right/wrong answers (two-sided)."""
    from scipy import stats as scipy_stats

    if len(first) != len(second):
        raise ValueError(f"paired answers of different lengths: {len(first)} and {len(second)}")
    lost = sum(a and not b for a, b in zip(first, second))
    gained = sum(b and not a for a, b in zip(first, second))
    if lost + gained == 0:
        return PairedChange(0, 0, 1.0)
    return PairedChange(lost, gained, float(scipy_stats.binomtest(lost, lost + gained, 0.5).pvalue))


@dataclass
class Resolution:
    """What a battery of ``n`` questions can resolve, by the interval and by the paired test."""

    n: int
    interval_coverage: float  # smallest exact coverage of the interval over true proportions 0.001..0.999
    one_question_intervals_disjoint: bool  # for some k, the intervals of k/n and (k+1)/n do not overlap
    one_question_p: float  # McNemar's exact p of one question lost and none gained
    smallest_disjoint_gap: int  # fewest questions between two scores whose intervals can be disjoint
    smallest_significant_change: int  # fewest one-way changes (m lost, 0 gained) that McNemar calls significant


def resolution(n: int, confidence: float = CONFIDENCE, level: float = PAIRED_LEVEL) -> Resolution:
    """What ``n`` questions can and cannot tell apart (exact intervals at ``confidence``, McNemar at ``level``)."""
    import numpy as np
    from scipy import stats as scipy_stats

    ci = [binomial_interval(k, n, confidence) for k in range(n + 1)]
    # exact coverage: P(true p inside the interval of the observed k), summed over the binomial law of k
    truth = np.linspace(0.001, 0.999, 999)  # [P]
    pmf = scipy_stats.binom.pmf(np.arange(n + 1)[:, None], n, truth[None, :])  # [n + 1, P]
    inside = np.array([[lo <= t <= hi for t in truth] for lo, hi in ci])  # [n + 1, P]
    coverage = float((pmf * inside).sum(axis=0).min())

    def disjoint(k: int, j: int) -> bool:
        return ci[k][1] < ci[j][0]

    gap = next((d for d in range(1, n + 1) if any(disjoint(k, k + d) for k in range(n + 1 - d))), n + 1)
    change = next((m for m in range(1, n + 1) if mcnemar_exact([True] * m, [False] * m).p_value < level), n + 1)
    return Resolution(
        n=n,
        interval_coverage=coverage,
        one_question_intervals_disjoint=any(disjoint(k, k + 1) for k in range(n)),
        one_question_p=mcnemar_exact([True], [False]).p_value,
        smallest_disjoint_gap=gap,
        smallest_significant_change=change,
    )


# ------------------------------------------------------------------------------------------------
# the agreement column's independence
# ------------------------------------------------------------------------------------------------

def adjacent_misses(sequences: Sequence[Sequence[bool]]) -> int:
    """Adjacent positions that both disagree (``False``), summed over the sequences."""
    return sum(1 for seq in sequences for a, b in zip(seq, seq[1:]) if not a and not b)


@dataclass(frozen=True)
class SerialTest:
    observed: int  # adjacent disagreeing pairs
    expected: float  # their mean over the shuffles
    p: float  # one-sided permutation p-value
    rounds: int


def serial_dependence(sequences: Sequence[Sequence[bool]], rounds: int = SERIAL_ROUNDS, seed: int = SERIAL_SEED) -> SerialTest:
    """The permutation test of within-sequence exchangeability (module doc), ``rounds`` shuffles of every sequence."""
    import numpy as np

    rng = np.random.default_rng(seed)
    observed = adjacent_misses(sequences)
    shuffled = np.zeros(rounds, dtype=np.int64)
    for seq in sequences:
        miss = ~np.asarray(seq, dtype=bool)
        if miss.sum() < 2:
            continue  # no pair can be formed: adds 0 in every order
        order = rng.random((rounds, len(seq))).argsort(axis=1)  # one uniform permutation per round
        perm = miss[order]
        shuffled += (perm[:, 1:] & perm[:, :-1]).sum(axis=1)
    return SerialTest(observed, float(shuffled.mean()), float((1 + (shuffled >= observed).sum()) / (1 + rounds)), rounds)


@dataclass(frozen=True)
class DesignEffect:
    icc: float  # intra-prompt correlation (ANOVA estimate, may be negative)
    design_effect: float  # 1 + (m - 1) max(icc, 0)
    effective_n: float  # N / design_effect


def design_effect(sequences: Sequence[Sequence[bool]]) -> DesignEffect:
    """ANOVA estimate of the intra-sequence correlation of the disagreement indicator (equal-length sequences)."""
    k, m = len(sequences), len(sequences[0])
    if k < 2 or m < 2 or any(len(s) != m for s in sequences):
        raise ValueError("design_effect needs at least two sequences of one length of at least 2")
    means = [sum(not x for x in s) / m for s in sequences]
    grand = sum(means) / k
    msb = m * sum((mu - grand) ** 2 for mu in means) / (k - 1)
    msw = sum((float(not x) - mu) ** 2 for s, mu in zip(sequences, means) for x in s) / (k * (m - 1))
    denominator = msb + (m - 1) * msw
    icc = 0.0 if denominator == 0 else (msb - msw) / denominator
    deff = 1 + (m - 1) * max(icc, 0.0)
    return DesignEffect(icc, deff, k * m / deff)
