"""The catalogue of faults, one block per section of the chapter (see :mod:`cheapinfer.faults.runner`).

Every fault is a realistic bug in the measured system or a library regression, written as a patch of
the measurement code that the claims' tests call. Each names the claims it must turn red.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import replace

import torch

from ..chapter import asides, batching, budget, distill, evaluation, formats, kv, lowbit, outliers, paging, quant, speculative
from ..runtime import hf
from .core import CONSTANT, DISABLED, RULE, STATISTIC, fault, patched  # noqa: F401

# ------------------------------------------------------------------------------------------------
# a cache handed over under a keyword the model does not take
# ------------------------------------------------------------------------------------------------
# The regression the suite once missed: a loop hands its cache over as ``cache=`` to a transformers
# that only knows ``past_key_values`` (4.x), which takes it into ``**kwargs`` and drops it. Every step
# then runs without its history, fast and wrong, and nothing raises. These faults do the same on any
# release (the keyword is misspelled: ``caches=``), scoped to one loop, so that each loop's own
# evidence of cache use (cheapinfer.runtime.evidence) has to notice.


def _misspelled_forward(model, input_ids=None, *, cache=None, **kwargs):
    """:func:`hf.forward` with the cache under a keyword no release takes (swallowed into ``**kwargs``)."""
    return hf.forward(model, input_ids, caches=cache, **kwargs)


_MISSPELLED_HF = type("MisspelledHF", (), {**{k: staticmethod(v) if callable(v) else v for k, v in vars(hf).items() if not k.startswith("__")},
                                         "forward": staticmethod(_misspelled_forward)})


def _misspelled_while(module, fn, returns_callable: bool = False):
    """``fn`` whose model calls through ``module.hf`` misspell the cache keyword while it runs (or, with
    ``returns_callable``, while the callable it returns runs)."""
    import functools

    def scoped(g):
        @functools.wraps(g)
        def call(*args, **kwargs):
            with patched(module, "hf", _MISSPELLED_HF):
                return g(*args, **kwargs)

        return call

    if not returns_callable:
        return scoped(fn)

    @functools.wraps(fn)
    def make(*args, **kwargs):
        return scoped(fn(*args, **kwargs))

    return make


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
    "kv-decode-step-replays-first",
    section="KV",
    kind=RULE,
    targets=("KV-DECODE-MEMBOUND", "KV-DECODE-FLAT", "KV-PREFILL-DECODE"),
    what="the repeatable decode step runs its forward once and replays that result on every later call (a step function cached by its arguments), so the clock times no forward",
)
def _kv_decode_step_replays():
    with _replaying_steps(kv, "decode_step"):
        yield


@fault(
    "kv-prefill-replays-first",
    section="KV",
    kind=RULE,
    targets=("KV-PREFILL-GROWS", "KV-PREFILL-DECODE"),
    what="the repeatable prefill runs its forward once and replays that result on every later call (a prompt cache keyed by the prompt), so the clock times no prefill after the first",
)
def _kv_prefill_replays():
    with _replaying_steps(kv, "prefill"):
        yield


@contextlib.contextmanager
def _replaying_steps(module, name: str):
    """``module.name``, a factory of repeatable step callables, patched so that every step it builds replays its first result."""
    real = getattr(module, name)

    def replaying(*args, **kwargs):
        return _replaying_first(real(*args, **kwargs))

    with patched(module, name, replaying):
        yield


def _replaying_first(step):
    """``step`` run once; every later call returns that first result (a step cached by its arguments)."""
    done = []

    def once():
        if not done:
            done.append(step())
        return done[0]

    return once


@fault(
    "kv-generation-replayed-from-store",
    section="KV",
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
            out = hf.forward(model, seq[:, -1:], cache=cache, use_cache=True)
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

    read = generic.ModelOutput.__getattribute__

    def dropped(self, name):  # 5.x: a deprecated alias property; 4.x: the dataclass field itself
        return None if name == "past_key_values" else read(self, name)

    with patched(generic.ModelOutput, "__getattribute__", dropped):
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


@fault(
    "batch-step-replays-first",
    section="BAT",
    kind=RULE,
    targets=("BAT-1-TO-16", "BAT-KNEE", "BAT-TRADEOFF", "BAT-STATIC-CONT"),
    what="the batch curve's repeatable decode step runs its forward once and replays that result on every later call (a step function cached by its arguments), so the clock times no step at any batch size",
)
def _batch_step_replays():
    with _replaying_steps(batching, "decode_step"):
        yield


@fault(
    "batch-step-cache-keyword-dropped",
    section="BAT",
    kind=DISABLED,
    targets=("BAT-1-TO-16", "BAT-KNEE", "BAT-TRADEOFF", "Q-BYTES-SPEED"),
    what="the batch decode step (the batch curve's, and the low-bit formats' at batch 1) hands its cache over under a keyword the installed transformers does not take, which swallows it: every step decodes its token without the 64-token history",
)
def _batch_step_cache_dropped():
    with patched(batching, "decode_step", _misspelled_while(batching, batching.decode_step, returns_callable=True)):
        yield


@fault(
    "scheduler-cache-keyword-dropped",
    section="BAT",
    kind=DISABLED,
    targets=("BAT-STATIC-CONT",),
    what="the slot scheduler's step (static and continuous alike) hands the batch's cache over under a keyword the model swallows: each step decodes without the requests' histories",
)
def _scheduler_cache_dropped():
    with patched(batching.SlotBatch, "step", _misspelled_while(batching, batching.SlotBatch.step)):
        yield


@fault(
    "paged-scheduler-cache-keyword-dropped",
    section="BAT",
    kind=DISABLED,
    targets=("PAGE-WASTE", "PAGE-PREFIX"),
    what="the scheduler on the paged cache hands the paged cache over under a keyword the model swallows, in its prefills and its decode steps: the block tables fill as scheduled, the model never reads them",
)
def _paged_scheduler_cache_dropped():
    with patched(batching.PagedSlotBatch, "step", _misspelled_while(batching, batching.PagedSlotBatch.step)), \
            patched(batching.PagedSlotBatch, "admit", _misspelled_while(batching, batching.PagedSlotBatch.admit)):
        yield


@fault(
    "batch-decoded-serially",
    section="BAT",
    kind=DISABLED,
    targets=("BAT-1-TO-16",),
    what="the batched decode step loops over its rows, decoding one request after another with its own one-row cache, so a batch of B costs B single steps",
)
def _batch_decoded_serially():
    import torch

    real = batching.decode_step

    def serial(model, batch: int, context: int = 64, seed: int = batching.SEED):
        rows = [real(model, 1, context, seed + i) for i in range(batch)]

        def step() -> torch.Tensor:
            return torch.cat([row() for row in rows])  # [B]

        return step

    with patched(batching, "decode_step", serial):
        yield


@fault(
    "latency-per-token",
    section="BAT",
    kind=STATISTIC,
    targets=("BAT-1-TO-16", "BAT-KNEE", "BAT-TRADEOFF"),
    what="per-request latency is computed as the step time divided by the batch size (the time per generated token), not the step every request of the batch waits for",
)
def _latency_per_token():
    with patched(batching, "request_latency", lambda step_s, batch: step_s / batch):
        yield


@fault(
    "knee-search-stops-at-first-doubling",
    section="BAT",
    kind=RULE,
    targets=("BAT-KNEE",),
    what="the knee rule returns after the first doubling of the batch (a return indented into the loop) instead of searching past the steepest doubling",
)
def _knee_first_doubling():
    def first_only(found, threshold: float = 1.25, sigmas: float = 3.0):
        for d in found:
            if d.side(threshold, sigmas) == "below":
                return d.small
            return None
        return None

    with patched(batching, "knee", first_only):
        yield


@fault(
    "knee-search-stops-at-fixed-size",
    section="BAT",
    kind=RULE,
    targets=("BAT-KNEE",),
    what="the knee search looks no further than a fixed batch size, 16 (the book's own table), and stops there, although the device's memory and the search's time budget allow more",
)
def _knee_search_fixed_size():
    real = batching.search_knee
    fixed = 16

    def stop_at_fixed(steps, spent_s, budget, memory, rounds, warmup=1, setup_s=0.0):
        if max(steps) >= fixed:
            return batching.Plan(None, f"the search stops at batch {fixed}")
        return batching.plan_next(steps, spent_s, budget, memory, rounds, warmup=warmup, setup_s=setup_s)

    def fixed_range(curve, measure, budget, memory, rounds, threshold=1.25, sigmas=3.0, warmup=1, plan=None, clock=None):
        kept = {b: v for b, v in curve.items() if b <= fixed}
        return real(kept, measure, budget, memory, rounds, threshold, sigmas, warmup, plan=stop_at_fixed, **({"clock": clock} if clock else {}))

    with patched(batching, "search_knee", fixed_range):
        yield


@fault(
    "static-refills-slots",
    section="BAT",
    kind=RULE,
    targets=("BAT-STATIC-CONT",),
    what="the static scheduler admits the next queued request into a freed slot at the next step, like a continuous one, instead of holding the slot as padding until the group's longest member is done",
)
def _static_refills_slots():
    real = batching.simulate

    def refilling(policy, lengths, slots, step_cost):
        result = real("continuous" if policy == "static" else policy, lengths, slots, step_cost)
        return dataclasses.replace(result, policy=policy)

    with patched(batching, "simulate", refilling):
        yield


@fault(
    "paging-block-handed-out-twice",
    section="BAT",
    kind=RULE,
    targets=("PAGE-WASTE", "PAGE-PREFIX"),
    what="the allocator hands out a block but leaves it on the free list, so a later sequence is mapped onto the same physical block",
)
def _paging_block_twice():
    def take(self) -> int:
        if not self.free:
            raise paging.OutOfBlocks(f"all {len(self.refs)} blocks are in use")
        b = self.free[0]  # the bug: peeked, never popped
        self.refs[b] = 1
        self.handed_out += 1
        self.reused += b in self._ever
        self._ever.add(b)
        return b

    with patched(paging.PagedKVCache, "_take", take):
        yield


@fault(
    "paging-fork-not-refcounted",
    section="BAT",
    kind=RULE,
    targets=("PAGE-PREFIX",),
    what="a sequence that shares a prefix's blocks does not take a reference on them, so the first owner to finish frees blocks still in use",
)
def _paging_fork_no_ref():
    real = paging.PagedKVCache.fork

    def fork(self, parent, child, tokens=None) -> None:
        real(self, parent, child, tokens)
        for b in self.tables[child]:
            self.refs[b] -= 1  # the bug: the fork's reference is never taken

    with patched(paging.PagedKVCache, "fork", fork):
        yield


# ------------------------------------------------------------------------------------------------
# 3-4. Weight quantization, activation outliers
# ------------------------------------------------------------------------------------------------


@fault(
    "q-sizes-in-gib",
    section="Q",
    kind=CONSTANT,
    targets=("Q-SIZES",),
    what="model sizes computed in binary GiB (2^30 B) while the chapter's GB are decimal (10^9 B)",
)
def _q_sizes_in_gib():
    with patched(quant, "decimal_gb", lambda parameters, bytes_per_parameter: parameters * bytes_per_parameter / 2**30):
        yield


def _listing_with_scale(scale_of):
    """The chapter's listing with its scale line replaced by ``scale_of(W, bits)``."""

    def listing(W, bits):
        qmax = 2 ** (bits - 1) - 1
        scale = scale_of(W, bits)
        Wq = torch.round(W / scale).clamp(-qmax - 1, qmax)
        return Wq, scale, Wq * scale

    return patched(quant, "absmax_listing", listing)


