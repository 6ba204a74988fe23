"""The measurements behind four checks that replaced checks true by construction (issue 43): each gives the exact
value its check asks for on the correct code, and another under the catalogue's fault for it. No model is loaded
but the speculative loop's two tiny ones.

- Q-ABSMAX codes_span_bf16_int8: the listing's 8-bit codes of every bf16 magnitude span [-128, 127];
- SPEC-SLOWDOWN passes: each full verification pass at gamma = 4 costs 5 forwards, the loop's count is the trace's;
- DIST-TEMPERATURE mass_err_over_bound: a softmax sums to 1 within (2V + 1) u;
- PAGE-WASTE blocks_held_over_needed: the pool holds exactly the blocks its sequences' tokens need.
"""

import pytest
import torch

from cheapinfer.chapter.batching import paged_scheduler, paging
from cheapinfer.chapter.distillation import distill
from cheapinfer.chapter.quantization import quant
from cheapinfer.chapter.speculative import speculative
from cheapinfer.faults.core import activate


def test_the_listings_bf16_codes_span_its_clamp_and_each_clamp_fault_moves_one_end():
    span = quant.listing_code_span_bf16(8)
    assert [span["lowest"], span["highest"]] == [-128, 127] and 0 < span["ties"] < span["magnitudes"] == 128
    with activate("q-absmax-clamp-dropped"):
        assert quant.listing_code_span_bf16(8)["highest"] == 128
    with activate("q-absmax-clamp-symmetric"):
        assert quant.listing_code_span_bf16(8)["lowest"] == -127


def test_a_bf16_tie_is_where_the_registry_says():
    a = torch.tensor(85 / 64, dtype=torch.bfloat16)
    scale = a / 127
    assert float(scale) == 171 * 2**-14 and float(a / scale) == 127.5


@pytest.mark.parametrize("vocab", [2, 1000, 151_936])
def test_a_softmax_sums_to_one_within_its_bound_and_sampler_weights_do_not(vocab):
    g = torch.Generator().manual_seed(vocab)
    z = torch.randn(vocab, generator=g) * 4
    for t in (1, 2):
        assert distill.mass_error(z, t) <= distill.mass_bound(vocab)
    with activate("dist-softmax-unnormalised"):
        assert max(distill.mass_error(z, t) for t in (1, 2)) > distill.mass_bound(vocab)


def _pool_run() -> list[float]:
    pool = paging.PagedKVCache(40, 16, 2, 4)
    snaps = []
    for seq, n in enumerate([8, 16, 31, 40]):
        pool.add(seq)
        pool.reserve(seq, n)
    for step in range(20):
        for seq in list(pool.tables):
            pool.reserve(seq, 1)
        if step == 10:
            pool.remove(1)
        snaps.append({"blocks_in_use": pool.blocks_in_use, "blocks_needed": pool.blocks_needed})
    return paged_scheduler.held_over_needed(snaps)


def test_the_pool_holds_exactly_the_blocks_its_sequences_need():
    assert _pool_run() == [1.0, 1.0]
    with activate("paging-block-reserved-ahead"):
        assert _pool_run()[1] > 1.0


def test_a_verification_pass_costs_gamma_plus_one_forwards_counted_by_the_loop():
    target, draft = speculative.counting_pair()
    count = speculative.forwards_per_pass(target, draft, list(range(2, 20)), 40, 4)
    assert set(count["full"]) == {5} and count["loop"] == count["traced"] and count["trailing_drafts"] == 0
    assert 0 < count["alpha"] < 1  # passes that reject and passes that keep: the count holds for both
    with activate("spec-draft-catch-up-forward"):
        caught = speculative.forwards_per_pass(target, draft, list(range(2, 20)), 40, 4)
    assert set(caught["full"]) == {6} and caught["loop"] != caught["traced"]
