"""Section 1, the KV cache: evidence that a step which claims to use the cache did, read from the model's
forwards (forward hooks) from outside the code under test.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..runtime import hf
from ..runtime.evidence import alone_logits, relative_change
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
