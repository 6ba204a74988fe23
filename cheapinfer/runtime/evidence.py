"""Evidence that a measured loop used its KV cache, read from the model's forwards.

A loop that silently drops its cache still runs, and often runs fast: a decode step then sees only
its own token. Its timings, tokens per second and batch curves look like a measurement of a cached
loop, and a claim built on them stays green. Every loop that claims to use a cache therefore runs
(at least once, outside its clock) under :class:`cheapinfer.runtime.hf.ForwardTrace`, and this module turns
what the trace saw into measured conditions for the claim's verdict:

- ``cache_grows_by_fed``: every forward was handed a cache object (under either keyword), at least
  one of them held a history, and every one returned it holding exactly the tokens it held before
  plus the positions fed. A loop that drops its cache hands none over; a cache handed over under a
  name the model does not know is swallowed, and the model returns a fresh cache holding only the
  positions fed. The counts behind it are reported: ``forwards_traced``, ``forwards_without_cache``
  (handed none), ``forwards_with_history`` (handed a non-empty one).
- ``logit_change_vs_no_context``: over the traced forwards that were handed a non-empty cache, the
  smallest of max|logits - logits alone| / max|logits alone| (per forward, the largest over its
  batch rows), where "alone" is a cache-less forward of the same ids by themselves. A forward that
  ignores its history computes exactly that (0); attending to a cached context changes every
  layer's attention output (O(1)). Rows with no history of their own (a request admitted this
  step) compute "alone" legitimately, hence the largest over rows.

- ``fresh_row_change_vs_no_context``: the other side of the same comparison, for a batch that admits a
  request beside other requests' histories (a scheduler refilling a freed row): over the traced forwards'
  fresh rows (fed one token at position 0 while the cache holds other rows' histories), the largest
  relative change against a cache-less forward of the row's token alone. A fresh row may attend only
  to its own token, so it computes exactly that forward, up to rounding; a row that still sees a
  previous occupant's cache columns (its mask not reset) changes O(1). NaN where no fresh row was
  traced. ``fresh_rows_traced`` counts the rows behind it.

- ``history_tokens``: ``[fewest, most]`` tokens of history held by the traced forwards that were handed a
  non-empty cache (``[]`` where none was). A claim that names its context (a 64-token cache per request, a
  verification pass after 128 tokens) asserts both ends equal it: a cache built shorter than asked, or a
  repeatable step that forgets to crop what it fed, still grows by the positions fed and still attends, but to
  another history than the claim's.

``logit_change_vs_no_context`` is checked against 0.01 in the registry: above the rounding of two
half-precision forwards of the same tokens (~4e-3 relative), far below an O(1) change.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterable, Mapping

import torch

from .hf import ForwardTrace

#: The conditions every claim built on a cached loop asserts (names of measured values), and the counts behind them.
CONDITIONS = ("cache_grows_by_fed", "logit_change_vs_no_context")
COUNTS = ("forwards_traced", "forwards_without_cache", "forwards_with_history")
#: The range of history the traced forwards held (module doc), handed to the verdict beside the conditions.
HISTORY = "history_tokens"


def alone_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Last-position logits of a cache-less forward of ``ids`` [B, T] by themselves: ``[B, V]`` fp32 on the CPU."""
    with torch.inference_mode():
        return model(input_ids=ids.to(next(model.parameters()).device), use_cache=False).logits[:, -1].float().cpu()


def relative_change(logits: torch.Tensor, alone: torch.Tensor) -> torch.Tensor:
    """Per row: max|logits - alone| / max|alone|. ``[B]``"""
    return (logits - alone).abs().amax(-1) / alone.abs().amax(-1).clamp_min(1e-30)


def cache_use(model, forwards: list[dict]) -> dict[str, object]:
    """The measured conditions of cache use (module doc) from the records of a :class:`ForwardTrace`."""
    handed = [r for r in forwards if r.get("handed_cache")]
    with_history = [r for r in handed if r["cache_in"] > 0]
    kept = [(r, relative_change(r["logits"], alone_logits(model, r["ids"]))) for r in with_history if "logits" in r]
    changes = [float(c.max()) for _, c in kept]
    fresh = [float(c[i]) for r, c in kept for i in r.get("fresh_rows", ())]
    return {
        "fresh_rows_traced": len(fresh),
        "fresh_row_change_vs_no_context": max(fresh) if fresh else math.nan,
        "forwards_traced": len(forwards),
        "forwards_without_cache": len(forwards) - len(handed),
        "forwards_with_history": len(with_history),
        "cache_grows_by_fed": bool(forwards) and len(handed) == len(forwards) and bool(with_history)
        and all(r["cache_out"] == r["cache_in"] + r["tokens_in"] for r in handed),
        "logit_change_vs_no_context": min(changes) if changes else math.nan,
        HISTORY: [min(r["cache_in"] for r in with_history), max(r["cache_in"] for r in with_history)] if with_history else [],
    }