def _schemes_parsed_as(change):
    """Every parsed scheme passed through ``change(scheme) -> scheme`` (a wrong group or granularity)."""
    real = quant.parse_scheme
    return patched(quant, "parse_scheme", lambda name: change(real(name)))


@fault(
    "q-absmax-scale-over-2-pow-b-1",
    section="Q",
    kind=CONSTANT,
    targets=("Q-ABSMAX",),
    what="the absmax scale divides by 2^(b-1) (128 at 8 bits) instead of qmax = 2^(b-1) - 1, so the largest weight lands beyond qmax and is clamped",
)
def _q_absmax_over_128():
    with _listing_with_scale(lambda W, bits: W.abs().max() / 2 ** (bits - 1)):
        yield


@fault(
    "q-absmax-signed-max",
    section="Q",
    kind=RULE,
    targets=("Q-ABSMAX",),
    what="the scale is taken from W.max() instead of W.abs().max(): a matrix whose largest magnitude is negative gets a too small (or negative) scale",
)
def _q_absmax_signed_max():
    with _listing_with_scale(lambda W, bits: W.max() / (2 ** (bits - 1) - 1)):
        yield


@fault(
    "q-suite-rounds-half-away",
    section="Q",
    kind=RULE,
    targets=("Q-ABSMAX",),
    what="the suite's quantizer rounds halves away from zero (C's roundf, gguf's rule) instead of the chapter's torch.round",
)
def _q_suite_rounds_half_away():
    with patched(quant, "ROUNDING", "half-away"):
        yield


