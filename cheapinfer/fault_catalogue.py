"""The catalogue of faults, one block per section of the chapter (see :mod:`cheapinfer.faults`).

Every fault is a realistic bug in the measured system or a library regression, written as a patch of
the measurement code that the claims' tests call. Each names the claims it must turn red.
"""

from __future__ import annotations

import dataclasses

from . import batching, budget, kv
from .faults import CONSTANT, DISABLED, RULE, STATISTIC, fault, patched  # noqa: F401

# ------------------------------------------------------------------------------------------------
# 1. KV cache
# ------------------------------------------------------------------------------------------------


@fault(
    "kv-bytes-counts-query-heads",
    section="KV",
    kind=CONSTANT,
    targets=("KV-BYTES-FORMULA", "KV-RESIDENT-ONLY"),
    what="the cache-size formula counts the 14 query heads instead of the 2 KV heads (the MHA formula applied to a GQA model)",
)
def _kv_bytes_query_heads():
    real = kv.kv_bytes_per_token

    def wrong(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
        return real(layers, kv_heads * 7, head_dim, bytes_per_element)

    with patched(kv, "kv_bytes_per_token", wrong):
        yield


# ------------------------------------------------------------------------------------------------
# 2. Batching, paged cache
# ------------------------------------------------------------------------------------------------


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
    targets=("BAT-1-TO-16", "BAT-TRADEOFF"),
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
    what="the knee search returns after the first doubling of the batch (a return indented into the loop) instead of searching past the steepest doubling",
)
def _knee_first_doubling():
    def first_only(points, threshold: float = 1.25):
        by = {p.batch: p for p in points}
        doublings = [(b, 2 * b, by[2 * b].throughput / by[b].throughput) for b in sorted(by) if 2 * b in by]
        for b, _, gain in doublings:
            if gain < threshold:
                return b, doublings
            return None, doublings
        return None, doublings

    with patched(batching, "knee", first_only):
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


# ------------------------------------------------------------------------------------------------
# 3-4. Weight quantization, activation outliers
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# 5. Does quantization hurt?
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# 6-7. Speculative decoding, distillation
# ------------------------------------------------------------------------------------------------


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
