"""The KV cache (section 1): its bytes, its use in every generation loop, the listing."""

from __future__ import annotations

import contextlib

import torch

from ...chapter.kv_cache import kv, kv_listing, kv_macs, kv_memory
from ...runtime import accel, hf
from ..base import CONSTANT, DISABLED, RULE, fault, patched
from .patches import replaying_steps

# ------------------------------------------------------------------------------------------------
# 1. KV cache
# ------------------------------------------------------------------------------------------------


@fault(
    "kv-bytes-counts-query-heads",
    section="kv_cache",
    kind=CONSTANT,
    targets=("KV-BYTES-FORMULA", "KV-BYTES-MEASURED", "KV-RESIDENT-ONLY", "KV-MHA-7X", "KV-7B-CACHE"),
    what="the cache-size formula counts the 14 query heads instead of the 2 KV heads (the MHA formula applied to a GQA model)",
)
def _kv_bytes_query_heads():
    real = kv.kv_bytes_per_token

    def wrong(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
        return real(layers, kv_heads * 7, head_dim, bytes_per_element)

    with patched(kv, "kv_bytes_per_token", wrong):
        yield


@fault(
    "kv-decode-step-replays-first",
    section="kv_cache",
    kind=RULE,
    targets=("KV-DECODE-MEMBOUND", "KV-DECODE-FLAT", "KV-PREFILL-DECODE"),
    what="the repeatable decode step runs its forward once and replays that result on every later call (a step function cached by its arguments), so the clock times no forward",
)
def _kv_decode_step_replays():
    with replaying_steps(kv, "decode_step"):
        yield


@fault(
    "kv-short-step-refeeds-its-context",
    section="kv_cache",
    kind=DISABLED,
    targets=("KV-DECODE-FLAT",),
    what="the repeatable decode step at the shortest context (16 tokens) crops its cache to nothing and feeds its whole context again, one forward over 17 tokens without the cache: the long context then reads as faster than the short one, which a ceiling alone passes",
)
def _kv_short_step_refeeds():
    real = kv.decode_step

    def decode_step(model, cache, context):
        if context > 16:
            return real(model, cache, context)
        ids = torch.zeros((1, context + 1), dtype=torch.long, device=next(model.parameters()).device)

        def step():
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)

        return step

    with patched(kv, "decode_step", decode_step):
        yield


@fault(
    "kv-prefill-replays-first",
    section="kv_cache",
    kind=RULE,
    targets=("KV-PREFILL-GROWS", "KV-PREFILL-DECODE"),
    what="the repeatable prefill runs its forward once and replays that result on every later call (a prompt cache keyed by the prompt), so the clock times no prefill after the first",
)
def _kv_prefill_replays():
    with replaying_steps(kv, "prefill"):
        yield


@fault(
    "kv-generation-replayed-from-store",
    section="kv_cache",
    kind=RULE,
    targets=("KV-SPEEDUP-48",),
    what="cached generation keeps a store keyed by its prompt and length (a response cache) and, for a prompt it has seen, streams the stored tokens through its step callback without running the model, so every timed round after the first times a lookup",
)
def _kv_generation_replayed():
    real, store = kv.greedy_cached, {}

    def replaying(model, ids, new_tokens, on_step=None, cache=None):
        key = (id(model), tuple(ids.flatten().tolist()), new_tokens)
        if key not in store:
            store[key] = real(model, ids, new_tokens, on_step, cache)
            return store[key]
        for k in range(1, new_tokens + 1):
            if on_step:
                on_step(k)
        return store[key]

    with patched(kv, "greedy_cached", replaying):
        yield


@fault(
    "kv-decode-ignores-cache",
    section="kv_cache",
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
    section="kv_cache",
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
    "kv-forward-keeps-last-logits-only",
    section="kv_cache",
    kind=DISABLED,
    targets=("KV-MEMORY-8.3X",),
    what="a transformers release makes a plain forward keep only the last position's logits (logits_to_keep=1 by default), so the uncached baseline no longer holds the logit row of every position the chapter's naive loop computes",
)
def _kv_forward_keeps_last_logits_only():
    def last_only(model, seq):
        return model(seq, use_cache=False, logits_to_keep=1).logits[:, -1:].argmax(-1)

    with patched(kv, "uncached_next", last_only):
        yield


