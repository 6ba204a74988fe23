"""Section 1, the KV cache: evidence that a step which claims to use the cache did, read from the model's
forwards (forward hooks) from outside the code under test.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ...runtime import hf
from ...runtime.evidence import alone_logits, relative_change
from . import kv

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
    generate = generate or kv.greedy_cached
    with hf.ForwardTrace(model, keep_logits=new_tokens) as trace:
        generate(model, ids, new_tokens)
    first = trace.forwards[0] if trace.forwards else {"cache_out": 0}
    return cache_evidence(model, trace.forwards[1:], first["cache_out"])


def decode_step_evidence(model, cache, context: int) -> dict[str, object]:
    """Run :func:`decode_step` once under a trace (the same step the timings repeat)."""
    step = kv.decode_step(model, cache, context)
    with hf.ForwardTrace(model) as trace:
        step()
    return cache_evidence(model, trace.forwards, context)


# ------------------------------------------------------------------------------------------------
# the prompts the cache claims run, and what they hand to verify
# ------------------------------------------------------------------------------------------------

TEXT_PROMPTS = (  # (prompt, new tokens) for profiles with a tokenizer
    ("The capital of France is", 16),
    ("def fibonacci(n):", 12),
    ("Once upon a time, in a small village by the sea,", 8),
)
TWIN_PROMPTS = ((5, 8), (17, 12))  # (prompt length, new tokens): random token ids, seeded


def random_ids(n: int, device, vocab: int = 32_000, batch: int = 1) -> torch.Tensor:
    """``[batch, n]`` token ids drawn from torch's global generator (seeded by the suite)."""
    return torch.randint(0, vocab, (batch, n), device=device)


def prompts(profile) -> Sequence[tuple[str, torch.Tensor, int]]:
    """(name, ids [1, P], new tokens): text prompts where the profile has a tokenizer, seeded random ids elsewhere."""
    if profile.tokenizer is None:
        return [(f"{n} random ids", random_ids(n, profile.device), new) for n, new in TWIN_PROMPTS]
    return [(repr(text), profile.tokenizer(text, return_tensors="pt").input_ids.to(profile.device), new) for text, new in TEXT_PROMPTS]


def cache_use(evidence: dict) -> dict:
    """The measured values every claim that relies on a cache hands to verify."""
    return {"cache_grows_by_one": evidence["cache_grows_by_one"], "logit_change_vs_no_context": evidence["logit_change_vs_no_context"]}


def describe(evidence: dict) -> str:
    """One line for the report: what the traced forwards showed."""
    return (f"cache grows by one per step: {evidence['cache_grows_by_one']}; smallest relative logit change against a cache-less "
            f"forward of the token alone: {evidence['logit_change_vs_no_context']:.3g}")
