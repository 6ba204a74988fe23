"""Section 1, the KV cache: bytes, multiply-accumulates, and what a cache costs and saves.

Arithmetic here is exact integer arithmetic; measurements (timings, allocator peaks, cache
tensors) use a real transformers model, usually the twin. Shapes follow transformers:
``[B, H, S, D]`` = batch, heads, sequence, head dim.

Usable without pytest, e.g.::

    import torch
    from cheapinfer.chapter import kv
    from cheapinfer.runtime import models
    from cheapinfer.runtime.arch import QWEN25_05B
    twin = models.twin("fp32")
    ids = torch.randint(0, 32_000, (1, 8))
    kv.greedy_cached(twin.model, ids, 16)             # prefill, then one token per step
    kv.macs_generate(QWEN25_05B, 48, cached=False)    # closed form, exact
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
import warnings
from typing import Callable, Mapping, Sequence

import torch

from ..runtime import hf
from ..runtime.arch import QWEN25_05B, Arch
from ..runtime.accel import LivePeak, peak_above_resident, sync  # noqa: F401  (the memory claims' entry points; CUDA and CPU in accel)
from ..runtime.timing import Marks, mark_name
from ..runtime.evidence import alone_logits, relative_change

GIB = 2**30

# ------------------------------------------------------------------------------------------------
# bytes
# ------------------------------------------------------------------------------------------------


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
    """Keys and values for one token across all layers: 2 x layers x kv_heads x head_dim x bytes."""
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def arch_kv_bytes_per_token(arch: Arch = QWEN25_05B, bytes_per_element: int = 2, kv_heads: int | None = None) -> int:
    return kv_bytes_per_token(arch.layers, arch.kv_heads if kv_heads is None else kv_heads, arch.head_dim, bytes_per_element)


def cache_bytes(batch: int, tokens: int, arch: Arch = QWEN25_05B, bytes_per_element: int = 2) -> int:
    """Resident cache of ``batch`` sequences of ``tokens`` each: depends only on batch x tokens."""
    return batch * tokens * arch_kv_bytes_per_token(arch, bytes_per_element)


def weight_bytes(parameters: int, bytes_per_element: int = 2) -> int:
    return parameters * bytes_per_element


def scores_bytes(rows: int, n: int, bytes_per_element: int = 4) -> int:
    """One head's attention scores for ``rows`` queries over ``n`` keys: recompute rows = n, cached rows = 1."""
    return rows * n * bytes_per_element


def dynamic_cache_tensors(cache) -> list[torch.Tensor]:
    """Every key and value tensor a transformers cache holds, layer by layer."""
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return [t for pair in cache for t in pair[:2]]  # legacy tuple of (k, v) per layer


def dynamic_cache_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for t in dynamic_cache_tensors(cache))


# ------------------------------------------------------------------------------------------------
# multiply-accumulates
# ------------------------------------------------------------------------------------------------
# Counted: the multiply-accumulates of matrix products (the seven projections of every layer, the
# attention scores Q K^T and the weighted sum P V of every head, the LM head). Elementwise work
# (norms, RoPE, softmax, SiLU, bias adds) is lower order and not counted, by the closed form or by
# the counter. Cold start: a one-token prompt; step t (t = 1..T) sees t tokens of context and
# emits one token. The uncached step is a plain forward over all t tokens with logits for every
# position, as the chapter's naive loop does; eager attention computes the full t x t scores.


def weight_macs_per_token(arch: Arch = QWEN25_05B) -> int:
    """W: every projection of every layer, plus the LM head (vocab x hidden)."""
    per_layer = sum(o * i for o, i in arch.projection_shapes().values())
    return arch.layers * per_layer + arch.vocab * arch.hidden


def attention_macs_per_pair(arch: Arch = QWEN25_05B) -> int:
    """A: one query attending to one key, every head of every layer: Q.K and the V-weighted sum."""
    return 2 * arch.layers * arch.heads * arch.head_dim


def macs_step(arch: Arch, t: int, cached: bool) -> int:
    """Step t of generation. Cached: one new token over t keys, W + A t. Uncached: t tokens, t W + A t^2."""
    w, a = weight_macs_per_token(arch), attention_macs_per_pair(arch)
    return w + a * t if cached else t * w + a * t * t


