"""The catalogue of faults, one block per section of the chapter (see :mod:`cheapinfer.faults`).

Every fault is a realistic bug in the measured system or a library regression, written as a patch of
the measurement code that the claims' tests call. Each names the claims it must turn red.
"""

from __future__ import annotations

import torch

from . import asides, budget, kv
from .faults import CONSTANT, DISABLED, RULE, STATISTIC, fault, patched  # noqa: F401

# ------------------------------------------------------------------------------------------------
# 1. KV cache
# ------------------------------------------------------------------------------------------------


@fault(
    "kv-bytes-counts-query-heads",
    section="KV",
    kind=CONSTANT,
    targets=("KV-BYTES-FORMULA", "KV-RESIDENT-ONLY", "KV-MHA-7X", "KV-7B-CACHE"),
    what="the cache-size formula counts the 14 query heads instead of the 2 KV heads (the MHA formula applied to a GQA model)",
)
def _kv_bytes_query_heads():
    real = kv.kv_bytes_per_token

    def wrong(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
        return real(layers, kv_heads * 7, head_dim, bytes_per_element)

    with patched(kv, "kv_bytes_per_token", wrong):
        yield


@fault(
    "kv-decode-ignores-cache",
    section="KV",
    kind=DISABLED,
    targets=("KV-IDENTITY", "KV-SPEEDUP-48", "KV-PREFILL-DECODE", "KV-DECODE-FLAT", "KV-DECODE-MEMBOUND"),
    what="the decode step stops handing its cache to the model (a renamed keyword dropped on the way), so every step sees only its own token: fast, flat in context, and wrong",
)
def _kv_decode_ignores_cache():
    def no_cache(model, new_ids, past):
        return model(new_ids, use_cache=True)

    with patched(kv, "cached_forward", no_cache):
        yield


@fault(
    "kv-cached-generation-recomputes",
    section="KV",
    kind=DISABLED,
    targets=("KV-SPEEDUP-48", "KV-IDENTITY"),
    what="'cached' generation feeds the whole sequence at every step with a fresh cache: the right tokens, at the cost of recomputation",
)
def _kv_cached_generation_recomputes():
    @torch.inference_mode()
    def recomputing(model, ids, new_tokens, on_step=None):
        seq = ids
        for k in range(1, new_tokens + 1):
            nxt = model(seq, use_cache=True).logits[:, -1:].argmax(-1)
            seq = torch.cat([seq, nxt], dim=1)
            if on_step:
                on_step(k)
        return seq[:, ids.shape[1]:]

    with patched(kv, "greedy_cached", recomputing):
        yield


@fault(
    "kv-uncached-reuses-cache",
    section="KV",
    kind=DISABLED,
    targets=("KV-MEMORY-8.3X",),
    what="the 'uncached' baseline keeps the cache of its previous step and feeds only the new token, so it is a cached generation under another name",
)
def _kv_uncached_reuses_cache():
    kept: dict[int, tuple] = {}

    def reusing(model, seq):
        cache, length = kept.get(id(model), (None, -1))
        if cache is not None and length == seq.shape[1] - 1:
            out = model(seq[:, -1:], **kv._cache_kwargs(model, cache), use_cache=True)
        else:
            out = model(seq, use_cache=True)
        kept[id(model)] = (kv.returned_cache(out), seq.shape[1])
        return out.logits[:, -1:].argmax(-1)

    with patched(kv, "uncached_next", reusing):
        yield


@fault(
    "kv-head-cached-scores-every-query",
    section="KV",
    kind=DISABLED,
    targets=("KV-HEAD-TIMING", "KV-SCORES-BYTES"),
    what="the cached head step projects and scores every query instead of the new token's (the query is not sliced to the last row), then keeps the last row: right output, recompute's cost",
)
def _kv_head_cached_scores_every_query():
    import math

    def cached(self):
        x = self.x[-1:]
        k = torch.cat([self.k_cache, x @ self.wk])  # [n, d]
        v = torch.cat([self.v_cache, x @ self.wv])
        scores = ((self.x @ self.wq) @ k.T) / math.sqrt(self.d)  # [n, n]: every query
        mask = torch.ones(self.n, self.n, dtype=torch.bool, device=scores.device).triu_(1)
        return (scores.masked_fill(mask, float("-inf")).softmax(-1) @ v)[-1:], scores

    with patched(kv.Head, "cached", cached):
        yield


@fault(
    "kv-macs-attention-counts-kv-heads",
    section="KV",
    kind=CONSTANT,
    targets=("KV-MACS",),
    what="the closed form's attention MACs per query-key pair count the 2 KV heads instead of the 14 query heads (GQA shares keys, not the work)",
)
def _kv_macs_attention_kv_heads():
    def wrong(arch=kv.QWEN25_05B):
        return 2 * arch.layers * arch.kv_heads * arch.head_dim

    with patched(kv, "attention_macs_per_pair", wrong):
        yield


@fault(
    "kv-measured-bytes-keys-only",
    section="KV",
    kind=RULE,
    targets=("KV-BYTES-MEASURED", "KV-RESIDENT-ONLY", "KV-MHA-7X", "KV-7B-CACHE"),
    what="the cache-tensor walk collects only each layer's keys, not its values (the measured cache is half its size)",
)
def _kv_measured_bytes_keys_only():
    def keys_only(cache):
        if hasattr(cache, "layers"):
            return [layer.keys for layer in cache.layers]
        return [pair[0] for pair in cache]

    with patched(kv, "dynamic_cache_tensors", keys_only):
        yield


@fault(
    "kv-prefill-feeds-last-token",
    section="KV",
    kind=RULE,
    targets=("KV-PREFILL-GROWS",),
    what="the timed prefill slices the prompt to its last token (ids[:, -1:], the decode-step slice), so time to first token no longer depends on the prompt",
)
def _kv_prefill_last_token():
    def last_only(model, ids):
        return lambda: model(ids[:, -1:], use_cache=True)

    with patched(kv, "prefill", last_only):
        yield


@fault(
    "kv-listing-cache-alias-dropped",
    section="KV",
    kind=DISABLED,
    targets=("KV-API",),
    what="a transformers regression: the output's `past_key_values` alias silently returns None, so the listing as printed feeds back no cache",
)
def _kv_listing_alias_dropped():
    from transformers.utils import generic

    with patched(generic.ModelOutput, "past_key_values", property(lambda self: None)):
        yield


@fault(
    "flash-fused-drops-causal-mask",
    section="ASIDE",
    kind=RULE,
    targets=("FLASH-NO-SCORES",),
    what="the fused attention call forgets is_causal, so it attends to future positions: not the same function as the explicit path",
)
def _flash_drops_causal():
    real = asides.fused

    def no_mask(q, k, v, causal=True):
        return real(q, k, v, False)

    with patched(asides, "fused", no_mask):
        yield


# ------------------------------------------------------------------------------------------------
# 2. Batching, paged cache
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# 3-4. Weight quantization, activation outliers
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# 5. Does quantization hurt?
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# 6-7. Speculative decoding, distillation
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# 8. The budget
# ------------------------------------------------------------------------------------------------


@fault(
    "budget-reserve-ignored",
    section="BUD",
    kind=CONSTANT,
    targets=("BUD-13B-8GB", "BUD-16GB-INT8"),
    what="the budget forgets the memory reserved for activations and the runtime, so every configuration seems to hold more tokens",
)
def _budget_reserve_ignored():
    real = budget.budget

    def no_reserve(model: str, bits: float, memory_gib: float, reserve_gib: float = budget.RESERVE_GIB) -> budget.Budget:
        return real(model, bits, memory_gib, 0.0)

    with patched(budget, "budget", no_reserve):
        yield