@fault(
    "q-group-64-for-128",
    section="Q",
    kind=CONSTANT,
    targets=("Q-BITS-G128",),
    what="a group-128 scheme quantizes with groups of 64 (a default block size that overrides the one asked for)",
)
def _q_group_64_for_128():
    with _schemes_parsed_as(lambda s: replace(s, group=64) if s.group == 128 else s):
        yield


@fault(
    "q-scales-stored-fp32",
    section="Q",
    kind=CONSTANT,
    targets=("Q-BITS-G128",),
    what="scales are stored in fp32 instead of fp16 (bitsandbytes' absmax dtype), 32 instead of 16 bits per group",
)
def _q_scales_fp32():
    with patched(quant, "SCALE_DTYPE", torch.float32):
        yield


@fault(
    "q-nf4-uniform-levels",
    section="Q",
    kind=RULE,
    targets=("Q-NF4",),
    what="the NF4 codebook is 16 evenly spaced levels over [-1, 1] instead of the normal quantiles",
)
def _q_nf4_uniform():
    with patched(quant, "nf4_codebook", lambda dtype=torch.float32: torch.linspace(-1.0, 1.0, 16, dtype=dtype)):
        yield


@fault(
    "q-row-scales-per-tensor",
    section="Q",
    kind=DISABLED,
    targets=("Q-ROW-3.4", "Q-ABSMAX"),
    what="per-row scaling silently falls back to one scale per tensor",
)
def _q_row_per_tensor():
    with _schemes_parsed_as(lambda s: replace(s, granularity="tensor") if s.granularity == "row" else s):
        yield


