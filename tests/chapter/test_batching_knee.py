"""The knee of the batch curve: decided over the rounds' noise, and searched for until found or the device's budget is spent."""

import math

import pytest
import torch

from cheapinfer.chapter.batching import batching, knee
from cheapinfer.chapter.batching.knee import Budget, Doubling, Plan
from cheapinfer.runtime.arch import QWEN25_05B, qwen2_config

THRESHOLD, SIGMAS, ROUNDS = 1.25, 3.0, 5
GB = 10**9


def _step(w: float, c: float):
    """The cost model of a decode step over b rows: t(b) = w + b c."""
    return lambda b: w + b * c


def _rounds(t, sizes, jitter=(1.0, 1.01, 0.99, 1.02, 0.98)):
    """Rounds of step times for ``sizes``, every size moved by the same factor in a round (the load of that round)."""
    return {b: [t(b) * j for j in jitter] for b in sizes}


class FakeDevice:
    """A device whose step follows the cost model; measuring a doubling advances a fake clock by what it would take."""

    def __init__(self, t):
        self.t, self.now, self.calls = t, 0.0, []

    def clock(self) -> float:
        return self.now

    def measure(self, small: int, large: int, extra_s: float):
        self.calls.append((small, large, extra_s))
        self.now += (1 + ROUNDS) * (self.t(small) + self.t(large)) + self.t(large)
        return _rounds(self.t, (small, large)), 0.0, {}


def _search(t, sizes, budget, memory=lambda small, large: 0, plan=None):
    dev = FakeDevice(t)
    found = knee.search_knee(_rounds(t, sizes), dev.measure, budget, memory, ROUNDS, THRESHOLD, SIGMAS, plan=plan, clock=dev.clock)
    return found, dev


def test_a_doubling_is_past_the_knee_only_beyond_three_standard_errors_of_its_latency_gain():
    bound = 2 / THRESHOLD  # 1.6: a doubling that buys exactly 1.25x throughput
    def d(latency, se):
        return Doubling(8, 16, 2 / latency, 0.0, latency, se, 5)
    assert d(1.9, 0.05).side(THRESHOLD, SIGMAS) == "below"
    assert d(1.7, 0.05).side(THRESHOLD, SIGMAS) == "undecided"  # 0.1 above 1.6: 2 standard errors
    assert d(1.3, 0.05).side(THRESHOLD, SIGMAS) == "above"
    assert d(bound, 0.0).side(THRESHOLD, SIGMAS) == "above"  # exactly 1.25x, noiseless: not below it (as the registry decides)
    assert d(1.9, math.inf).side(THRESHOLD, SIGMAS) == "undecided"


def test_doublings_read_the_gain_from_medians_and_its_noise_round_by_round():
    rounds = {1: [1.0, 1.0, 1.0], 2: [1.0, 1.1, 0.9]}
    (d,) = knee.doublings(rounds)
    assert (d.small, d.large, d.rounds) == (1, 2, 3)
    assert d.gain == pytest.approx(2.0) and d.latency_gain == pytest.approx(1.0)
    assert d.latency_se > 0 and d.gain_se > 0


def test_the_knee_is_the_first_decided_doubling_past_the_steepest_and_an_undecided_one_is_passed():
    def d(b, gain, latency_se=0.01):
        return Doubling(b, 2 * b, gain, 0.01, 2 / gain, latency_se, 5)
    flat_start = [d(1, 1.0), d(2, 1.9), d(4, 1.5), d(8, 1.1)]  # 1 -> 2 gains nothing (GEMV -> GEMM), not a knee
    k = knee.knee_summary(flat_start, THRESHOLD, SIGMAS)
    assert (k.batch, k.gain_before, k.skipped, k.undecided) == (8, 1.9, 0, [])
    noisy = [d(1, 1.9), d(2, 1.22, latency_se=0.2), d(4, 1.1)]  # 2 -> 4 below by its median, within its noise
    k = knee.knee_summary(noisy, THRESHOLD, SIGMAS)
    assert (k.batch, k.undecided) == (4, [2])
    none = [d(1, 1.9), d(2, 1.8), d(4, 1.6)]
    k = knee.knee_summary(none, THRESHOLD, SIGMAS)
    assert k.batch is None and math.isnan(k.latency_gain) and k.skipped == 0


