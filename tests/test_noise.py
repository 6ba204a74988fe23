"""Noise, stated: the standard error of a quantity read from timing rounds, and more rounds while a check cannot decide."""

import math
import statistics

import pytest

from cheapinfer.runtime import timing
from cheapinfer.runtime.timing import Samples


def test_robust_se_is_the_median_absolute_deviation_scaled_to_a_normal_median():
    values = [1.0, 2.0, 3.0, 4.0, 100.0]  # one outlier barely moves it
    mad = statistics.median(abs(x - 3.0) for x in values)
    assert timing.robust_se(values) == pytest.approx(1.4826 * math.sqrt(math.pi / 2) * mad / math.sqrt(5))
    assert timing.robust_se([2.0] * 7) == 0.0
    assert timing.robust_se([1.0]) == math.inf and timing.robust_se([1.0, float("nan")]) == math.inf


def test_estimates_take_the_value_from_medians_and_the_noise_from_each_round():
    samples = {"slow": Samples("slow", [4.0, 4.4, 3.6]), "fast": Samples("fast", [2.0, 2.0, 2.0])}
    est = timing.estimates(samples, lambda t: {"speedup": t["slow"] / t["fast"]})["speedup"]
    assert est.value == pytest.approx(2.0) and est.rounds == 3 and est.per_round == pytest.approx((2.0, 2.2, 1.8))
    assert est.se == pytest.approx(timing.robust_se([2.0, 2.2, 1.8]))
    assert timing.measured({"speedup": est}) == {"speedup": est.value, "speedup_se": est.se}


def _fake_rounds(values):
    """A timing run that hands out the given per-round times of variant "a" (variant "b" always takes 1 s)."""
    supply = iter(values)
    calls = []

    def run(variants, rounds, warmup):
        calls.append(rounds)
        a = [next(supply) for _ in range(rounds)]
        return {"a": Samples("a", a), "b": Samples("b", [1.0] * rounds)}

    return run, calls


def test_rounds_are_added_while_a_margin_is_within_the_noise_and_stop_once_decided():
    # First block: ratios 1.5 +- wide (undecided against > 1.2); second block: tight around 1.6, so the pooled median decides.
    run, calls = _fake_rounds([1.0, 2.2, 1.3, 1.9, 1.6] + [1.6] * 5 + [1.6] * 100)
    samples = timing.interleaved_until_decided({"a": None, "b": None}, lambda t: {"r": t["a"] / t["b"]}, {"r": 1.2}, 3.0, rounds=5, run=run)
    assert calls == [5, 5] and len(samples["a"].seconds) == 10


def test_rounds_stop_at_the_budget_and_the_margin_stays_undecided():
    run, calls = _fake_rounds([1.0, 1.4, 1.5, 1.6, 2.0] * 100)
    samples = timing.interleaved_until_decided({"a": None, "b": None}, lambda t: {"r": t["a"] / t["b"]}, {"r": 1.5}, 3.0, rounds=5, run=run)
    assert len(calls) == timing.MAX_ROUNDS_FACTOR and len(samples["a"].seconds) == 5 * timing.MAX_ROUNDS_FACTOR
    assert timing.undecided(timing.estimates(samples, lambda t: {"r": t["a"] / t["b"]}), {"r": 1.5}, 3.0) == ["r"]


