"""The noise test BAT-TRADEOFF's verdict rests on: its level, stated in the registry, is checked here."""

import itertools

import pytest

from cheapinfer.chapter.batching import batching

NOISES = {
    "normal": lambda r: r.gauss(0.0, 1.0),
    "uniform": lambda r: r.random(),
    "exponential": lambda r: r.expovariate(1.0),
    "log-normal": lambda r: r.lognormvariate(0.0, 1.0),
}


@pytest.mark.parametrize("noise", NOISES, ids=list(NOISES))
def test_interquartile_test_fires_about_1_6_percent_on_equal_step_times(noise):
    # 20,000 draws: the binomial standard error at p = 0.016 is 0.09 percentage points, so [1.2%, 2.0%] is > 4 of them.
    level = batching.equal_steps_false_alarm(rounds=5, draws=20_000, noise=NOISES[noise])
    assert 0.012 <= level <= 0.020, f"{noise}: {level:.2%}"


def test_rank_bounds_of_the_level_hold_whatever_the_noise():
    """Exact over the 252 equally likely rank orders of 5 + 5 exchangeable rounds.

    All of b below all of a is sufficient (q3(b) <= b5 < a1 <= q1(a)); b4 < a2 is necessary (q3(b) >= b4, q1(a) <= a2).
    """
    sufficient = necessary = 0
    orders = list(itertools.combinations(range(10), 5))
    for ranks in orders:
        b = sorted(ranks)
        a = [i for i in range(10) if i not in ranks]
        sufficient += b[4] < a[0]
        necessary += b[3] < a[1]
    assert (sufficient / len(orders), round(necessary / len(orders), 3)) == (1 / 252, 0.103)
    assert 1 / 252 <= batching.equal_steps_false_alarm(draws=5_000) <= 0.103


def test_a_larger_batch_that_waits_less_is_found_and_an_equal_one_is_not():
    slow, fast = [1.00, 1.01, 0.99, 1.02, 1.00], [0.50, 0.51, 0.49, 0.52, 0.50]
    assert batching.tradeoff({1: slow, 2: fast}).beyond_noise == [(1, 2)]
    assert batching.tradeoff({1: slow, 2: list(slow)}).beyond_noise == []
    assert batching.tradeoff({1: fast, 2: slow}).beyond_noise == []


@pytest.mark.parametrize("check, flags, cap, probe, expected", [
    (False, {"avx512_bf16"}, None, 0.3, "fp32"),                    # oneDNN capped to AVX2: no bf16 at all
    (True, {"avx512_bf16", "amx_bf16"}, None, 0.3, "bf16"),         # AMX, nothing capped
    (True, {"avx512_bf16", "amx_bf16"}, "AVX512_CORE_BF16", 0.5, "bf16"),
    (True, {"avx512_bf16", "amx_bf16"}, "avx512_core", 0.5, "fp32"),  # capped below BF16: emulated, whatever the probe says
    (True, {"avx512f"}, None, 0.5, "fp32"),                         # an AVX512 CPU without BF16 instructions
    (True, None, None, 0.5, "bf16"),                                # flags unreadable: the probe decides
    (True, None, None, 1.4, "fp32"),
    (True, {"avx512_bf16"}, "SOME_FUTURE_ISA", 1.4, "fp32"),        # a cap it does not know: the probe decides
])
def test_a_cpu_serves_bf16_only_with_native_bf16_kernels_allowed(check, flags, cap, probe, expected, monkeypatch):
    import torch

    from cheapinfer.runtime import models

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: check)
    monkeypatch.setattr(models, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(models, "bf16_probe", lambda: probe)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert models.serving_dtype("cpu") == expected
    assert models.serving_dtype("cuda") == "fp16"
    assert models.cpu_bf16_native()[1]  # the decision says how it was made


def test_the_kernel_probe_names_a_pair_whose_products_alone_are_faster_at_more_rows(monkeypatch):
    """The probe of BAT-TRADEOFF's premise compares the products' own times (not a request's latency, which a fault
    could divide by the batch): a pair is the kernel's only where the larger size is faster beyond the rounds' noise."""
    import time

    from cheapinfer.chapter.batching import batching

    cost = {1: 0.004, 2: 0.001, 4: 0.0045, 8: 0.0046}  # 2 rows faster than 1 (a slow 1-row path); 8 about as slow as 4
    monkeypatch.setattr(batching, "weights_pass", lambda model, b: (lambda: time.sleep(cost[b])))
    monkeypatch.setattr(batching, "request_latency", lambda step_s, batch: step_s / batch)  # must not matter here
    probe = batching.kernel_probe(None, [(1, 2), (2, 4), (4, 8)], rounds=11)
    assert probe.inverted == [(1, 2)]
    assert "ms at 1 rows" in probe.medians_ms(1, 2)
