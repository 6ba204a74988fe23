"""Section 1, the KV cache: bytes, greedy generation with and without the cache, and what a cache costs and saves.

Arithmetic here is exact integer arithmetic; measurements (timings, allocator peaks, cache
tensors) use a real transformers model, usually the twin. Shapes follow transformers:
``[B, H, S, D]`` = batch, heads, sequence, head dim. The multiply-accumulates are
:mod:`cheapinfer.chapter.kv_cache.kv_macs`, the chapter's listing run verbatim :mod:`cheapinfer.chapter.kv_cache.kv_listing`,
and the evidence that a cached loop used its cache :mod:`cheapinfer.chapter.kv_cache.kv_evidence`.

Usable without pytest, e.g.::

    import torch
    from cheapinfer.chapter import kv, kv_macs
    from cheapinfer.runtime import models
    from cheapinfer.runtime.arch import QWEN25_05B
    twin = models.twin("fp32")
    ids = torch.randint(0, 32_000, (1, 8))
    kv.greedy_cached(twin.model, ids, 16)                 # prefill, then one token per step
    kv_macs.macs_generate(QWEN25_05B, 48, cached=False)   # closed form, exact
"""

from __future__ import annotations

import math
import time
from typing import Callable, Mapping, Sequence

import torch

from ...runtime import accel, hf, premise, roofline, rounding
from ...runtime.accel import LivePeak, peak_above_resident, sync  # noqa: F401  (the memory claims' entry points; CUDA and CPU in accel)
from ...runtime.arch import QWEN25_05B, Arch
from ...runtime.timing import Marks, mark_name

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
    ``cache``: an empty transformers cache to fill (e.g. :func:`cheapinfer.chapter.batching.paging.paged_cache`);
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


def head_row_bound(head: Head) -> torch.Tensor:
    """First-order probable bound (float64, ``[1, d]``, on the head's device) of the fp32 error of the head's step-n output, by either path.

    The step in float64 with a zero perturbation after every operation, each with the squared
    bounds of the single roundings it stands for (u = 2^-24; m: the magnitude |x||W| a rounding is
    relative to): q, k, v, h = 896 products and sums each, 2h (u m)^2; each score, 2d + 2 roundings
    of u |q||k| / sqrt(d) (the dot product and the scale); each probability, the max-subtraction
    (u |s - max| P), exp (2 of u P) and the division (u P), and the normaliser's n sums, which scale
    every probability alike (n u^2); each output, 2n roundings of u sum_s P_s |v_s|. The bound of
    output j is LAMBDA sqrt(sum (d o_j / d site)^2 x its squares) (Hoeffding, as in
    cheapinfer.runtime.rounding). Both paths compute this function (the cache holds keys and values
    projected in another product shape), so they differ by at most twice it.
    """
    u = rounding.unit_roundoff(head.x.dtype)
    x, wq, wk, wv = (t.double().cpu() for t in (head.x, head.wq, head.wk, head.wv))
    n, h = x.shape
    zero = {name: torch.zeros(shape, dtype=torch.float64, requires_grad=True) for name, shape in
            (("q", (1, head.d)), ("k", (n, head.d)), ("v", (n, head.d)), ("s", (1, n)), ("p", (1, n)), ("z", (1, 1)), ("o", (1, head.d)))}
    with torch.enable_grad():
        q, k, v = x[-1:] @ wq + zero["q"], x @ wk + zero["k"], x @ wv + zero["v"]  # [1, d], [n, d], [n, d]
        s = (q @ k.T) / math.sqrt(head.d) + zero["s"]  # [1, n]
        p = (s.softmax(-1) + zero["p"]) * (1 + zero["z"])
        o = p @ v + zero["o"]  # [1, d]
        sd, pd = s.detach(), p.detach()
        squares = {
            "q": 2 * h * (u * (x[-1:].abs() @ wq.abs())) ** 2,
            "k": 2 * h * (u * (x.abs() @ wk.abs())) ** 2,
            "v": 2 * h * (u * (x.abs() @ wv.abs())) ** 2,
            "s": (2 * head.d + 2) * (u * (q.detach().abs() @ k.detach().abs().T) / math.sqrt(head.d)) ** 2,
            "p": (u * (sd - sd.max()).abs() * pd) ** 2 + 3 * (u * pd) ** 2,
            "z": torch.full((1, 1), n * u**2, dtype=torch.float64),
            "o": 2 * n * (u * (pd @ v.detach().abs())) ** 2,
        }
        eye = torch.eye(head.d, dtype=torch.float64)[:, None, :]  # [d, 1, d]: one backward per output, batched
        grads = torch.autograd.grad(o, list(zero.values()), grad_outputs=eye, is_grads_batched=True)  # each [d, *site]
    total = sum((g**2 * squares[name]).flatten(1).sum(1) for g, name in zip(grads, zero))  # [d]
    return (rounding.LAMBDA * total.sqrt()[None, :]).to(head.x.device)  # beside the outputs it bounds


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


