"""The battery statistics' faults: the suite's own bugs in what a battery of n questions can resolve, not the
chapter's. What n = 16 can tell apart (the exact interval's coverage, the gap at which two intervals part, the
fewest one-way changes McNemar's test calls significant, one question never) is a theorem about the statistics, so
it is no claim: tests/chapter/test_stats_battery.py checks it, and runs it under each fault here, where it must fail.

:data:`STAT_FAULTS`: fault name -> :class:`~cheapinfer.faults.base.SuiteFault` (the bug in one sentence, the context
manager that holds it).
"""

from __future__ import annotations

from scipy import stats as scipy_stats

from ..chapter import stats
from .base import patched, suite_faults

BATTERY = "battery statistics"
STAT_FAULTS, _registered = suite_faults("statistics", (BATTERY,))


def _fault(name: str, what: str):
    return _registered(name, BATTERY, what)


@_fault("interval-wrong-level", "the binomial interval is given the significance level (0.05) where it expects the confidence level (0.95)")
def _():
    real = stats.binomial_interval
    with patched(stats, "binomial_interval", lambda k, n, confidence=stats.CONFIDENCE: real(k, n, 1 - confidence)):
        yield


@_fault("interval-wald", "the interval is Wald's normal approximation, p +- 1.96 sqrt(p (1 - p) / n), whose coverage falls far below 95% at n = 16")
def _():
    def wald(k, n, confidence=stats.CONFIDENCE):
        p, z = k / n, float(scipy_stats.norm.ppf(0.5 + confidence / 2))
        half = z * (p * (1 - p) / n) ** 0.5
        return max(0.0, p - half), min(1.0, p + half)

    with patched(stats, "binomial_interval", wald):
        yield


@_fault("mcnemar-one-sided", "McNemar's exact p is one-sided (the binomial tail in the observed direction) where the test is two-sided")
def _():
    def one_sided(first, second):
        lost = sum(a and not b for a, b in zip(first, second))
        gained = sum(b and not a for a, b in zip(first, second))
        if lost + gained == 0:
            return stats.PairedChange(0, 0, 1.0)
        return stats.PairedChange(lost, gained, float(scipy_stats.binomtest(max(lost, gained), lost + gained, 0.5, alternative="greater").pvalue))

    with patched(stats, "mcnemar_exact", one_sided):
        yield
