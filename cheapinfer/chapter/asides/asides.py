"""Section 9, asides: fused attention computes the same function without writing the n x n scores.

Shapes are ``[B, H, n, d]``. ``explicit`` materialises the scores the way the chapter's
recompute step does; ``fused`` is ``torch.nn.functional.scaled_dot_product_attention``, which on
a GPU dispatches to FlashAttention or memory-efficient attention (and on a CPU to a tiled kernel).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...runtime.arch import QWEN25_05B


def qkv(n: int, heads: int = QWEN25_05B.heads, head_dim: int = QWEN25_05B.head_dim, dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded queries, keys and values [1, heads, n, head_dim]."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, n, head_dim, generator=g).to(device=device, dtype=dtype) for _ in range(3))


def explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) V with the [B, H, n, n] scores written out, in fp32."""
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])  # [B, H, n, n]
    if causal:
        n = q.shape[-2]
        scores.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1), float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def scores_bytes(n: int, heads: int = 1, bytes_per_element: int = 4) -> int:
    """What the explicit path writes: heads x n x n fp32 scores (one head at n = 4,096: 67,108,864 B)."""
    return heads * n * n * bytes_per_element