def flat_ratio(times: Mapping[str, float], contexts: Sequence[int]) -> dict[str, float]:
    """KV-DECODE-FLAT's quantity from one set of decode-step times (``C=<context>``): the step at the longest context
    over the step at the shortest. A longer context does all the shorter one's work and more, so it is at least 1."""
    return {"step_ratio": times[f"C={contexts[-1]}"] / times[f"C={contexts[0]}"]}


def decode_step(model, cache, context: int) -> Callable[[], object]:
    """One decode step at ``context`` cached tokens, repeatable: the step's new entry is cropped off again."""
    one = torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device)

    def step():
        cached_forward(model, one, cache)
        hf.crop(cache, context)  # drop the step's entry

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


def step_after_prefill(model, ids: torch.Tensor) -> Callable[[], object]:
    """One repeatable cached decode step after a prefill of ``ids`` [1, P] (:func:`decode_step` at context P)."""
    with torch.inference_mode():
        cache = returned_cache(model(ids, use_cache=True))
    return decode_step(model, cache, ids.shape[1])


def prefill(model, ids: torch.Tensor) -> Callable[[], object]:
    """The prompt's forward pass that fills the cache and yields the first token (time to first token)."""
    return lambda: model(ids, use_cache=True)


#: A prompt sized on CUDA keeps its logits (one row of the vocabulary per position, as a plain forward makes them) within
#: this share of the memory the device has free, leaving the rest to the activations, the cache and the other lengths.
LOGITS_SHARE_OF_FREE = 0.25


def sized_prompt(model, device: torch.device | str, cpu: int, start: int, reserve: int = 0, span: int = 1,
                 timer: premise.Timer | None = None, free_bytes: int | None = None) -> premise.Sized:
    """The prompt length of a clocked claim. On a CPU ``cpu``, as before (nothing is measured). On CUDA (or with a
    ``timer``, a test's simulated device) it is sized from the launch floor (:func:`premise.sized_length`): the floor
    is the host's enqueue time of one decode step after an 8-token prefill, each candidate's step the prefill of that
    many tokens (one forward over them, as an uncached step is), from ``start`` doubling. At most the model's context
    (``max_position_embeddings``) less the ``reserve`` tokens the claim generates after it, and the length whose logits
    fill :data:`LOGITS_SHARE_OF_FREE` of ``free_bytes`` (default: what the device has free), each over ``span``
    (the claim runs lengths up to ``span`` times the one sized here)."""
    if timer is None and torch.device(device).type != "cuda":
        return premise.Sized(cpu, 0.0, 0.0, False, f"{cpu} tokens on {device}: the host runs the step itself, with no launch floor to clear")
    p = next(model.parameters())
    free = accel.available_memory(device) if free_bytes is None else free_bytes
    by_memory = int(LOGITS_SHARE_OF_FREE * free) // (model.config.vocab_size * p.element_size())
    top = min(model.config.max_position_embeddings - reserve, by_memory) // span
    ids = torch.randint(0, min(32_000, model.config.vocab_size), (1, max(top, 8)), generator=torch.Generator().manual_seed(0)).to(p.device)
    floor = premise.launch_floor(step_after_prefill(model, ids[:, :8]), device, timer=timer)
    return premise.sized_length(lambda n: prefill(model, ids[:, :n]), device, floor, start, top, timer=timer)


def parameter_bytes(model) -> int:
    """Bytes of every distinct parameter (a tied embedding counted once): what the model holds in memory. What a
    decode step reads of them is :func:`cheapinfer.runtime.roofline.streamed_bytes` (one row of an untied embedding)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def decode_bytes(model, batch: int, context: int) -> int:
    """What one decode step must stream at least: the weights it reads (:func:`cheapinfer.runtime.roofline.streamed_bytes`)
    and ``batch`` caches of ``context`` tokens.

    The new token's keys and values (written, one token per request) and the activations are lower order.
    """
    config, p = model.config, next(model.parameters())
    per_token = kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, config_head_dim(config), p.element_size())
    return roofline.streamed_bytes(model) + batch * context * per_token