def test_a_rule_that_returns_early_is_counted_against_the_definition(monkeypatch):
    def d(b, gain):
        return Doubling(b, 2 * b, gain, 0.01, 2 / gain, 0.01, 5)
    monkeypatch.setattr(knee, "knee", lambda found, threshold, sigmas: None)
    k = knee.knee_summary([d(1, 1.9), d(2, 1.5), d(4, 1.1), d(8, 1.05)], THRESHOLD, SIGMAS)
    assert k.batch is None and k.skipped == 2


def test_the_planner_predicts_the_next_step_from_the_last_two_and_stops_at_the_first_limit():
    memory = lambda small, large: large * GB  # noqa: E731
    roomy = Budget(seconds=100.0, memory_bytes=10**6 * GB)
    p = knee.plan_next({64: 0.1, 128: 0.15}, 0.0, roomy, memory, ROUNDS)
    assert p.batch == 256 and p.predicted_step_s == pytest.approx(0.30)  # growth 1.5 < 2: the cost model's ceiling, 2x
    assert p.predicted_stage_s == pytest.approx(6 * (0.15 + 0.30) + 0.30)
    p = knee.plan_next({64: 0.1, 128: 0.25}, 0.0, roomy, memory, ROUNDS)
    assert p.predicted_step_s == pytest.approx(0.625)  # growth 2.5 measured: carried forward
    p = knee.plan_next({128: 0.15}, 0.0, roomy, memory, ROUNDS, setup_s=1.0)
    assert p.predicted_stage_s == pytest.approx(6 * (0.15 + 0.30) + 0.30 + 2.0)
    short = knee.plan_next({64: 0.1, 128: 0.15}, 98.0, roomy, memory, ROUNDS)
    assert short.batch is None and "about 3.0 s" in short.reason and "2.0 s left of the search's 100 s" in short.reason
    tight = knee.plan_next({64: 0.1, 128: 0.15}, 0.0, Budget(100.0, 255 * GB), memory, ROUNDS)
    assert tight.batch is None and "batch 256 would need 256.00 GB" in tight.reason and tight.stage_bytes == 256 * GB


def test_a_knee_in_the_curve_is_judged_without_searching():
    found, dev = _search(_step(1.0, 0.2), [1, 2, 4, 8, 16, 32, 64, 128], Budget(60.0, GB))
    assert found.knee.batch is not None and dev.calls == [] and found.searched_up_to == 128
    assert found.stopped.startswith("the knee was found")


def test_the_search_doubles_on_past_the_curve_until_the_knee_is_found():
    t = _step(1.0, 0.008)  # w = 125 c: gains 1.49 at 64 -> 128, 1.33 at 128 -> 256, 1.20 at 256 -> 512
    found, dev = _search(t, [1, 2, 4, 8, 16, 32, 64, 128], Budget(1e6, GB))
    assert [(s, l) for s, l, _ in dev.calls] == [(128, 256), (256, 512)]
    assert found.knee.batch == 256 and found.searched_up_to == 512
    assert [s.large for s in found.stages] == [256, 512] and found.spent_s == pytest.approx(dev.now)
    assert knee.search_complete(found, Budget(1e6, GB), lambda s, l: 0, ROUNDS)


def test_a_search_that_runs_out_of_time_stops_where_the_budget_ends_and_says_so():
    t = _step(1.0, 0.0001)  # the knee lies near 10,000 rows
    budget = Budget(60.0, 10**6 * GB)
    found, dev = _search(t, [1, 2, 4, 8, 16, 32, 64, 128], budget)
    assert found.knee.batch is None and dev.calls
    assert "left of the search's 60 s" in found.stopped and found.searched_up_to == dev.calls[-1][1]
    assert found.spent_s <= budget.seconds
    assert knee.search_complete(found, budget, lambda s, l: 0, ROUNDS)  # stopped by the budget: complete, and inconclusive


def test_a_search_that_runs_out_of_memory_stops_there():
    t = _step(1.0, 0.0001)
    found, dev = _search(t, [1, 2, 4, 8, 16, 32, 64, 128], Budget(1e9, 1000 * GB), memory=lambda small, large: large * GB)
    assert [l for _, l, _ in dev.calls] == [256, 512] and "batch 1,024 would need" in found.stopped.replace("1024", "1,024")


def test_a_search_that_stops_with_budget_left_is_not_complete():
    t = _step(1.0, 0.0001)
    budget = Budget(60.0, 10**6 * GB)
    stop = lambda steps, spent, budget, memory, rounds, warmup=1, setup_s=0.0: Plan(None, "stopped at a fixed size")  # noqa: E731
    found, dev = _search(t, [1, 2, 4, 8, 16, 32, 64, 128], budget, plan=stop)
    assert dev.calls == [] and found.knee.batch is None and found.stopped == "stopped at a fixed size"
    assert not knee.search_complete(found, budget, lambda s, l: 0, ROUNDS)


