"""Section 1, the KV cache: the chapter's listing run exactly as printed, its warnings and the API it names.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings

import torch

from ...runtime import hf
from . import kv


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
    from ...runtime.rounding import compare_greedy

    return compare_greedy(model, ids[0], reference[0], got[0]).agree


@torch.inference_mode()
def listing_api(model, ids: torch.Tensor, new_tokens: int) -> dict[str, object]:
    """The chapter's listing on the installed transformers: does it run and continue the sequence exactly,
    and under which names does this transformers take and return the cache without a deprecation?

    Each spelling is tried on its own, so each deprecation is attributed to the name that raised it.
    The replacement (the names the messages point to) is then run as the listing and must continue
    the sequence exactly, without a deprecation message.
    """
    reference = kv.greedy_uncached(model, ids, new_tokens)
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