def traced(model, run: Callable[[], object], keep_logits: int = 4) -> tuple[object, dict[str, object]]:
    """``run()`` under a trace of ``model``'s forwards: (its result, :func:`cache_use` of what the trace saw)."""
    with ForwardTrace(model, keep_logits) as trace:
        result = run()
    return result, cache_use(model, trace.forwards)


def traced_each(model, runs: Mapping[str, Callable[[], object]]) -> dict[str, object]:
    """Each callable run once under its own trace (e.g. each timed step, outside the clock); the evidence combined."""
    return combine(*(traced(model, run)[1] for run in runs.values()))


def combine(*evidence: Mapping[str, object]) -> dict[str, object]:
    """Several loops' evidence as one: counts add up, the conditions must hold in every loop."""
    changes = [e["logit_change_vs_no_context"] for e in evidence]
    return {
        **{k: sum(e[k] for e in evidence) for k in COUNTS},
        "cache_grows_by_fed": bool(evidence) and all(e["cache_grows_by_fed"] for e in evidence),
        "logit_change_vs_no_context": math.nan if not changes or any(math.isnan(c) for c in changes) else min(changes),
        HISTORY: _span(e.get(HISTORY, []) for e in evidence),
    }


def _span(ranges: Iterable[list[int]]) -> list[int]:
    """``[fewest, most]`` over several ``[fewest, most]`` ranges (empty ones left out); ``[]`` where all are empty."""
    held = [r for r in ranges if r]
    return [min(r[0] for r in held), max(r[1] for r in held)] if held else []


# ------------------------------------------------------------------------------------------------
# the timed calls themselves: each must run the model's forwards, not replay them
# ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def counting_forwards(model):
    """Counts the forwards of ``model`` itself (not of its layers) inside the block: ``with counting_forwards(m) as n:``,
    then ``n[0]``. A forward pre-hook held for the block only: a counter increment per forward, microseconds against
    a forward's milliseconds."""
    n = [0]

    def count(module, args) -> None:
        n[0] += 1

    handle = model.register_forward_pre_hook(count)
    try:
        yield n
    finally:
        handle.remove()


def counted(model, variants: Mapping[str, Callable[[], object]], counts: dict[str, list[int]],
            uncounted: Iterable[str] = ()) -> dict[str, Callable[[], object]]:
    """The timed variants as calls that each count the forwards of ``model`` they run, into ``counts[name]`` (one
    count per call: warm-up and extra rounds included). ``uncounted``: variants timed beside them that run no
    model (a copy or read probe), passed through as they are.

    The cache-use trace (:func:`traced`) runs a step once outside the clock; this is the timed calls' own proof
    that they computed. A step replayed from a store (a step function cached by its arguments) runs no forward
    after its first call, and the clock times a lookup."""
    skip = set(uncounted)

    def wrap(name: str, fn: Callable[[], object]) -> Callable[[], object]:
        seen = counts.setdefault(name, [])

        def call() -> object:
            with counting_forwards(model) as n:
                out = fn()
            seen.append(n[0])
            return out

        return call

    return {name: fn if name in skip else wrap(name, fn) for name, fn in variants.items()}


def timed_forwards(samples: Mapping[str, object]) -> dict[str, int]:
    """The measured values of :func:`counted`, from the timed samples (:class:`cheapinfer.runtime.timing.Samples`, whose
    ``forwards`` the suite's ``timed`` fixture fills): the fewest and the most forwards any timed call ran."""
    every = [c for s in samples.values() for c in s.forwards]
    if not every:
        raise ValueError("no timed call was counted")
    return {"timed_forwards": min(every), "timed_forwards_max": max(every)}


def describe_timed(samples: Mapping[str, object], what: str) -> str:
    """One line for the report: the forwards each timed call of :func:`counted` ran, per variant, in call order."""
    runs = "; ".join(f"{name} {s.forwards}" for name, s in samples.items() if s.forwards)
    return f"forwards of the model run by each timed {what}, counted inside the timed call, in call order: {runs}"


def conditions(evidence: Mapping[str, object]) -> dict[str, object]:
    """The measured values a claim hands to its verdict (:data:`CONDITIONS`) and the counts behind them."""
    return {k: evidence[k] for k in (*CONDITIONS, *COUNTS, HISTORY)}


def describe(evidence: dict[str, object]) -> str:
    """One line for the report."""
    return (f"{evidence['forwards_traced']} forwards traced: {evidence['forwards_without_cache']} handed no cache, "
            f"{evidence['forwards_with_history']} against a non-empty one; the cache grew by the positions fed: "
            f"{evidence['cache_grows_by_fed']}; smallest relative logit change against a cache-less forward of the same ids: "
            f"{evidence['logit_change_vs_no_context']:.3g}")