def test_the_extra_rounds_of_a_search_step_leave_room_for_the_next_size():
    t = _step(1.0, 0.004)
    found, dev = _search(t, [1, 2, 4, 8, 16, 32, 64, 128], Budget(100.0, GB))
    first = found.stages[0]
    ahead = knee.plan_next({128: t(128), 256: first.plan.predicted_step_s}, first.plan.predicted_stage_s, Budget(100.0, GB),
                               lambda s, l: 0, ROUNDS)
    assert ahead.batch == 512 and dev.calls[0][2] == pytest.approx(100.0 - first.plan.predicted_stage_s - ahead.predicted_stage_s)
    found, dev = _search(t, [1, 2, 4, 8, 16, 32, 64, 128], Budget(100.0, GB), memory=lambda small, large: 0 if large <= 256 else 2 * GB)
    assert dev.calls[0][2] == pytest.approx(100.0 - found.stages[0].plan.predicted_stage_s)  # no next size to keep room for


def test_a_batch_beyond_the_cache_tile_repeats_its_first_requests_caches(monkeypatch):
    from cheapinfer.runtime import models

    small = models.twin("fp32", "cpu", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=32, vocab_size=256).model
    monkeypatch.setattr(batching, "CACHE_TILE", 2)
    keys = batching.batch_cache(small, 5, context=4).layers[0].keys  # [5, H, 4, D]
    assert keys.shape[0] == 5 and torch.equal(keys[2], keys[0]) and torch.equal(keys[4], keys[0]) and not torch.equal(keys[1], keys[0])
    assert batching.decode_step(small, 5, context=4)().shape == (5,)


def test_a_search_steps_memory_counts_weights_both_caches_and_the_larger_activations():
    config = qwen2_config(QWEN25_05B)
    per_token = 2 * 24 * 2 * 64 * 2  # bf16: 12,288 B
    assert knee.cache_bytes(config, 1, 64, 2) == 65 * per_token
    act = knee.activation_bytes(config, 1, 64, 2)
    assert act >= config.vocab_size * 2  # at least the logits of the row
    assert knee.activation_bytes(config, 512, 64, 2) == 512 * act
    assert knee.stage_bytes(config, 10**9, 256, 512, 64, 2) == 10**9 + 768 * 65 * per_token + 512 * act


def test_the_search_runs_on_a_small_model_end_to_end():
    """measure_doubling with a real (small, seeded) model: both sizes timed in the same rounds, the larger one traced."""
    from cheapinfer.runtime import models

    small = models.twin("fp32", "cpu", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=32, vocab_size=256).model
    timed, setup, used = knee.measure_doubling(small, 2, 4, 0.0, context=8, rounds=3)
    assert set(timed) == {2, 4} and all(len(v) == 3 for v in timed.values()) and setup >= 0
    assert used["cache_grows_by_fed"] is True


def test_every_latency_the_batch_claims_judge_is_the_one_request_latency_defines(monkeypatch):
    """BAT-1-TO-16's latency gain and every doubling's latency read a request's wait from batching.request_latency,
    the one definition (the whole step). Counted per token (step / batch), BAT-1-TO-16's gain from 1 to 16 falls
    below 1 and fails its check: before, that check divided the step times itself and could not see it."""
    from cheapinfer.chapter.batching import batch_curve

    steps = {b: 0.010 * (1 + b / 16) for b in (1, 2, 4, 8, 16)}  # a memory-bound step: 16 rows cost twice one
    quantities = batch_curve.curve_quantities(sorted(steps), ("BAT-1-TO-16", "BAT-KNEE"))
    times = {batch_curve.name(b): s for b, s in steps.items()}
    whole = quantities(times)
    assert whole["latency_gain"] == pytest.approx(steps[16] / steps[1]) and whole["latency@8"] == pytest.approx(steps[16] / steps[8])
    monkeypatch.setattr(batching, "request_latency", lambda step_s, batch: step_s / batch)
    per_token = quantities(times)
    assert per_token["latency_gain"] == pytest.approx(steps[16] / steps[1] / 16) and per_token["latency_gain"] < 1
    assert per_token["latency@8"] == pytest.approx(steps[16] / steps[8] / 2)
    assert per_token["throughput_gain"] == whole["throughput_gain"]