@fault(
    "q-tensor-scales-per-row",
    section="Q",
    kind=RULE,
    targets=("Q-TWO-THREE-LEVELS", "Q-ERROR-TABLE"),
    what="a per-tensor scheme silently takes one scale per row (an axis mix-up in the absmax), hiding the collapse",
)
def _q_tensor_per_row():
    with _schemes_parsed_as(lambda s: replace(s, granularity="row") if s.granularity == "tensor" else s):
        yield


@fault(
    "q-count-includes-biases",
    section="Q",
    kind=RULE,
    targets=("Q-COUNT",),
    what="the projection filter matches every '*_proj.*' parameter, so the q, k, v biases count as matrices",
)
def _q_count_biases():
    pattern = re.compile(r"\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.")

    with patched(quant, "_PROJ", pattern):
        yield


@fault(
    "q-row-scales-from-transposed-view",
    section="Q",
    kind=RULE,
    targets=("Q-ROW-3.4",),
    what="per-row scales are taken from the rows of the transposed weight's memory viewed as [out, in] (W.T.reshape(out, in)): each row's scale is the largest |w| of other weights, along the wrong axis",
)
def _q_row_scales_transposed():
    real = quant._region_absmax

    def wrong_axis(w, s, blocks):
        if s.granularity != "row":
            return real(w, s, blocks)
        return w.t().reshape(w.shape).abs().amax(dim=1, keepdim=True)

    with patched(quant, "_region_absmax", wrong_axis):
        yield


@fault(
    "formats-bnb-absmax-in-16-bits",
    section="Q",
    kind=CONSTANT,
    targets=("Q-NF4",),
    what="the NF4 storage is measured on a QuantState whose fp32 absmax was cast to fp16 (the chapter's 16-bit assumption) before it is counted and written: the library's own layout is no longer what is measured",
)
def _formats_bnb_absmax_16():
    real = formats._bnb_state

    def half_absmax(w, double_quant):
        codes, qs = real(w, double_quant)
        if qs.state2 is None:
            qs.absmax = qs.absmax.half()
        return codes, qs

    with patched(formats, "_bnb_state", half_absmax):
        yield


@fault(
    "formats-bnb-count-misses-absmax",
    section="Q",
    kind=RULE,
    targets=("Q-NF4",),
    what="the count of the bytes bitsandbytes holds leaves out the absmax of each block (codes and code books only)",
)
def _formats_bnb_count_misses_absmax():
    real = formats._bnb_parts

    def codes_only(codes, qs):
        return {k: v for k, v in real(codes, qs).items() if k != "absmax"}

    with patched(formats, "_bnb_parts", codes_only):
        yield


@fault(
    "q-listing-codes-cast-to-int8",
    section="Q",
    kind=RULE,
    targets=("Q-ABSMAX",),
    what="the chapter's absmax listing is run with its codes cast to int8 (a silent fix of the listing): what is measured is no longer the listing as printed",
)
def _q_listing_cast():
    real = quant.absmax_listing

    def cast(W, bits):
        Wq, scale, W_hat = real(W, bits)
        return Wq.to(torch.int8), scale, W_hat

    with patched(quant, "absmax_listing", cast):
        yield


@fault(
    "q-tail-share-as-fraction",
    section="Q",
    kind=CONSTANT,
    targets=("Q-DOWNPROJ-STATS",),
    what="the share of weights beyond six standard deviations is given as a fraction where the listing prints a percentage (100 times too small)",
)
def _q_tail_share_fraction():
    real = quant.tail_summary

    def as_fraction(max_abs, std, beyond, numel):
        return {**real(max_abs, std, beyond, numel), "beyond_percent": beyond / numel}

    with patched(quant, "tail_summary", as_fraction):
        yield


@fault(
    "q-std-is-frobenius-norm",
    section="Q",
    kind=STATISTIC,
    targets=("Q-DOWNPROJ-STATS",),
    what="the spread of a matrix is its Frobenius norm instead of its standard deviation (sqrt(n) times too large)",
)
def _q_std_norm():
    with patched(quant, "spread", lambda w: float(torch.linalg.vector_norm(w))):
        yield


