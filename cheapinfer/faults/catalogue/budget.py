"""The memory budget (section 8)."""

from __future__ import annotations

import dataclasses

from ...chapter.budget import budget
from ..base import CONSTANT, RULE, fault, patched

# ------------------------------------------------------------------------------------------------
# 8. The budget
# ------------------------------------------------------------------------------------------------


@fault(
    "budget-reserve-ignored",
    section="budget",
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
    section="budget",
    kind=CONSTANT,
    targets=("BUD-16GB-INT8", "BUD-13B-800KB"),
    what="the 7B's cache is sized with its 32 query heads, the multi-head formula applied to a grouped-query model (8 KV heads)",
)
def _budget_7b_mha():
    with patched(budget, "MODELS", _with_shape("7b", kv_heads=32)):
        yield


@fault(
    "budget-70b-mha-heads",
    section="budget",
    kind=CONSTANT,
    targets=("BUD-13B-800KB",),
    what="the 70B is given full multi-head attention (its 64 query heads as KV heads) instead of the 8 KV heads the prose states for the 7B and 70B rows",
)
def _budget_70b_mha():
    with patched(budget, "MODELS", _with_shape("70b", kv_heads=64)):
        yield


@fault(
    "budget-13b-gqa",
    section="budget",
    kind=CONSTANT,
    targets=("BUD-13B-8GB", "BUD-16GB-INT8", "BUD-13B-800KB", "BUD-TABLES"),
    what="the 13B is given the 8 KV heads of the 7B and 70B rows (grouped-query attention) instead of its full multi-head attention with 40 heads",
)
def _budget_13b_gqa():
    with patched(budget, "MODELS", _with_shape("13b", kv_heads=8)):
        yield


@fault(
    "budget-decimal-gb",
    section="budget",
    kind=CONSTANT,
    targets=("BUD-13B-8GB", "BUD-16GB-INT8", "BUD-TABLES"),
    what="the calculator counts memory, reserve and weights in decimal GB (1e9 bytes) where the chapter's budget is in binary GB (2**30 bytes)",
)
def _budget_decimal_gb():
    with patched(budget, "GIB", 10**9):
        yield


@fault(
    "budget-tokens-rounded-to-nearest",
    section="budget",
    kind=RULE,
    targets=("BUD-TABLES",),
    what="the calculator rounds free bytes / cache bytes per token to the nearest token instead of down, so some cells promise a token whose cache does not fit",
)
def _budget_tokens_rounded():
    real = budget.budget

    def rounded(model: str, bits: float, memory_gib: float, reserve_gib: float = budget.RESERVE_GIB) -> budget.Budget:
        b = real(model, bits, memory_gib, reserve_gib)
        free = memory_gib * budget.GIB - reserve_gib * budget.GIB - b.weights_bytes
        return dataclasses.replace(b, tokens=max(0, round(free / b.kv_bytes_per_token)))

    with patched(budget, "budget", rounded):
        yield
