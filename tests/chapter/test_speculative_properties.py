"""Properties of the speculative section's code that are not claims of the book: the speculative formulas' laws, and
the speculative loop's greedy tokens on drawn prompts (derandomized, as the batching properties)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cheapinfer.chapter.kv_cache import kv_macs
from cheapinfer.chapter.speculative import speculative
from cheapinfer.runtime import rounding

alpha_st = st.floats(min_value=0.0, max_value=0.999, allow_nan=False)
gamma_st = st.integers(min_value=1, max_value=16)
U64 = rounding.unit_roundoff(torch.float64)  # 2^-53


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    target = kv_macs.tiny_model(kv_macs.tiny_arch(), dtype=torch.float64).eval()
    torch.manual_seed(1)
    draft = kv_macs.tiny_model(kv_macs.tiny_arch(layers=1), dtype=torch.float64).eval()
    return target, draft


@given(alpha_st, gamma_st)
def test_expected_tokens_is_the_geometric_sum(alpha, gamma):
    e = speculative.expected_tokens(alpha, gamma)
    assert abs(e - sum(alpha**k for k in range(gamma + 1))) <= speculative.expected_tokens_rounding_bound(alpha, gamma)
    assert 1.0 <= e <= gamma + 1
    assert speculative.expected_tokens(alpha, gamma + 1) >= e


@given(alpha_st, gamma_st, st.floats(0.0, 1.0))
def test_speedup_falls_with_the_drafts_cost(alpha, gamma, c):
    s = speculative.speedup(alpha, gamma, c)
    assert speculative.speedup(alpha, gamma, 0.0) == speculative.expected_tokens(alpha, gamma)  # E / (0 + 1): a division by 1 is exact
    assert speculative.speedup(alpha, gamma, min(1.0, c + 0.1)) <= s
    # g c + 1 (2 roundings), E / that and E / s (1 each), - 1 and / g (1 each): within (4 (g + 1) / g + 3) u of c
    assert abs(speculative.implied_c(s, alpha, gamma) - c) <= (4 * (gamma + 1) / gamma + 3) * U64


@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=12), st.lists(st.floats(0.01, 1.0), min_size=2, max_size=12))
def test_output_law_of_the_acceptance_rule_is_the_target(pw, qw):
    n = min(len(pw), len(qw))
    p = torch.tensor(pw[:n], dtype=torch.float64)
    q = torch.tensor(qw[:n], dtype=torch.float64)
    p, q = p / p.sum(), q / q.sum()
    assert bool(((speculative.output_distribution(p, q) - p).abs() <= speculative.law_rounding_bound(n)).all())


@settings(derandomize=True, database=None, max_examples=25, deadline=None)
@given(st.lists(st.integers(2, 255), min_size=1, max_size=6), st.integers(1, 12), st.integers(1, 6))
def test_speculative_loop_emits_greedy_tokens(models, prompt, new_tokens, gamma):
    """The speculative loop (any draft, any gamma) emits exactly the target's greedy tokens, in float64 (no near-ties);
    its own count of passes: one target pass per kept group, gamma draft passes per target pass at most."""
    target, draft = models
    alone = speculative.generate(target, prompt, new_tokens, stop_at_eos=False)
    spec = speculative.generate(target, prompt, new_tokens, draft=draft, gamma=gamma, stop_at_eos=False)
    assert spec.tokens == alone.tokens and len(spec.tokens) == new_tokens
    assert alone.target_passes == new_tokens
    assert sum(spec.kept_per_pass) == new_tokens and len(spec.kept_per_pass) == spec.target_passes
    assert spec.draft_passes <= gamma * spec.target_passes