def test_an_inconclusive_claim_is_neither_green_nor_red_and_the_report_says_why(pytester):
    """Through the plugin: the test is an xfail with the numbers, the run exits 0, the record says inconclusive, and the
    errata report lists it under Inconclusive with its noise, margin, load and what to do, never as a candidate erratum."""
    import json

    from plugin_runs import run

    pytester.makepyfile(test_noisy_claim=
        "import pytest\n\n"
        "@pytest.mark.claim('KV-DECODE-FLAT')\n"
        "def test_flat(claim):\n"
        "    claim.verify('twin', step_ratio=1.2, step_ratio_se=0.5, cache_grows_by_one=True, logit_change_vs_no_context=1.0, timed_forwards=1, timed_forwards_max=1)\n"
    )
    reports = pytester.path / "reports"
    result = run(pytester, "-q", "-rx")
    assert result.ret == 0, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]
    assert "1 xfailed" in result.stdout.str() and "inconclusive: KV-DECODE-FLAT step_ratio" in result.stdout.str()
    record = json.loads((reports / "run.json").read_text())
    result = record["claims"]["KV-DECODE-FLAT"]["results"][0]
    assert record["claims"]["KV-DECODE-FLAT"]["verdict"] == "inconclusive" and not record["errata"]
    assert set(result["load"]) == {"loadavg_before", "loadavg_after", "cpus", "steal_fraction"}
    md = (reports / "errata.md").read_text()
    section = md.split("## Inconclusive", 1)[1].split("\n## ", 1)[0]
    assert "measured 1.2 ± 0.5" in section and "the margin is 0.10 standard errors" in section and "quieter machine" in section
    assert "**Load:** load average" in section and "Candidate errata" not in md


def test_a_variant_that_returns_marks_adds_one_series_per_mark_round_by_round():
    clock = iter([0.1, 0.2, 0.3, 0.4])

    def marked():
        t = next(clock)
        return timing.Marks({1: t, 4: 4 * t})

    samples = timing.interleaved({"gen": marked, "plain": lambda: 7}, rounds=3, warmup=1)
    assert set(samples) == {"gen", "plain", "gen@1", "gen@4"} and timing.mark_name("gen", 4) == "gen@4"
    assert samples["gen@1"].seconds == [0.2, 0.3, 0.4] and samples["gen@4"].seconds == pytest.approx([0.8, 1.2, 1.6])  # the warm-up's marks are dropped
    assert len(samples["plain"].seconds) == 3 and len(samples["gen"].seconds) == 3
    est = timing.estimates(samples, lambda t: {"r": t["gen@4"] / t["gen@1"]})["r"]
    assert est.value == pytest.approx(4.0) and est.per_round == pytest.approx((4.0, 4.0, 4.0)) and est.se == pytest.approx(0.0)


def test_extra_rounds_keep_the_callers_warmup_of_none():
    """A caller that warmed up outside the clock (warmup=0) gets no warm-up before an extra block either."""
    warmups = []
    run, calls = _fake_rounds([1.0, 2.2, 1.3, 1.9, 1.6] + [1.6] * 100)

    def recording(variants, rounds, warmup):
        warmups.append(warmup)
        return run(variants, rounds, warmup)

    timing.interleaved_until_decided({"a": None, "b": None}, lambda t: {"r": t["a"] / t["b"]}, {"r": 1.2}, 3.0, rounds=5, warmup=0, run=recording)
    assert warmups == [0, 0]
    warmups.clear()
    run, calls = _fake_rounds([1.0, 2.2, 1.3, 1.9, 1.6] + [1.6] * 100)
    timing.interleaved_until_decided({"a": None, "b": None}, lambda t: {"r": t["a"] / t["b"]}, {"r": 1.2}, 3.0, rounds=5, warmup=3, run=recording)
    assert warmups == [3, 1]


def test_a_pending_rule_adds_rounds_until_it_is_satisfied_and_extra_seconds_cap_them():
    """A decision that is a rule over several estimates (the knee) keeps the rounds going through ``pending``."""
    run, calls = _fake_rounds([1.6] * 100)
    pending = lambda found: ["knee"] if found["r"].rounds < 15 else []  # noqa: E731
    timing.interleaved_until_decided({"a": None, "b": None}, lambda t: {"r": t["a"] / t["b"]}, {}, 3.0, rounds=5, run=run, pending=pending)
    assert calls == [5, 5, 5]
    run, calls = _fake_rounds([1.6] * 100)
    timing.interleaved_until_decided({"a": None, "b": None}, lambda t: {"r": t["a"] / t["b"]}, {}, 3.0, rounds=5, run=run, pending=pending,
                                     extra_seconds=0.0)
    assert calls == [5]