def macs_generate(arch: Arch, tokens: int, cached: bool) -> int:
    """Total for T tokens from a cold start. Cached: T W + A T(T+1)/2 = O(T^2); uncached:
    W T(T+1)/2 + A T(T+1)(2T+1)/6 = O(T^3)."""
    w, a, n = weight_macs_per_token(arch), attention_macs_per_pair(arch), tokens
    if cached:
        return n * w + a * n * (n + 1) // 2
    return w * n * (n + 1) // 2 + a * n * (n + 1) * (2 * n + 1) // 6


def meta_model(config):
    """A transformers causal LM on the meta device: real shapes and ops, no memory, no arithmetic (:func:`hf.meta_model`)."""
    return hf.meta_model(config)


def counted_macs(fn: Callable[[], object]) -> int:
    """Multiply-accumulates of every matrix product ``fn`` dispatches, counted op by op (FLOPs / 2)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        fn()
    return counter.get_total_flops() // 2


def counted_step_macs(model, t: int, cached: bool) -> int:
    """Run step t for real (on ``model``'s device, meta works) and count its multiply-accumulates."""
    dev = next(model.parameters()).device
    if not cached:  # a fresh, discarded cache: writing it is no matrix product, and on meta it skips a data-dependent mask check
        return counted_macs(lambda: model(torch.zeros((1, t), dtype=torch.long, device=dev), use_cache=True))
    with torch.inference_mode():
        past = returned_cache(model(torch.zeros((1, t - 1), dtype=torch.long, device=dev), use_cache=True)) if t > 1 else None
    one = torch.zeros((1, 1), dtype=torch.long, device=dev)
    return counted_macs(lambda: hf.forward(model, one, cache=past, use_cache=True))


def counted_generate_macs(model, tokens: int, cached: bool) -> int:
    """Walk a whole cold-start generation of ``tokens`` steps and count every step's multiply-accumulates."""
    dev = next(model.parameters()).device

    def run():
        ids = torch.zeros((1, 1), dtype=torch.long, device=dev)
        past = None
        for t in range(1, tokens + 1):
            if cached:
                out = hf.forward(model, ids[:, -1:] if past is not None else ids, cache=past, use_cache=True)
                past = returned_cache(out)
            else:  # a fresh cache each step, discarded: the plain forward over all t tokens
                model(ids, use_cache=True)
            ids = torch.zeros((1, t + 1), dtype=torch.long, device=dev)

    return counted_macs(run)


def polynomial_degree(values: list[int]) -> int:
    """Exact degree of the polynomial through integer ``values`` at equally spaced points: the order of
    the last finite difference that is not all zero (-1 for all zeros). Needs degree + 2 points to
    tell; with too few points it returns len(values) - 1 (the most they can show)."""
    diffs, degree = list(values), -1
    for order in range(len(values)):
        if any(diffs):
            degree = order
        diffs = [b - a for a, b in zip(diffs, diffs[1:])]
    return degree


def counted_degrees(model, arch: Arch, tiny_model, tiny_arch: Arch, steps_at: tuple[int, ...] = (8, 16, 24, 32, 40), totals_at: tuple[int, ...] = (1, 2, 3, 4, 5, 6)) -> dict[str, object]:
    """Degrees in t and T of counted MACs: one step at ``steps_at`` tokens on ``model`` of architecture
    ``arch`` (meta works), whole cold-start generations of ``totals_at`` tokens walked on ``tiny_model``;
    each count beside the closed form (:func:`macs_step`, :func:`macs_generate`)."""
    out: dict[str, object] = {"rows": []}
    matches = True
    for cached in (True, False):
        kind = "cached" if cached else "uncached"
        steps = [counted_step_macs(model, t, cached) for t in steps_at]
        totals = [counted_generate_macs(tiny_model, n, cached) for n in totals_at]
        closed_steps = [macs_step(arch, t, cached) for t in steps_at]
        closed_totals = [macs_generate(tiny_arch, n, cached) for n in totals_at]
        matches &= steps == closed_steps and totals == closed_totals
        out[f"{kind}_step_degree"] = polynomial_degree(steps)
        out[f"{kind}_total_degree"] = polynomial_degree(totals)
        out["rows"] += [[kind, "step", t, c, f] for t, c, f in zip(steps_at, steps, closed_steps)]
        out["rows"] += [[kind, "generation", n, c, f] for n, c, f in zip(totals_at, totals, closed_totals)]
    out["closed_form_matches_count"] = matches
    return out


# ------------------------------------------------------------------------------------------------
# greedy generation, with and without the cache
# ------------------------------------------------------------------------------------------------


def cached_forward(model, new_ids: torch.Tensor, past):
    """One decode forward: the new token(s) [B, 1] against the cache ``past``, which it extends in place."""
    return hf.forward(model, new_ids, cache=past, use_cache=True)


def returned_cache(out):
    """The cache a forward returned (:func:`hf.output_cache`)."""
    return hf.output_cache(out)


@torch.inference_mode()
def greedy_cached(model, ids: torch.Tensor, new_tokens: int, on_step: Callable[[int], None] | None = None, cache=None) -> torch.Tensor:
    """Prefill ``ids`` [1, P], then one token per step from the cache. Returns the new tokens [1, new_tokens].

    ``on_step(k)`` is called after token k (1-based) is chosen, e.g. to read a clock. Only the cache
    and the last token are held between steps (the logits are dropped), as a serving loop would.
    ``cache``: an empty transformers cache to fill (e.g. :func:`cheapinfer.chapter.paging.paged_cache`);
    default: the model's own.
    """
    out = hf.forward(model, ids, cache=cache, use_cache=True)
    past, nxt = returned_cache(out), out.logits[:, -1:].argmax(-1)  # nxt: [1, 1]
    del out
    tokens = [nxt]
    if on_step:
        on_step(1)
    for k in range(2, new_tokens + 1):
        out = cached_forward(model, nxt, past)
        past, nxt = returned_cache(out), out.logits[:, -1:].argmax(-1)
        del out
        tokens.append(nxt)
        if on_step:
            on_step(k)
    return torch.cat(tokens, dim=1)


def uncached_next(model, seq: torch.Tensor) -> torch.Tensor:
    """One step of full recomputation: a plain forward over the whole sequence [1, t], no cache; the next token [1, 1]."""
    return model(seq, use_cache=False).logits[:, -1:].argmax(-1)  # the [1, t, vocab] logits die here


@torch.inference_mode()
def greedy_uncached(model, ids: torch.Tensor, new_tokens: int, on_step: Callable[[int], None] | None = None) -> torch.Tensor:
    """Full recomputation: every step runs the model over the whole sequence so far, no cache."""
    seq = ids
    for k in range(1, new_tokens + 1):
        nxt = uncached_next(model, seq)
        seq = torch.cat([seq, nxt], dim=1)
        if on_step:
            on_step(k)
    return seq[:, ids.shape[1]:]


@torch.inference_mode()
def listing_continuation(model, ids: torch.Tensor, new_tokens: int, argument: str = "past_key_values",
                         attribute: str = "past_key_values") -> torch.Tensor:
    """The chapter's listing, spelled as the chapter spells it (or with the cache's ``argument`` and
    output ``attribute`` respelled)::

        out = model(prompt_ids, use_cache=True)
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(n - 1):
            out = model(nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    """
    out = model(ids, use_cache=True)
    past = getattr(out, attribute)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    tokens = [nxt]
    for _ in range(new_tokens - 1):
        out = model(nxt, **{argument: past}, use_cache=True)
        past = getattr(out, attribute)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(nxt)
    return torch.cat(tokens, dim=1)


@contextlib.contextmanager
def transformers_log(records: list[str]):
    """Collect what transformers logs at WARNING while the block runs (its deprecations go through
    ``logger.warning_once``, not the warnings module; the once-cache is cleared so they show again)."""
    from transformers.utils import logging as hf_logging

    root = hf_logging.get_logger("transformers")
    once = getattr(logging.Logger, "warning_once", None)
    if once is not None and hasattr(once, "cache_clear"):
        once.cache_clear()

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage().splitlines()[0])

    handler = _Keep(logging.WARNING)
    root.addHandler(handler)
    try:
        yield records
    finally:
        root.removeHandler(handler)


