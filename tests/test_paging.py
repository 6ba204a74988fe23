"""The paged cache inside the model: generation on it is token-identical to the model's own cache."""

import pytest
import torch
from cheapinfer import hf, kv, paging, timing

NEW_TOKENS = 8


def _generate(model, ids, cache, new_tokens):
    return hf.generate(model, ids, cache=cache, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize(("which", "new_tokens"), [("twin", 4), ("stand-in", NEW_TOKENS)])  # the twin's step is 4x the stand-in's
def test_generate_on_the_paged_cache_equals_dynamic_cache(which, new_tokens, request):
    """``model.generate`` with a paged cache (blocks smaller than the prompt, so it spans several) gives DynamicCache's greedy tokens."""
    profile = request.getfixturevalue("twin" if which == "twin" else "stand_in")
    model = profile.model
    ids = torch.randint(0, 1000, (1, 5), generator=torch.Generator().manual_seed(0)).to(profile.device)
    with timing.cpu_threads():
        want = _generate(model, ids, hf.new_cache(model.config), new_tokens)
        cache = paging.paged_cache(model.config, num_blocks=8, block_size=4, dtype=profile.dtype, device=profile.device)
        got = _generate(model, ids, cache, new_tokens)
    assert torch.equal(got, want)
    assert cache.pool.lengths[0] == ids.shape[1] + new_tokens - 1  # the last token is returned, never fed back
    assert len(cache.pool.tables[0]) == -(-cache.pool.lengths[0] // 4) and cache.pool.tables_consistent()


def test_suite_loop_on_the_paged_cache_equals_its_own_cache(stand_in):
    """The suite's own greedy loop (kv.greedy_cached) on the paged cache gives the tokens it gives on the model's cache; crop gives blocks back."""
    model = stand_in.model
    ids = torch.tensor([stand_in.tokenizer("The history of the Roman empire began when")["input_ids"]])
    with timing.cpu_threads():
        want = kv.greedy_cached(model, ids, NEW_TOKENS)
        cache = paging.paged_cache(model.config, num_blocks=4, block_size=16)
        got = kv.greedy_cached(model, ids, NEW_TOKENS, cache=cache)
    assert torch.equal(got, want)
    held = cache.get_seq_length()
    assert held == ids.shape[1] + NEW_TOKENS - 1 and cache.pool.blocks_in_use == -(-held // 16)
    cache.crop(-(held - 3))  # keep 3 tokens: one block
    assert cache.get_seq_length() == 3 and cache.pool.blocks_in_use == 1 and cache.pool.tables_consistent()


def test_rows_of_different_lengths_refuse_a_multi_token_forward():
    """Left-aligned rows of different lengths take one token per forward; more would let a short row see its own future."""
    from transformers import Qwen2Config

    config = Qwen2Config(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=16, intermediate_size=32, vocab_size=64)
    pool = paging.PagedKVCache(4, 4, 1, 8, layers=1)
    cache = paging.paged_cache(config, 0, pool=pool, rows=["a", "b"])
    pool.append("a", torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match="one token per forward"):
        cache.update(torch.zeros(2, 1, 2, 8), torch.zeros(2, 1, 2, 8), 0)