@fault(
    "kv-breakdown-tags-hidden-state",
    section="kv_cache",
    kind=RULE,
    targets=("KV-MEMORY-8.3X",),
    what="the peak's breakdown hooks the model's last norm for the logits (the hidden state the head reads, one module early), so the bytes it calls logits are the 896-wide hidden rows, not the 151,936-wide logit rows",
)
def _kv_breakdown_tags_hidden_state():
    with patched(kv_memory, "logits_module", lambda model: model.base_model.norm):
        yield


@fault(
    "kv-uncached-reuses-cache",
    section="kv_cache",
    kind=DISABLED,
    targets=("KV-MEMORY-8.3X",),
    what="the 'uncached' baseline keeps the cache of its previous step and feeds only the new token, so it is a cached generation under another name",
)
def _kv_uncached_reuses_cache():
    kept: dict[int, tuple] = {}

    def reusing(model, seq):
        cache, length = kept.get(id(model), (None, -1))
        if cache is not None and length == seq.shape[1] - 1:
            out = hf.forward(model, seq[:, -1:], cache=cache, use_cache=True)
        else:
            out = model(seq, use_cache=True)
        kept[id(model)] = (kv.returned_cache(out), seq.shape[1])
        return out.logits[:, -1:].argmax(-1)

    with patched(kv, "uncached_next", reusing):
        yield


@fault(
    "kv-head-cached-scores-every-query",
    section="kv_cache",
    kind=DISABLED,
    targets=("KV-HEAD-TIMING", "KV-SCORES-BYTES"),
    what="the cached head step projects and scores every query instead of the new token's (the query is not sliced to the last row), then keeps the last row: right output, recompute's cost",
)
def _kv_head_cached_scores_every_query():
    import math

    real = kv.Head.cached

    def cached(self):
        out, _ = real(self)  # the new token's row, as the cached step computes it
        k = torch.cat([self.k_cache, self.x[-1:] @ self.wk])  # [n, d]
        return out, ((self.x @ self.wq) @ k.T) / math.sqrt(self.d)  # the bug: [n, n], every query projected and scored

    with patched(kv.Head, "cached", cached):
        yield


@fault(
    "kv-macs-attention-counts-kv-heads",
    section="kv_cache",
    kind=CONSTANT,
    targets=("KV-MACS",),
    what="the closed form's attention MACs per query-key pair count the 2 KV heads instead of the 14 query heads (GQA shares keys, not the work)",
)
def _kv_macs_attention_kv_heads():
    def wrong(arch=kv.QWEN25_05B):
        return 2 * arch.layers * arch.kv_heads * arch.head_dim

    with patched(kv_macs, "attention_macs_per_pair", wrong):
        yield


@fault(
    "kv-measured-bytes-keys-only",
    section="kv_cache",
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
    "bandwidth-probe-sized-in-kib",
    section="kv_cache",
    kind=CONSTANT,
    targets=("KV-DECODE-MEMBOUND", "Q-BYTES-SPEED"),
    what="the memory-bandwidth probes are sized in KiB where bytes were meant (512 KiB instead of 512 MiB), so the copy and the read stay "
         "in a cache and measure it, not memory (KV-DECODE-MEMBOUND's bound, and Q-BYTES-SPEED's rooflines, over-read limit and premise)",
)
def _bandwidth_probe_sized_in_kib():
    real = accel.stream_bytes
    with patched(accel, "stream_bytes", lambda device="cpu": real(device) // 1024):
        yield


@fault(
    "kv-prefill-feeds-last-token",
    section="kv_cache",
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
    section="kv_cache",
    kind=DISABLED,
    targets=("KV-API",),
    what="a transformers regression: the output's `past_key_values` alias silently returns None, so the listing as printed feeds back no cache",
)
def _kv_listing_alias_dropped():
    from transformers.utils import generic

    read = generic.ModelOutput.__getattribute__

    def dropped(self, name):  # 5.x: a deprecated alias property; 4.x: the dataclass field itself
        return None if name == "past_key_values" else read(self, name)

    with patched(generic.ModelOutput, "__getattribute__", dropped):
        yield


@fault(
    "kv-listing-deaf-to-logged-deprecations",
    section="kv_cache",
    kind=RULE,
    targets=("KV-API",),
    what="the deprecation collector listens to Python's warnings only, not to transformers' logger.warning_once, so a cache keyword that transformers deprecates through its logger looks current",
    applies={"transformers": ">=5"},  # 4.x deprecates no cache keyword: the collector has nothing to miss there
)
def _kv_listing_deaf_to_logged():
    @contextlib.contextmanager
    def deaf(records):
        yield records  # the bug: transformers' logger is never listened to

    with patched(kv_listing, "transformers_log", deaf):
        yield