_REPLACEMENT = re.compile(r"[Uu]se `(\w+)` instead")


@contextlib.contextmanager
def deprecations(records: list[str]):
    """Collect the deprecation messages met in the block: transformers' logged ones (``logger.warning_once``)
    and Python's DeprecationWarning / FutureWarning."""
    logged: list[str] = []
    with transformers_log(logged), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield records
    kinds = (DeprecationWarning, FutureWarning, PendingDeprecationWarning)
    records += [m for m in logged if "deprecat" in m.lower()]
    records += [f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught if issubclass(w.category, kinds)]


def _current_name(old: str, messages: list[str]) -> str:
    """``old`` when no message deprecates it, else the name the message says to use instead."""
    hits = [m for m in messages if old in m]
    if not hits:
        return old
    named = [m.group(1) for h in hits for m in [_REPLACEMENT.search(h)] if m]
    return named[0] if named else f"{old} (deprecated, no replacement named)"


def _continues(model, ids: torch.Tensor, reference: torch.Tensor, got: torch.Tensor) -> bool:
    """``got`` continues ``ids`` as full recomputation (``reference``) does: token for token, up to a near-tie
    of the two paths' rounding (:func:`cheapinfer.runtime.rounding.compare_greedy`)."""
    from ..runtime.rounding import compare_greedy

    return compare_greedy(model, ids[0], reference[0], got[0]).agree


