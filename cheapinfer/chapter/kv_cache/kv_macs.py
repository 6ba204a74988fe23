"""Section 1, the KV cache: the multiply-accumulates of generation with and without the cache, in closed
form and counted on a model's forwards.
"""

from __future__ import annotations

from typing import Callable

import torch

from ...runtime import hf
from ...runtime.arch import QWEN25_05B, Arch, qwen2_config
from . import kv

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
        past = kv.returned_cache(model(torch.zeros((1, t - 1), dtype=torch.long, device=dev), use_cache=True)) if t > 1 else None
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
                past = kv.returned_cache(out)
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
# the models the counts run on
# ------------------------------------------------------------------------------------------------


def tiny_arch(layers: int = 2, heads: int = 4, kv_heads: int = 2, head_dim: int = 16) -> Arch:
    """A small Qwen2 for counting and for the cache-shape property test: the real code path, small enough for
    fp16 on a CPU (which has no fast fp16 matmul)."""
    return Arch("tiny-qwen2", layers, 64, heads, kv_heads, head_dim, 64, 256, True, True, 10_000.0, 1e-6, 4096)


def tiny_model(arch: Arch, dtype: torch.dtype = torch.float32):
    """A seeded-at-random Qwen2 of ``arch`` (eager attention), on the CPU, in ``dtype``."""
    config = qwen2_config(arch, head_dim=arch.head_dim, bos_token_id=0, eos_token_id=1, attn_implementation="eager")
    return hf.from_config(config).to(dtype)


def twin_on_meta(dtype: torch.dtype = torch.float16, **overrides):
    """The twin's architecture (``overrides``: config fields changed) on the meta device: every op runs with real
    shapes and dtypes, none with data."""
    return meta_model(qwen2_config(QWEN25_05B, **overrides)).to(dtype)
