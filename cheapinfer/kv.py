"""Section 1, the KV cache: bytes, multiply-accumulates, and what a cache costs and saves.

Arithmetic here is exact integer arithmetic; measurements (timings, allocator peaks, cache
tensors) use a real transformers model, usually the twin.
"""

from __future__ import annotations

from .arch import QWEN25_05B, Arch


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
    """Keys and values for one token across all layers: 2 x layers x kv_heads x head_dim x bytes."""
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def arch_kv_bytes_per_token(arch: Arch = QWEN25_05B, bytes_per_element: int = 2, kv_heads: int | None = None) -> int:
    return kv_bytes_per_token(arch.layers, arch.kv_heads if kv_heads is None else kv_heads, arch.head_dim, bytes_per_element)
