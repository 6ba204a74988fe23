"""The paged cache inside the model: it hands back exactly what was written, and generation on it gives the model's own cache's tokens.

Two checks, each with its own derivation:

- what the cache does is move data: every update must hand attention back, bitwise, the keys and
  values written so far, in order (nothing is computed, so nothing is rounded: exact equality).
  A block handed out twice, a gather that reads the wrong block or a lost write breaks it.
- the tokens: the paged cache's keys and values reach attention as a view of the block pool
  (other strides than DynamicCache's contiguous tensor), so the kernels may sum in another order.
  The greedy tokens must be equal, except at a near-tie: where they first differ, the two tokens'
  float64 logit gap must be within the first-order bound of fp32 rounding
  (:func:`cheapinfer.runtime.rounding.compare_greedy`), and the near-tie is reported.
"""

import pytest
import torch

from cheapinfer.chapter.batching import paging
from cheapinfer.chapter.kv_cache import kv
from cheapinfer.runtime import hf, rounding, timing

NEW_TOKENS = 8


def _generate(model, ids, cache, new_tokens):
    return hf.generate(model, ids, cache=cache, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)


class _HandsBackWhatWasWritten:
    """Wraps every layer's ``update`` of a one-sequence cache: what it returns must equal, bitwise, the concatenation of all it was given."""

    def __init__(self, cache):
        self.written: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.updates, self.mismatches = 0, []
        for i, layer in enumerate(cache.layers):
            layer.update = self._wrap(i, layer.update)

    def _wrap(self, i, update):
        def wrapped(k, v, *args, **kwargs):  # [1, H, T, D] new keys and values
            got_k, got_v = update(k, v, *args, **kwargs)
            old_k, old_v = self.written.get(i, (k[:, :, :0], v[:, :, :0]))
            want_k, want_v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)  # [1, H, S, D]
            self.written[i] = (want_k, want_v)
            if not (torch.equal(got_k, want_k) and torch.equal(got_v, want_v)):
                self.mismatches.append((i, want_k.shape[2]))
            self.updates += 1
            return got_k, got_v

        return wrapped


@pytest.mark.parametrize(("which", "new_tokens"), [("twin", 4), ("stand-in", NEW_TOKENS)])  # the twin's step is 4x the stand-in's
def test_generate_on_the_paged_cache_equals_dynamic_cache(which, new_tokens, request):
    """``model.generate`` with a paged cache (blocks smaller than the prompt, so it spans several) hands back what was written, and gives DynamicCache's greedy tokens up to near-ties."""
    profile = request.getfixturevalue("twin" if which == "twin" else "stand_in")
    model = profile.model
    ids = hf.model_ids(model, torch.randint(0, 1000, (1, 5), generator=torch.Generator().manual_seed(0)))
    with timing.cpu_threads():
        want = _generate(model, ids, hf.new_cache(model.config), new_tokens)
        cache = paging.paged_cache(model.config, num_blocks=8, block_size=4, dtype=profile.dtype, device=profile.device)
        moves = _HandsBackWhatWasWritten(cache)
        got = _generate(model, ids, cache, new_tokens)
    assert moves.updates == model.config.num_hidden_layers * new_tokens  # every layer of every forward went through the pool
    assert not moves.mismatches, f"(layer, tokens held) handed back other keys or values than were written: {moves.mismatches[:5]}"
    same = rounding.compare_greedy(model, ids[0], want[0, ids.shape[1]:], got[0, ids.shape[1]:])
    assert same.agree, same.describe()
    assert cache.pool.lengths[0] == ids.shape[1] + new_tokens - 1  # the last token is returned, never fed back
    assert len(cache.pool.tables[0]) == -(-cache.pool.lengths[0] // 4) and cache.pool.tables_consistent()


def test_suite_loop_on_the_paged_cache_equals_its_own_cache(stand_in):
    """The suite's own greedy loop (kv.greedy_cached) on the paged cache hands back what was written and gives its own cache's tokens up to near-ties; crop gives blocks back."""
    model = stand_in.model
    ids = hf.model_ids(model, [stand_in.tokenizer("The history of the Roman empire began when")["input_ids"]])
    with timing.cpu_threads():
        want = kv.greedy_cached(model, ids, NEW_TOKENS)
        cache = paging.paged_cache(model.config, num_blocks=4, block_size=16, device=stand_in.device)
        moves = _HandsBackWhatWasWritten(cache)
        got = kv.greedy_cached(model, ids, NEW_TOKENS, cache=cache)
    assert moves.updates == model.config.num_hidden_layers * NEW_TOKENS
    assert not moves.mismatches, f"(layer, tokens held) handed back other keys or values than were written: {moves.mismatches[:5]}"
    same = rounding.compare_greedy(model, ids[0], want[0], got[0])
    assert same.agree, same.describe()
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


def test_teacher_forcing_finds_the_one_token_a_batch_got_wrong():
    """Every request's tokens against the model's own choice after each prefix: equal for the model's own greedy
    tokens; a token the model would not choose, far from a near-tie, is a difference at its position."""
    from cheapinfer.chapter.batching import paged_scheduler
    from cheapinfer.chapter.kv_cache import kv_macs

    torch.manual_seed(0)
    model = kv_macs.tiny_model(kv_macs.tiny_arch()).eval()
    prompts = [[5, 9, 13], [7, 2, 40, 41, 3]]
    own = [paged_scheduler.tokens_alone(model, p, 6) for p in prompts]
    judge = rounding.GreedyJudge(model)
    assert all(c.equal for c in paged_scheduler.teacher_forced(model, prompts, own, judge, rows_per_pass=1))
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompts[1] + own[1][:3]])).logits[0, -1]
    wrong = [own[0], own[1][:3] + [int(logits.argmin())] + own[1][4:]]  # the least likely token at position 3
    found = paged_scheduler.teacher_forced(model, prompts, wrong, judge)
    assert found[0].equal and not found[1].agree and found[1].position == 3