@torch.inference_mode()
def listing_api(model, ids: torch.Tensor, new_tokens: int) -> dict[str, object]:
    """The chapter's listing on the installed transformers: does it run and continue the sequence exactly,
    and under which names does this transformers take and return the cache without a deprecation?

    Each spelling is tried on its own, so each deprecation is attributed to the name that raised it.
    The replacement (the names the messages point to) is then run as the listing and must continue
    the sequence exactly, without a deprecation message.
    """
    reference = greedy_uncached(model, ids, new_tokens)
    out: dict[str, object] = {"messages": []}
    try:
        with deprecations(out["messages"]):
            listing = listing_continuation(model, ids, new_tokens)
        out["runs"] = _continues(model, ids, reference, listing)
    except (TypeError, AttributeError, ValueError, KeyError) as exc:
        out["runs"], out["error"] = False, f"{type(exc).__name__}: {exc}"
    first = model(ids, use_cache=True)
    attribute_msgs: list[str] = []
    with deprecations(attribute_msgs):
        getattr(first, "past_key_values", None)
    argument_msgs: list[str] = []
    nxt = first.logits[:, -1:].argmax(-1)
    with deprecations(argument_msgs):
        model(nxt, past_key_values=hf.output_cache(first), use_cache=True)  # the listing's spelling, on purpose
    out["cache_attribute"] = _current_name("past_key_values", attribute_msgs)
    out["cache_argument"] = _current_name("past_key_values", argument_msgs)
    replacement_msgs: list[str] = []
    try:
        with deprecations(replacement_msgs):
            respelled = listing_continuation(model, ids, new_tokens, argument=out["cache_argument"], attribute=out["cache_attribute"])
        out["replacement_runs"] = _continues(model, ids, reference, respelled) and not replacement_msgs
    except (TypeError, AttributeError, ValueError, KeyError) as exc:
        out["replacement_runs"], out["replacement_error"] = False, f"{type(exc).__name__}: {exc}"
    out["messages"] = sorted(set(out["messages"] + attribute_msgs + argument_msgs + replacement_msgs))
    return out


# ------------------------------------------------------------------------------------------------
# timing helpers: callables for cheapinfer.runtime.timing.interleaved
# ------------------------------------------------------------------------------------------------