def test_one_real_runs_noise_is_what_its_step_times_explain():
    """BAT-STATIC-CONT's real ratio and prediction error: standard errors propagated from the probes' spread (delta method)."""
    from cheapinfer.chapter.batching import scheduler, workload

    lengths, slots = workload.skewed_lengths(), 8
    cost = {k: 0.010 + 0.001 * k for k in range(1, slots + 1)}

    def validation(spread: float) -> scheduler.Validation:
        probes = {k: [c * (1 + spread * d) for d in (-1.0, -0.5, 0.0, 0.5, 1.0)] for k, c in cost.items()}
        static = workload.PolicyResult("static", 2.0, 100, 100, [], [], step_s=[0.02] * 100)
        continuous = workload.PolicyResult("continuous", 1.0, 100, 50, [], [], step_s=[0.02] * 50)
        real = {"throughput_ratio": 2.0}
        return scheduler.Validation(workload.compare(lengths, slots, cost), real, {"static": static, "continuous": continuous},
                                   cost, {}, probes, list(lengths), slots)

    quiet, noisy, noisier = validation(0.0).noise(), validation(0.1).noise(), validation(0.2).noise()
    assert quiet["real_throughput_ratio_se"] == 0.0 and quiet["prediction_error_se"] == 0.0
    cv = 1.4826 * 0.05  # the MAD of (-0.1, -0.05, 0, 0.05, 0.1) relative to the median
    assert noisy["step_noise"] == pytest.approx(cv)
    assert noisy["real_throughput_ratio_se"] == pytest.approx(2.0 * cv * math.sqrt(1 / 100 + 1 / 50))
    assert noisier["prediction_error_se"] == pytest.approx(2 * noisy["prediction_error_se"], rel=0.05)  # linear in the noise


def test_the_runs_shared_extra_time_caps_every_measurement_once_spent(monkeypatch):
    """Once the process's RUN_EXTRA_SECONDS are spent, an undecided measurement keeps its planned rounds (and is inconclusive)."""
    pending = lambda found: ["knee"]  # noqa: E731  (never satisfied: only a budget stops it)
    monkeypatch.setattr(timing, "_run_extra_spent", [timing.RUN_EXTRA_SECONDS])
    run, calls = _fake_rounds([1.6] * 100)
    timing.interleaved_until_decided({"a": None, "b": None}, lambda t: {"r": t["a"] / t["b"]}, {}, 3.0, rounds=5, run=run, pending=pending)
    assert calls == [5] and timing.run_extra_left() == 0.0
    monkeypatch.setattr(timing, "_run_extra_spent", [0.0])
    run, calls = _fake_rounds([1.6] * 100)
    timing.interleaved_until_decided({"a": None, "b": None}, lambda t: {"r": t["a"] / t["b"]}, {}, 3.0, rounds=5, run=run, pending=pending)
    assert calls == [5, 5, 5, 5] and 0.0 < timing.run_extra_left() <= timing.RUN_EXTRA_SECONDS  # the factor's 4 blocks, their time debited


def test_no_variant_always_runs_after_the_same_neighbour():
    """A heavy call slows the one after it; a fixed order (a rotation included) would bias the same variant every round."""
    calls: list[str] = []
    names = ["b1", "b2", "b4", "b128", "copy"]
    timing.interleaved({n: (lambda n=n: calls.append(n)) for n in names}, rounds=12, warmup=0)
    after = {n: {calls[i - 1] for i in range(1, len(calls)) if calls[i] == n} for n in names}
    assert all(len(p) >= 3 for p in after.values()), after
    assert sorted(calls) == sorted(names * 12)  # every variant once per round
    assert all(sorted(calls[i : i + len(names)]) == sorted(names) for i in range(0, len(calls), len(names)))
