"""Are the agreement column's positions the independent observations a proportion's statistics assume?

The chapter calls the agreement column "144 independent observations": 3 prompts x 48 consecutive
positions, each the model's greedy guess at the reference's own context. Two ways they could fail to be:

- **Serial dependence within a prompt**: disagreements that come in runs (a passage the quantized model
  finds hard, or a measurement that lets one miss cause the next, as free-running generation does once
  it leaves the reference's path). Tested with a permutation test of within-prompt exchangeability:
  the statistic is the number of adjacent positions that both disagree, summed over every scheme and
  prompt; under exchangeability every order of a prompt's outcomes is equally likely, so shuffling each
  sequence on its own gives the statistic's law. One-sided (runs give more adjacent pairs), level
  :data:`LEVEL`, :data:`ROUNDS` seeded shuffles; p = (1 + #{shuffled >= observed}) / (1 + rounds).
- **Clustering by prompt**: prompts that differ in difficulty make positions of one prompt alike. The
  one-way ANOVA estimate of the intra-prompt correlation gives the design effect 1 + (m - 1) rho and the
  effective number of observations N / (1 + (m - 1) rho). With three prompts the estimate is rough: it
  is reported, not asserted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

LEVEL = 0.05
ROUNDS = 20_000
SEED = 0


def adjacent_misses(sequences: Sequence[Sequence[bool]]) -> int:
    """Adjacent positions that both disagree (``False``), summed over the sequences."""
    return sum(1 for seq in sequences for a, b in zip(seq, seq[1:]) if not a and not b)


@dataclass(frozen=True)
class SerialTest:
    observed: int  # adjacent disagreeing pairs
    expected: float  # their mean over the shuffles
    p: float  # one-sided permutation p-value
    rounds: int


def serial_dependence(sequences: Sequence[Sequence[bool]], rounds: int = ROUNDS, seed: int = SEED) -> SerialTest:
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
