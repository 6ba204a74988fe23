"""Section 8, the budget: memory = weights + KV bytes per token x T (+ a reserve).

``T`` is the number of tokens resident over all concurrent requests. The chapter's quoted numbers
(337, 65,378 and 3,136 tokens; 6.2 and 5.6 GB) reproduce exactly under these assumptions, which
the calculator makes explicit and prints with every answer:

- nominal parameter counts: 7e9, 13e9, 70e9;
- weights at 16, 8 or 4.125 bits per weight (4-bit with one fp16 scale per group of 128);
- 1.5 GiB reserved for everything else (activations, allocator slack, the runtime);
- memory sizes and the printed "GB" are GiB (2**30 bytes);
- a cache element is fp16 (2 bytes); the per-token cache is 2 x layers x kv_heads x head_dim x 2:
  7B: 32 layers, 8 KV heads x 128; 13B: 40 layers, 40 heads x 128 (full multi-head attention);
  70B: 80 layers, 8 KV heads x 128.

``python -m cheapinfer budget --gpu-gib 16 --model 7b --bits 8`` prints one answer;
``python -m cheapinfer budget --tables`` prints the 8 / 16 / 24 GB tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30
RESERVE_GIB = 1.5
CACHE_BYTES_PER_ELEMENT = 2  # fp16 keys and values
#: Bits per weight the chapter's tables use; 4-bit is group-128 with an fp16 scale: 4 + 16/128.
TABLE_BITS = (16.0, 8.0, 4.125)
TABLE_GIB = (8.0, 16.0, 24.0)


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float  # nominal parameter count
    layers: int
    kv_heads: int
    head_dim: int

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values, every layer, fp16: 2 x layers x kv_heads x head_dim x 2."""
        return 2 * self.layers * self.kv_heads * self.head_dim * CACHE_BYTES_PER_ELEMENT


MODELS = {
    "7b": ModelShape("7B", 7e9, 32, 8, 128),
    "13b": ModelShape("13B", 13e9, 40, 40, 128),  # full multi-head attention
    "70b": ModelShape("70B", 70e9, 80, 8, 128),
}

ASSUMPTIONS = (
    "nominal parameter counts (7e9, 13e9, 70e9); weights at the given bits per weight "
    "(4-bit counted as 4.125: group-128 with an fp16 scale); 1.5 GiB reserved for everything else; "
    "memory in GiB (2**30 bytes); fp16 cache: 7B 32 layers x 8 KV heads x 128, "
    "13B 40 layers x 40 heads x 128 (full MHA), 70B 80 layers x 8 KV heads x 128"
)


@dataclass(frozen=True)
class Budget:
    model: str
    bits: float
    memory_gib: float
    weights_bytes: float
    kv_bytes_per_token: int
    reserve_bytes: float
    tokens: int  # resident tokens that fit; 0 when the weights alone do not fit
    fits: bool  # the weights (plus the reserve) fit at all

    @property
    def weights_gib(self) -> float:
        return self.weights_bytes / GIB


def weights_bytes(params: float, bits: float) -> float:
    return params * bits / 8


def budget(model: str, bits: float, memory_gib: float, reserve_gib: float = RESERVE_GIB) -> Budget:
    """How many resident tokens fit: floor((memory - reserve - weights) / KV bytes per token)."""
    if model.lower() not in MODELS:
        raise ValueError(f"unknown model {model!r}: choose one of {', '.join(MODELS)}")
    if not (bits > 0 and math.isfinite(bits)):
        raise ValueError(f"bits per weight must be > 0, not {bits}")
    if not (memory_gib > 0 and math.isfinite(memory_gib)):
        raise ValueError(f"memory must be > 0 GiB, not {memory_gib}")
    if not (reserve_gib >= 0 and math.isfinite(reserve_gib)):
        raise ValueError(f"reserve must be >= 0 GiB, not {reserve_gib}")
    shape = MODELS[model.lower()]
    w = weights_bytes(shape.params, bits)
    for what, value in (("memory", memory_gib * GIB), ("reserve", reserve_gib * GIB), ("weights", w)):
        if not math.isfinite(value):  # e.g. 1e308 GiB: no byte count, and no token count, is finite
            raise ValueError(f"{what} too large to count in bytes ({memory_gib:g} GiB memory, {reserve_gib:g} GiB reserve, {bits:g} bits/weight)")
    free = memory_gib * GIB - reserve_gib * GIB - w
    tokens = max(0, math.floor(free / shape.kv_bytes_per_token))
    return Budget(shape.name, bits, memory_gib, w, shape.kv_bytes_per_token, reserve_gib * GIB, tokens, free >= 0)


def reserve_window(model: str, bits: float, memory_gib: float, tokens: int) -> tuple[float, float]:
    """The reserves (GiB) under which exactly ``tokens`` fit: the half-open interval (lo, hi].

    ``tokens`` fit with reserve R when tokens * b <= memory - R - weights < (tokens + 1) * b, b the cache
    bytes per token: R in (memory - weights - (tokens + 1) b, memory - weights - tokens b].
    """
    shape = MODELS[model.lower()]
    free = memory_gib * GIB - weights_bytes(shape.params, bits)
    return (free - (tokens + 1) * shape.kv_bytes_per_token) / GIB, (free - tokens * shape.kv_bytes_per_token) / GIB


def tables(memories: tuple[float, ...] = TABLE_GIB, bits: tuple[float, ...] = TABLE_BITS) -> dict[float, list[Budget]]:
    """The chapter's tables: for each memory size, every model at every precision."""
    return {m: [budget(name, b, m) for name in MODELS for b in bits] for m in memories}


def table_rows(budgets: list[Budget]) -> list[list[object]]:
    """Rows in the book's shape: model, bits/weight, weights GB, cache KB/token, tokens of context."""
    return [
        [b.model, f"{b.bits:g}", f"{b.weights_gib:.1f}", f"{b.kv_bytes_per_token / 1024:g}", f"{b.tokens:,}" if b.fits else "does not fit"]
        for b in budgets
    ]


TABLE_HEADER = ["model", "bits/weight", "weights (GB)", "KV cache (KB/token)", "tokens of context"]
