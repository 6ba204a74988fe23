"""Properties of the chapter's measurement code that are not claims of the book: the workload's statistics,
the simulation's ordering, the paged cache's reads, the budget's search, the temperature's root, the
quantizer's half step, the quantized copy, and the speculative formulas' laws."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from cheapinfer import testing
from cheapinfer.chapter.batching import paging, workload
from cheapinfer.chapter.budget import budget
from cheapinfer.chapter.budget.budget import GIB, MODELS, TABLE_BITS
from cheapinfer.chapter.distillation import distill
from cheapinfer.chapter.evaluation import battery
from cheapinfer.chapter.outliers import outliers
from cheapinfer.chapter.quantization import quant
from cheapinfer.chapter.speculative import speculative as spec
from cheapinfer.runtime import rounding

alpha_st = st.floats(min_value=0.0, max_value=0.999, allow_nan=False)
gamma_st = st.integers(min_value=1, max_value=16)
U64 = rounding.unit_roundoff(torch.float64)  # 2^-53


@given(seed=st.integers(0, 2**32 - 1), sigma=st.floats(0.3, 1.5))
def test_skewed_lengths_have_exactly_the_books_statistics(seed, sigma):
    """The workload generator: median 18, one longest request of 231, total 1,874, for any seed and skew."""
    lengths = workload.skewed_lengths(seed=seed, sigma=sigma)
    assert workload.length_stats(lengths) == {"median_len": 18, "max_len": 231, "total_len": 1_874, "requests": 64}
    assert lengths.count(231) == 1 and min(lengths) >= 1


@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=80), slots=st.integers(1, 8))
def test_simulated_continuous_batching_returns_every_request_no_later_than_static(lengths, slots):
    """Counted in steps (unit step cost), continuous batching admits each request no later than static does, so returns it no later."""
    cost = dict.fromkeys(range(1, slots + 1), 1.0)
    s, c = workload.simulate("static", lengths, slots, cost), workload.simulate("continuous", lengths, slots, cost)
    assert all(lc <= ls for lc, ls in zip(c.latency_s, s.latency_s))
    assert max(max(lengths), -(-sum(lengths) // slots)) <= c.steps <= s.steps


@given(chunks=st.lists(st.integers(1, 40), min_size=1, max_size=6), fork_at=st.integers(0, 5), block=st.sampled_from([1, 4, 16]))
def test_paged_cache_reads_back_what_was_written(chunks, fork_at, block):
    """Any sequence of appends, with a fork part-way, reads back exactly the contiguous keys and values, and frees every block."""
    g = torch.Generator().manual_seed(len(chunks) * 100 + fork_at)
    cache = paging.PagedKVCache(2 * sum(chunks) + 2, block, 2, 8)  # enough for two sequences at one token per block
    ref = {0: [torch.zeros(2, 0, 8), torch.zeros(2, 0, 8)]}
    cache.add(0)
    for i, t in enumerate(chunks):
        if i == fork_at:
            cache.fork(0, 1)
            ref[1] = list(ref[0])
        for seq in ref:
            k, v = torch.randn(2, t, 8, generator=g), torch.randn(2, t, 8, generator=g)
            cache.append(seq, k, v)
            ref[seq] = [torch.cat([ref[seq][0], k], 1), torch.cat([ref[seq][1], v], 1)]
    for seq, (k, v) in ref.items():
        pk, pv = cache.gather(seq)
        assert torch.equal(pk, k) and torch.equal(pv, v)
        assert 0 <= cache.unused_slots(seq) < block
    for seq in list(ref):
        cache.remove(seq)
    assert cache.blocks_in_use == 0


@given(
    model=st.sampled_from(tuple(MODELS)),
    bits=st.floats(1.0, 32.0),
    memory=st.floats(0.5, 512.0),
)
def test_budget_is_the_largest_token_count_that_fits(model, bits, memory):
    """The sum holds: weights + reserve + T x bytes/token <= memory < the same with T + 1 (when the weights fit)."""
    b = budget.budget(model, bits, memory)
    total = memory * GIB
    used = b.weights_bytes + b.reserve_bytes
    if b.fits:
        assert used + b.tokens * b.kv_bytes_per_token <= total < used + (b.tokens + 1) * b.kv_bytes_per_token
    else:
        assert b.tokens == 0 and used > total


@given(model=st.sampled_from(tuple(MODELS)), bits=st.sampled_from(TABLE_BITS), small=st.floats(0.5, 256.0), more=st.floats(0.0, 256.0))
def test_more_memory_never_leaves_fewer_tokens(model, bits, small, more):
    """The sum is monotone: the same model and precision never get fewer tokens from more memory."""
    assert budget.budget(model, bits, small).tokens <= budget.budget(model, bits, small + more).tokens


@given(st.lists(st.floats(-30, 30, width=32), min_size=3, max_size=64, unique=True), st.floats(0.25, 8.0))
def test_temperature_takes_a_root_of_every_ratio(logits, t):
    """A plain property of the package (the claim above is checked on measured logits)."""
    z = torch.tensor(logits, dtype=torch.float32)
    p1, pt = distill.distribution(z), distill.distribution(z, t)
    i, j = int(torch.argmax(z)), int(torch.argmin(z))
    got, want = float(pt[i] / pt[j]), float(p1[i] / p1[j]) ** (1 / t)
    assert abs(got / want - 1) <= distill.root_ratio_bound(z, t, i, j)
    assert distill.order_unchanged(z, t)


def test_quantized_copy_replaces_only_the_projection_matrices(stand_in, quantized_stand_in):
    """The shared quantized variants: projections fake-quantized, everything else and the original untouched."""
    variant = quantized_stand_in["int4-g128"].model
    assert quantized_stand_in["int4-g128"].model is variant  # built once
    original = dict(stand_in.model.named_parameters())
    projections = quant.projection_weights(stand_in.model)
    assert len(projections) == 7 * stand_in.config.num_hidden_layers
    names = list(projections)
    recomputed = set(names[:: max(1, len(names) // 3)])  # quantized again: a few matrices, first to last
    for name, p in variant.named_parameters():
        if name in projections:
            assert not torch.equal(p, original[name]), name
            if name in recomputed:
                assert torch.equal(p, quant.fake_quantize(original[name], "int4-g128")), name
        else:
            assert torch.equal(p, original[name]), name
    assert not variant.training and not any(p.requires_grad for p in variant.parameters())


@given(alpha_st, gamma_st)
def test_expected_tokens_is_the_geometric_sum(alpha, gamma):
    e = spec.expected_tokens(alpha, gamma)
    assert abs(e - sum(alpha**k for k in range(gamma + 1))) <= spec.expected_tokens_rounding_bound(alpha, gamma)
    assert 1.0 <= e <= gamma + 1
    assert spec.expected_tokens(alpha, gamma + 1) >= e


@given(alpha_st, gamma_st, st.floats(0.0, 1.0))
def test_speedup_falls_with_the_drafts_cost(alpha, gamma, c):
    s = spec.speedup(alpha, gamma, c)
    assert spec.speedup(alpha, gamma, 0.0) == spec.expected_tokens(alpha, gamma)  # E / (0 + 1): a division by 1 is exact
    assert spec.speedup(alpha, gamma, min(1.0, c + 0.1)) <= s
    # g c + 1 (2 roundings), E / that and E / s (1 each), - 1 and / g (1 each): within (4 (g + 1) / g + 3) u of c
    assert abs(spec.implied_c(s, alpha, gamma) - c) <= (4 * (gamma + 1) / gamma + 3) * U64


@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=12), st.lists(st.floats(0.01, 1.0), min_size=2, max_size=12))
def test_output_law_of_the_acceptance_rule_is_the_target(pw, qw):
    n = min(len(pw), len(qw))
    p = torch.tensor(pw[:n], dtype=torch.float64)
    q = torch.tensor(qw[:n], dtype=torch.float64)
    p, q = p / p.sum(), q / q.sum()
    assert bool(((spec.output_distribution(p, q) - p).abs() <= spec.law_rounding_bound(n)).all())


@given(w=testing.weights, scheme=st.sampled_from(testing.INT_SCHEMES + ("nf4", "nf4-g16")))
def test_the_suites_quantizer_stays_within_half_a_step(w, scheme):
    """The suite's own quantizer (fp16 scales, rows, groups, packed codes): half a step, idempotent,
    sign-symmetric, codes in range, all-zero groups stay zero; unpacked fake quantization equals it."""
    w = torch.from_numpy(w)  # [out, in]
    q = quant.quantize(w, scheme)
    w_hat = q.dequantize()
    assert torch.equal(quant.fake_quantize(w, scheme), w_hat)
    assert torch.equal(quant.fake_quantize(w_hat, scheme), w_hat)
    if q.scheme.kind == "int":
        codes = q.unpacked_codes()[:, : w.shape[1]].to(torch.int32)
        assert bool(((codes >= -q.scheme.qmax - 1) & (codes <= q.scheme.qmax)).all())
        scale = q.element_scales()  # [out, in]
        unclamped = (w.abs() <= (q.scheme.qmax + 0.5) * scale) & (scale > 0)
        ratio = ((w - w_hat).abs() / (scale / 2))[unclamped]
        assert not ratio.numel() or float(ratio.max()) <= 1.0001
        assert bool(((w - w_hat)[scale == 0] == 0).all())  # an all-zero group stays zero
        assert torch.equal(quant.fake_quantize(-w, scheme), -w_hat)  # NF4's levels are not symmetric


@given(seed=st.integers(0, 2**32 - 1))
def test_the_outlier_scan_takes_magnitudes_and_a_signed_scan_is_caught(seed):
    """The scan's maxima are of |h|, so a maximum reached below zero counts; one of signed values fails the check."""
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(3, 5, 4, generator=g)  # [layers + 1, tokens, hidden]
    states[1, 2, 3] = -50.0  # one maximum reached below zero, whatever the draw
    covered, below_zero = outliers.signs_covered(states, outliers.outlier_stats(states))
    assert covered and below_zero >= 1
    assert float(outliers.outlier_stats(states).per_layer_dim_max[1, 3]) == 50.0
    signed = outliers.OutlierStats(states.amax(dim=1), states.shape[0] - 1)
    assert outliers.signs_covered(states, signed) == (False, below_zero)


def test_the_battery_scores_whole_words_only():
    """An accepted answer counts as a word of its own: '100' is not '0', 'marshal' is not 'mars', and case and punctuation do not matter."""
    assert battery.is_correct("Water boils at 100 degrees.", ("100", "one hundred"))
    assert battery.is_correct("It's MARS!", ("mars",))
    assert not battery.is_correct("About 100 of them", ("0", "zero"))
    assert not battery.is_correct("The marshal said so", ("mars",))
    assert not battery.is_correct("In 1848", ("8",))