class Head:
    """One attention head, d = 64, fed by the model width: the unit of KV-SCORES-BYTES and KV-HEAD-TIMING."""

    def __init__(self, n: int, hidden: int = QWEN25_05B.hidden, head_dim: int = QWEN25_05B.head_dim,
                 device: torch.device | str = "cpu", seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.n, self.d = n, head_dim
        self.wq, self.wk, self.wv = (torch.randn(hidden, head_dim, generator=g).div_(hidden**0.5).to(device) for _ in range(3))
        self.x = torch.randn(n, hidden, generator=g).to(device)  # [n, hidden]: the n tokens' inputs
        # the cache after n - 1 tokens: [n-1, d] keys and values
        self.k_cache = self.x[:-1] @ self.wk
        self.v_cache = self.x[:-1] @ self.wv

    def recompute(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Step n without a cache: project all n tokens, n x n scores, causal softmax, weighted sum."""
        q, k, v = self.x @ self.wq, self.x @ self.wk, self.x @ self.wv  # [n, d] each
        scores = (q @ k.T) / math.sqrt(self.d)  # [n, n] fp32
        mask = torch.ones(self.n, self.n, dtype=torch.bool, device=scores.device).triu_(1)
        out = scores.masked_fill_(mask, float("-inf")).softmax(-1) @ v
        return out[-1:], scores

    def cached(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Step n with the cache: project the new token, append its k and v, 1 x n scores."""
        x = self.x[-1:]  # [1, hidden]
        k = torch.cat([self.k_cache, x @ self.wk])  # [n, d]
        v = torch.cat([self.v_cache, x @ self.wv])
        scores = ((x @ self.wq) @ k.T) / math.sqrt(self.d)  # [1, n] fp32
        return scores.softmax(-1) @ v, scores


def config_head_dim(config) -> int:
    """Head dimension of a transformers config (``head_dim``, or hidden / heads where it is not given)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def random_cache(config, context: int, dtype: torch.dtype, device: torch.device | str, seed: int = 0, batch: int = 1):
    """A DynamicCache holding ``context`` tokens of random keys and values for every layer and each of ``batch`` requests.

    A decode step's cost does not depend on the cached values, only on their number; this builds a
    long context without paying for its prefill.
    """
    g = torch.Generator().manual_seed(seed)
    heads, head_dim = config.num_key_value_heads, config_head_dim(config)
    cache = hf.new_cache(config)
    for layer in range(config.num_hidden_layers):
        k, v = (torch.randn(batch, heads, context, head_dim, generator=g).to(device=device, dtype=dtype) for _ in range(2))  # [B, H, S, D]
        cache.update(k, v, layer)
    return cache


def decode_step(model, cache, context: int) -> Callable[[], object]:
    """One decode step at ``context`` cached tokens, repeatable: the step's new entry is cropped off again."""
    one = torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device)

    def step():
        cached_forward(model, one, cache)
        cache.crop(context - cache.get_seq_length())  # negative: drop the step's entry (both old and new transformers)

    return step


def marked_generation(generate: Callable, model, ids: torch.Tensor, new_tokens: int, marks: Sequence[int],
                      device: torch.device | str) -> Callable[[], Marks]:
    """``generate(model, ids, new_tokens, on_step)`` (:func:`greedy_cached`, :func:`greedy_uncached`) as a repeatable
    timed variant: each call returns the seconds from its start to token k, for every k in ``marks``, read after a
    device sync (:class:`cheapinfer.runtime.timing.Marks`; :func:`cheapinfer.runtime.timing.interleaved` keeps each as a series)."""

    def go() -> Marks:
        t0, out = time.perf_counter(), Marks()

        def on_step(k: int) -> None:
            if k in marks:
                sync(device)
                out[k] = time.perf_counter() - t0

        generate(model, ids, new_tokens, on_step)
        return out

    return go


# ------------------------------------------------------------------------------------------------
# clocked quantities: functions of one set of times (variant -> seconds) for cheapinfer.runtime.timing.estimates,
# which reads each from the variants' medians (its value) and round by round (its noise)
# ------------------------------------------------------------------------------------------------


def speedup_at(times: Mapping[str, float], tokens: int) -> float:
    """Uncached over cached time to token ``tokens`` of the same generations (the ``uncached@k`` and ``cached@k`` marks)."""
    return times[mark_name("uncached", tokens)] / times[mark_name("cached", tokens)]


def speedup_quantities(times: Mapping[str, float], short: int = 12, long: int = 48) -> dict[str, float]:
    """KV-SPEEDUP-48's clocked quantities: the speedup at ``long`` tokens, and its growth from ``short`` to ``long``
    tokens, speedup(long) / speedup(short), both read from the marks of the same ``long``-token generations."""
    speedup = speedup_at(times, long)
    return {"speedup": speedup, "speedup_growth": speedup / speedup_at(times, short)}


def prefill_growth(seconds: Sequence[float]) -> dict[str, float]:
    """KV-PREFILL-GROWS's clocked quantities from prefill times at increasing prompt lengths:

    ``growth``: the last over the first. ``worst_drop``: the largest relative decrease between consecutive lengths,
    max over pairs of 1 - t(next) / t(this); negative where every step grew (-0.27: the smallest step grew by 27%),
    so its margin to a bound is seen in full (a drop clipped at 0 would sit at 0 in most rounds, a spread of none).
    Read from one round's times it is that round's worst pair: the noise of a max over pairs measured side by side.
    """
    if len(seconds) < 2:
        raise ValueError("prefill_growth needs times at two prompt lengths or more")
    return {"growth": seconds[-1] / seconds[0], "worst_drop": max(1 - b / a for a, b in zip(seconds, seconds[1:]))}


# ------------------------------------------------------------------------------------------------
# evidence that a step which claims to use the cache did
# ------------------------------------------------------------------------------------------------
# A decode step that silently drops its cache still runs, and runs fast: timing alone cannot tell.
# These read the model's forwards from outside the code under test (forward hooks), so they see what
# was actually fed: how many tokens, how long the cache handed in was, how long the cache handed
# back is, and the logits, which are compared with a cache-less forward of the same token alone.


@torch.inference_mode()
def cache_evidence(model, decode: list[dict], context: int) -> dict[str, object]:
    """What the traced decode forwards show about the cache, starting from ``context`` cached tokens.

    ``cache_grows_by_one``: every decode forward was fed one token against a non-empty cache of the
    length the previous step left, and handed back that cache one token longer.
    ``logit_change_vs_no_context``: the smallest, over the steps, of max|logits - logits alone| /
    max|logits alone|, where "alone" is a cache-less forward of the step's token by itself. A step
    that ignores its cache computes exactly the "alone" forward: 0.
    """
    grows, expected, gaps = bool(decode), context, []
    for rec in decode:
        grows &= rec["tokens_in"] == 1 and rec["cache_in"] == expected and expected > 0 and rec["cache_out"] == expected + 1
        expected = rec["cache_out"]
        if "logits" in rec:
            gaps.append(float(relative_change(rec["logits"], alone_logits(model, rec["ids"])).max()))
    return {"cache_grows_by_one": grows, "logit_change_vs_no_context": min(gaps) if gaps else float("nan"), "decode_steps_traced": len(decode)}


def generation_evidence(model, ids: torch.Tensor, new_tokens: int, generate: Callable | None = None) -> dict[str, object]:
    """Run ``generate`` (default :func:`greedy_cached`, looked up at call time) for ``new_tokens`` under a
    trace; the prefill is the first forward, every later one a decode step (:func:`cache_evidence`)."""
    generate = generate or greedy_cached
    with hf.ForwardTrace(model, keep_logits=new_tokens) as trace:
        generate(model, ids, new_tokens)
    first = trace.forwards[0] if trace.forwards else {"cache_out": 0}
    return cache_evidence(model, trace.forwards[1:], first["cache_out"])


def decode_step_evidence(model, cache, context: int) -> dict[str, object]:
    """Run :func:`decode_step` once under a trace (the same step the timings repeat)."""
    step = decode_step(model, cache, context)
    with hf.ForwardTrace(model) as trace:
        step()
    return cache_evidence(model, trace.forwards, context)


def prefill(model, ids: torch.Tensor) -> Callable[[], object]:
    """The prompt's forward pass that fills the cache and yields the first token (time to first token)."""
    return lambda: model(ids, use_cache=True)


def parameter_bytes(model) -> int:
    """Bytes of every distinct parameter (tied embedding counted once): what a decode step streams."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def decode_bytes(model, batch: int, context: int) -> int:
    """What one decode step must stream at least: every weight once and ``batch`` caches of ``context`` tokens.

    The new token's keys and values (written, one token per request) and the activations are lower order.
    """
    config, p = model.config, next(model.parameters())
    per_token = kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, config_head_dim(config), p.element_size())
    return parameter_bytes(model) + batch * context * per_token


def decode_efficiency(step_bytes: int, step_seconds: float, copy_bytes_per_second: float) -> float:
    """Bytes a decode step streams per second over the device's measured copy bandwidth (1.0: the step runs at the bus's speed)."""
    return step_bytes / step_seconds / copy_bytes_per_second


def last_step_peak(generate: Callable, model, ids: torch.Tensor, new_tokens: int, device: torch.device | str) -> int:
    """Peak bytes of the last step of ``generate(model, ids, new_tokens, on_step)`` above what was live
    when it began (the earlier steps' tensors that are still held count as resident). CPU only
    (:class:`LivePeak`); the step boundary is ``on_step(new_tokens - 1)``."""
    if torch.device(device).type == "cuda":
        raise ValueError("last_step_peak reads live tensor bytes; on CUDA time whole generations with peak_above_resident")
    base = {}

    with LivePeak() as tracker:
        def on_step(k: int) -> None:
            if k == new_tokens - 1:
                base["live"] = tracker.restart()

        generate(model, ids, new_tokens, on_step)
    return tracker.peak - base.get("live", 0)
