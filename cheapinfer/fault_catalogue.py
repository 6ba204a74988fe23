"""The catalogue of faults, one block per section of the chapter (see :mod:`cheapinfer.faults`).

Every fault is a realistic bug in the measured system or a library regression, written as a patch of
the measurement code that the claims' tests call. Each names the claims it must turn red.
"""

from __future__ import annotations

from . import budget, kv
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
    targets=("BUD-13B-8GB", "BUD-16GB-INT8"),
    what="the budget forgets the memory reserved for activations and the runtime, so every configuration seems to hold more tokens",
)
def _budget_reserve_ignored():
    real = budget.budget

    def no_reserve(model: str, bits: float, memory_gib: float, reserve_gib: float = budget.RESERVE_GIB) -> budget.Budget:
        return real(model, bits, memory_gib, 0.0)

    with patched(budget, "budget", no_reserve):
        yield