@fault(
    "out-scan-reads-weights",
    section="OUT",
    kind=RULE,
    targets=("OUT-DIM62", "OUT-PERSISTS"),
    what="the outlier scan reads each layer's down_proj weight (the matrix that writes into the residual stream) instead of the residual stream itself",
)
def _out_reads_weights():
    def weights_as_stream(model, input_ids):
        layers = model.model.layers
        per_layer = [layer.mlp.down_proj.weight.detach().float().T.cpu() for layer in layers]  # [intermediate, hidden]
        return torch.stack(per_layer[:1] + per_layer)  # [L+1, intermediate, hidden]

    with patched(outliers, "residual_stream", weights_as_stream):
        yield


@fault(
    "out-layer-floors-to-embedding",
    section="OUT",
    kind=CONSTANT,
    targets=("OUT-HISTOGRAM", "OUT-INT8-LEVELS", "OUT-ONE-LEVEL", "OUT-EXCLUDE-4"),
    what="the book's layer is scaled with integer division first (16 // 24 * n = 0), so the layer-16 tensor is the embedding output",
)
def _out_layer_zero():
    with patched(outliers, "scaled_layer", lambda book_layer, n_layers: book_layer // outliers.BOOK_LAYERS * n_layers):
        yield


@fault(
    "out-gap-counts-bin-distance",
    section="OUT",
    kind=RULE,
    targets=("OUT-HISTOGRAM",),
    what="the empty octaves between the bulk and the outlier are counted as the distance between their two bins (4 for bins 7 and 11), not the empty bins between them (3)",
)
def _out_gap_off_by_one():
    def distance(counts):
        full = [i for i, c in enumerate(counts) if c]
        return max((b - a for a, b in zip(full, full[1:]) if b - a > 1), default=0)

    with patched(outliers, "empty_octaves_between", distance):
        yield


@fault(
    "out-int8-scale-ignores-outlier",
    section="OUT",
    kind=STATISTIC,
    targets=("OUT-INT8-LEVELS", "OUT-ONE-LEVEL", "OUT-EXCLUDE-4"),
    what="the INT8 level count uses a calibrated scale (99.9th percentile of |h| / 127) that clips the outlier instead of the tensor's absmax",
)
def _out_scale_ignores_outlier():
    def clipped_scale(h):
        return float(torch.quantile(h.abs().flatten().double(), 0.999)) / 127

    with patched(outliers, "tensor_scale", clipped_scale):
        yield


@fault(
    "lowbit-left-in-16bit",
    section="Q",
    kind=DISABLED,
    targets=("Q-BYTES-SPEED",),
    what="the quantized copy is silently left in 16 bits (a quantization call that matched no layer): same bytes, same speed",
)
def _lowbit_left_in_16bit():
    def unchanged(model, name, random_codes=False, seed=0, projections_only=False, act_dtype=None):
        return lowbit._sharing_copy(model).eval().requires_grad_(False)

    with patched(lowbit, "variant", unchanged):
        yield


@fault(
    "lowbit-int8-dequantizes-every-call",
    section="Q",
    kind=DISABLED,
    targets=("Q-BYTES-SPEED",),
    what="the int8 layer dequantizes its whole weight to the activation dtype on every call and runs a dense product, instead of the kernel that reads the codes",
)
def _lowbit_dequantize_every_call():
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.codes.to(x.dtype) * self.scales[:, None]  # [out, in], rebuilt every call
        return torch.nn.functional.linear(x, w, self.bias)

    with patched(lowbit.Int8Linear, "forward", forward):
        yield


@fault(
    "lowbit-step-replays-first",
    section="Q",
    kind=RULE,
    targets=("Q-BYTES-SPEED",),
    what="the low-bit copies' decode step runs its forward once and replays that result on every later call (a step cached by its arguments: "
         "the packed codes never change), so the clock times no kernel; the speedups grow, bounded below only",
)
def _lowbit_step_replays():
    real = batching.decode_step

    def replaying(model, batch, context=64, seed=batching.SEED):
        step = real(model, batch, context, seed)
        low_bit = any(isinstance(m, (lowbit.Int8Linear, lowbit.Int4Linear)) for m in model.modules())
        return _replaying_first(step) if low_bit else step

    with patched(batching, "decode_step", replaying):
        yield


# ------------------------------------------------------------------------------------------------
# 5. Does quantization hurt?
# ------------------------------------------------------------------------------------------------


@fault(
    "eval-ppl-windows-overlap",
    section="EVAL",
    kind=STATISTIC,
    targets=("EVAL-TABLE",),
    what="the perplexity slides its windows with a stride of half a window and forgets to mask the overlap, so every token after the first half-window is scored twice",
)
def _eval_ppl_windows_overlap():
    import math

    import torch
    import torch.nn.functional as F

    @torch.no_grad()
    def overlapping(model, ids, window=evaluation.WINDOW):
        device = next(model.parameters()).device
        inputs = ids[:-1].unfold(0, window, window // 2).to(device)  # [W', window], windows overlapping by half
        targets = ids[1:].unfold(0, window, window // 2).to(device)
        logits = model(input_ids=inputs, use_cache=False).logits
        return math.exp(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).item())

    with patched(evaluation, "perplexity", overlapping):
        yield


@fault(
    "eval-agreement-off-by-one",
    section="EVAL",
    kind=RULE,
    targets=("EVAL-INT8-FREE", "EVAL-AGREEMENT", "SPEC-ALPHA"),
    what="agreement compares the model's guess at position t (which predicts t + 1) with the reference token at t: the logits are not shifted",
)
def _eval_agreement_off_by_one():
    def unshifted(pred_row, continuation):
        start = len(continuation.prompt)  # should be start - 1
        return pred_row[start : start + len(continuation.tokens)]

    with patched(evaluation, "aligned_guesses", unshifted):
        yield


@fault(
    "eval-agreement-free-running",
    section="EVAL",
    kind=RULE,
    targets=("EVAL-AGREEMENT",),
    what="agreement compares each scheme's own greedy continuation of the prompt with the reference's tokens, instead of its guess at the reference's context: once a scheme leaves the reference's path, every later position is judged on another text",
)
def _eval_agreement_free_running():
    def free_running(model, continuations):
        return [[g == t for g, t in zip(evaluation.greedy(model, c.prompt, len(c.tokens)), c.tokens)] for c in continuations]

    with patched(evaluation, "agreement_by_position", free_running):
        yield


@fault(
    "eval-mcnemar-counts-ties",
    section="EVAL",
    kind=STATISTIC,
    targets=("EVAL-INT8-TENSOR",),
    what="McNemar's test is run over all questions instead of the discordant ones: questions both schemes answer alike count as trials, so 'no change' looks like a significant one",
)
def _eval_mcnemar_counts_ties():
    from scipy import stats

    def over_all(first, second):
        lost = sum(a and not b for a, b in zip(first, second))
        gained = sum(b and not a for a, b in zip(first, second))
        return evaluation.PairedChange(lost, gained, float(stats.binomtest(lost, len(first), 0.5).pvalue))

    with patched(evaluation, "mcnemar_exact", over_all):
        yield


@fault(
    "eval-interval-wrong-level",
    section="EVAL",
    kind=STATISTIC,
    targets=("EVAL-NOISE",),
    what="the binomial interval is given the significance level (0.05) where it expects the confidence level (0.95)",
)
def _eval_interval_wrong_level():
    real = evaluation.binomial_interval

    def wrong_level(k, n, confidence=evaluation.CONFIDENCE):
        return real(k, n, 1 - confidence)

    with patched(evaluation, "binomial_interval", wrong_level):
        yield


@fault(
    "eval-quantization-not-applied",
    section="EVAL",
    kind=DISABLED,
    targets=("EVAL-INT4-COLLAPSE", "EVAL-GRANULARITY"),
    what="the quantized copy writes its fake-quantized weights into a detached clone, so every scheme's model keeps the full-precision weights",
)
def _eval_quantization_not_applied():
    import copy

    def unquantized(model, scheme):
        clone = copy.deepcopy(model)
        for p in quant.projection_weights(clone).values():
            p.detach().clone().copy_(quant.fake_quantize(p, scheme))  # written into a copy that is thrown away
        clone.eval()
        clone.requires_grad_(False)
        return clone

    with patched(quant, "quantized_copy", unquantized):
        yield


# ------------------------------------------------------------------------------------------------
# 6-7. Speculative decoding, distillation
# ------------------------------------------------------------------------------------------------


def _spec_passes_misspelled(which: str):
    """speculative.generate whose ``which`` ("target" or "draft") passes misspell the cache keyword."""
    real_generate, real_forward = speculative.generate, speculative._forward

    def generate(target, prompt, new_tokens, draft=None, gamma=4, stop_at_eos=True):
        broken = target if which == "target" else draft

        def forward(model, tokens, cache, keep):
            if model is broken:
                with patched(speculative, "hf", _MISSPELLED_HF):
                    return real_forward(model, tokens, cache, keep)
            return real_forward(model, tokens, cache, keep)

        with patched(speculative, "_forward", forward):
            return real_generate(target, prompt, new_tokens, draft=draft, gamma=gamma, stop_at_eos=stop_at_eos)

    return generate


@fault(
    "spec-verify-pass-replays-first",
    section="SPEC",
    kind=RULE,
    targets=("SPEC-VERIFY-COST",),
    what="each repeatable verification pass runs its forward once and replays that result on every later call (a pass cached by its arguments), so the clock times no pass at any width",
)
def _spec_verify_replays():
    real = speculative.verify_callables

    def replaying(model, context, widths, seed):
        return {name: _replaying_first(step) for name, step in real(model, context, widths, seed).items()}

    with patched(speculative, "verify_callables", replaying):
        yield


@fault(
    "spec-plain-generation-replayed-from-store",
    section="SPEC",
    kind=RULE,
    targets=("SPEC-REAL-SLOWDOWN",),
    what="plain greedy generation (no draft) keeps a store keyed by its model, prompt and length (a response cache) and returns the stored run for a prompt it has seen without running the model, so every timed round of the baseline after the first times a lookup and speculation looks slower than ever",
)
def _spec_plain_generation_replayed():
    real, store = speculative.generate, {}

    def replaying(target, prompt, new_tokens, draft=None, gamma=4, stop_at_eos=True):
        if draft is not None:
            return real(target, prompt, new_tokens, draft=draft, gamma=gamma, stop_at_eos=stop_at_eos)
        key = (id(target), tuple(prompt), new_tokens, stop_at_eos)
        if key not in store:
            store[key] = real(target, prompt, new_tokens, stop_at_eos=stop_at_eos)
        return store[key]

    with patched(speculative, "generate", replaying):
        yield


@fault(
    "spec-target-cache-keyword-dropped",
    section="SPEC",
    kind=DISABLED,
    targets=("SPEC-VERIFY-COST", "SPEC-EXACT-GREEDY", "SPEC-ALPHA", "SPEC-REAL-SLOWDOWN"),
    what="the target's verification pass hands its cache over under a keyword the model swallows: each pass scores the proposals without the sequence before them",
)
def _spec_target_cache_dropped():
    real_verify = speculative.verify_callables

    def verify_callables(*args, **kwargs):
        with patched(speculative, "hf", _MISSPELLED_HF):
            made = real_verify(*args, **kwargs)
        return {name: _misspelled_while(speculative, call) for name, call in made.items()}

    with patched(speculative, "generate", _spec_passes_misspelled("target")), patched(speculative, "verify_callables", verify_callables):
        yield


@fault(
    "spec-draft-cache-keyword-dropped",
    section="SPEC",
    kind=DISABLED,
    targets=("SPEC-EXACT-GREEDY", "SPEC-ALPHA", "SPEC-REAL-SLOWDOWN"),
    what="the draft's passes hand its cache over under a keyword the model swallows: the draft proposes from its last token alone, the target still verifies, so every emitted token stays the target's",
)
def _spec_draft_cache_dropped():
    with patched(speculative, "generate", _spec_passes_misspelled("draft")):
        yield


@fault(
    "spec-accept-q-over-p",
    section="SPEC",
    kind=RULE,
    targets=("SPEC-EXACT-SAMPLING",),
    what="the acceptance rule is written min(1, q(x) / p(x)) instead of min(1, p(x) / q(x))",
)
def _spec_accept_q_over_p():
    import torch

    with patched(speculative, "accept_probability", lambda p, q: torch.clamp(q / p, max=1.0)):
        yield


@fault(
    "spec-residual-not-normalised",
    section="SPEC",
    kind=RULE,
    targets=("SPEC-EXACT-SAMPLING",),
    what="the residual distribution max(0, p - q) is used without renormalising it",
)
def _spec_residual_not_normalised():
    with patched(speculative, "residual", lambda p, q: (p - q).clamp_min(0)):
        yield


@fault(
    "spec-greedy-keeps-draft-token",
    section="SPEC",
    kind=RULE,
    targets=("SPEC-EXACT-GREEDY",),
    what="on the first mismatch the greedy loop keeps the draft's token instead of the target's correction",
)
def _spec_greedy_keeps_draft_token():
    def keeps_draft(proposals, target_choice):
        n = 0
        while n < len(proposals) and proposals[n] == target_choice[n]:
            n += 1
        return n, list(proposals[:n]) + [int(proposals[n] if n < len(proposals) else target_choice[n])]

    with patched(speculative, "accept_greedy", keeps_draft):
        yield


@fault(
    "spec-greedy-drops-target-token",
    section="SPEC",
    kind=RULE,
    targets=("SPEC-ALPHA", "SPEC-SLOWDOWN"),
    what="after accepted proposals the greedy loop drops the target's own token (the correction or the bonus) and lets the next pass find it again: the emitted tokens stay the target's, each pass keeps one token fewer",
)
def _spec_greedy_drops_target_token():
    real = speculative.accept_greedy

    def drops(proposals, target_choice):
        n, kept = real(proposals, target_choice)
        return (n, kept[:-1]) if n > 0 else (n, kept)

    with patched(speculative, "accept_greedy", drops):
        yield


@fault(
    "spec-expected-off-by-one",
    section="SPEC",
    kind=CONSTANT,
    targets=("SPEC-EXPECTED", "SPEC-SPEEDUP", "SPEC-SLOWDOWN"),
    what="the expected tokens per pass sum gamma terms, (1 - a^gamma) / (1 - a), forgetting the target's own token",
)
def _spec_expected_off_by_one():
    def gamma_terms(alpha, gamma):
        return float(gamma) if alpha == 1.0 else (1.0 - alpha**gamma) / (1.0 - alpha)

    with patched(speculative, "expected_tokens", gamma_terms):
        yield


@fault(
    "spec-draft-cost-per-pass",
    section="SPEC",
    kind=RULE,
    targets=("SPEC-SPEEDUP", "SPEC-SLOWDOWN", "SPEC-GAMMA8"),
    what="the draft's cost is charged once per verification pass instead of once per proposed token: E / (c + 1) instead of E / (gamma c + 1)",
)
def _spec_draft_cost_per_pass():
    with patched(speculative, "speedup", lambda alpha, gamma, c: speculative.expected_tokens(alpha, gamma) / (c + 1.0)):
        yield


@fault(
    "spec-verify-one-position-at-a-time",
    section="SPEC",
    kind=DISABLED,
    targets=("SPEC-VERIFY-COST",),
    what="the verification pass feeds the proposed positions one at a time (a loop of single-position passes) instead of one pass over all of them",
)
def _spec_verify_one_position_at_a_time():
    import torch

    real = speculative._forward

    def one_at_a_time(model, tokens, cache, keep):
        return torch.cat([real(model, [t], cache, 1) for t in tokens])[-keep:]

    with patched(speculative, "_forward", one_at_a_time):
        yield


@fault(
    "spec-draft-dropped",
    section="SPEC",
    kind=DISABLED,
    targets=("SPEC-REAL-SLOWDOWN",),
    what="the speculative generator drops the draft it is given and silently decodes plainly",
)
def _spec_draft_dropped():
    real = speculative.generate

    def plain(target, prompt, new_tokens, draft=None, gamma=4, stop_at_eos=True):
        return real(target, prompt, new_tokens, None, gamma, stop_at_eos)

    with patched(speculative, "generate", plain):
        yield


@fault(
    "dist-temperature-after-softmax",
    section="DIST",
    kind=RULE,
    targets=("DIST-TEMPERATURE",),
    what="the temperature divides the probabilities after the softmax instead of the logits before it",
)
def _dist_temperature_after_softmax():
    import torch

    with patched(distill, "distribution", lambda logits, temperature=1.0: torch.softmax(logits.double(), dim=-1) / temperature):
        yield


@fault(
    "dist-hard-label",
    section="DIST",
    kind=RULE,
    targets=("DIST-MILK",),
    what="the teacher's label is its argmax token (one-hot), as when a distillation pipeline trains on the teacher's generated text instead of its distribution",
)
def _dist_hard_label():
    import torch

    def one_hot(logits, temperature=1.0):
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()

    with patched(distill, "distribution", one_hot):
        yield


# ------------------------------------------------------------------------------------------------
# 8. The budget
# ------------------------------------------------------------------------------------------------


@fault(
    "budget-reserve-ignored",
    section="BUD",
    kind=CONSTANT,
    targets=("BUD-13B-8GB", "BUD-16GB-INT8", "BUD-TABLES"),
    what="the budget forgets the memory reserved for activations and the runtime, so every configuration seems to hold more tokens",
)
def _budget_reserve_ignored():
    real = budget.budget

    def no_reserve(model: str, bits: float, memory_gib: float, reserve_gib: float = budget.RESERVE_GIB) -> budget.Budget:
        return real(model, bits, memory_gib, 0.0)

    with patched(budget, "budget", no_reserve):
        yield


def _with_shape(name: str, **change) -> dict:
    """The calculator's model table with one model's shape changed."""
    return {**budget.MODELS, name: dataclasses.replace(budget.MODELS[name], **change)}


@fault(
    "budget-7b-mha-heads",
    section="BUD",
    kind=CONSTANT,
    targets=("BUD-16GB-INT8", "BUD-13B-800KB"),
    what="the 7B's cache is sized with its 32 query heads, the multi-head formula applied to a grouped-query model (8 KV heads)",
)
def _budget_7b_mha():
    with patched(budget, "MODELS", _with_shape("7b", kv_heads=32)):
        yield


@fault(
    "budget-13b-gqa",
    section="BUD",
    kind=CONSTANT,
    targets=("BUD-13B-8GB", "BUD-16GB-INT8", "BUD-13B-800KB", "BUD-TABLES"),
    what="the 13B is given the 8 KV heads of the 7B and 70B rows (grouped-query attention) instead of its full multi-head attention with 40 heads",
)
def _budget_13b_gqa():
    with patched(budget, "MODELS", _with_shape("13b", kv_heads=8)):
        yield


@fault(
    "budget-decimal-gb",
    section="BUD",
    kind=CONSTANT,
    targets=("BUD-13B-8GB", "BUD-16GB-INT8", "BUD-TABLES"),
    what="the calculator counts memory, reserve and weights in decimal GB (1e9 bytes) where the chapter's budget is in binary GB (2**30 bytes)",
)
def _budget_decimal_gb():
    with patched(budget, "GIB", 10**9):
        yield
