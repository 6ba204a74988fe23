"""Section 9 of the chapter: asides."""

import pytest
import torch

from cheapinfer.chapter.asides import asides
from cheapinfer.chapter.kv_cache import kv
from cheapinfer.runtime import models, rounding

MIB = 2**20


@pytest.mark.claim("FLASH-NO-SCORES")
def test_fused_attention_equals_explicit_without_the_scores(claim, device):
    """FLASH-NO-SCORES: "FlashAttention computes the same function without writing the n x n scores, so the 67 MB is smaller in practice"."""
    rows, worst, worst_over_bound = [], 0.0, 0.0
    for n, causal in ((256, True), (1024, True), (1024, False)):
        q, k, v = asides.qkv(n, device=device)  # [1, 14, n, 64] fp32
        with torch.inference_mode():
            diff = (asides.fused(q, k, v, causal).double() - asides.explicit(q, k, v, causal).double()).abs()
        bound = 2 * _attention_bound(q, k, v, causal)
        worst, worst_over_bound = max(worst, diff.max().item()), max(worst_over_bound, (diff / bound).max().item())
        rows.append([n, "causal" if causal else "full", "fp32", f"{diff.max().item():.2e}", f"{(diff / bound).max().item():.2e}"])
    claim.table(f"scaled_dot_product_attention vs softmax(QK^T/sqrt(d))V, 14 heads, d = 64, {device}",
                ["n", "mask", "dtype", "max |difference|", "max |difference| / its bound"], rows)

    # Memory at n = 4,096, one head: what each path allocates above its inputs.
    n = 4096
    dtype = models.DTYPES[models.claim_dtype("gpu-half", device)]  # the flash kernel wants half precision: fp16 on CUDA
    q, k, v = asides.qkv(n, heads=1, dtype=dtype, device=device)
    with torch.inference_mode():
        fused_peak = kv.peak_above_resident(lambda: asides.fused(q, k, v), device)
        explicit_peak = kv.peak_above_resident(lambda: asides.explicit(q, k, v), device)
    scores = asides.scores_bytes(n)
    how = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "live tensor bytes (LivePeak)"
    claim.table(f"Peak memory above inputs, one head, n = {n}, {dtype}, {device} ({how})", ["path", "peak B", "peak / (n^2 x 4 B)"], [
        ["n x n fp32 scores (arithmetic)", f"{scores:,}", "1.000"],
        ["explicit attention", f"{explicit_peak:,}", f"{explicit_peak / scores:.3f}"],
        ["scaled_dot_product_attention", f"{fused_peak:,}", f"{fused_peak / scores:.4f}"],
    ])
    claim.verify("twin", max_abs_diff=worst, max_diff_over_bound=worst_over_bound, fused_peak_over_scores=fused_peak / scores,
                 explicit_peak_over_scores=explicit_peak / scores)


def _attention_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """First-order probable bound (float64, like ``q``) of the fp32 error of softmax(Q K^T / sqrt(d)) V, per output.

    With exact scores s and probabilities P (float64) and u = 2^-24, the roundings an fp32 evaluation
    makes, each at most u of what it rounds: every score is d products and d - 1 sums and the scale
    (its products counted 4 times over, for kernels that split fp32 products in tensor-core
    parts), moving output j by P_s (v_sj - o_j) each; every probability, the max-subtraction
    (u |s - max| P_s), exp (2) and division (1), moving it by v_sj each; the normaliser's n sums,
    scaling the output (u |o_j| each); the weighted sum's 2n, and as many again for a kernel that
    rescales its partial output once per block of keys (u sum_s P_s |v_sj| each). The bound is
    LAMBDA sqrt(sum of the squares) (Hoeffding, as in cheapinfer.runtime.rounding); both paths are within it
    of the exact output, so they differ by at most twice it.
    """
    u = rounding.unit_roundoff(torch.float32)
    q, k, v = (t.double() for t in (q, k, v))  # [B, H, n, d]
    n, d = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-2, -1) / d**0.5  # [B, H, n, n]
    mag_s = q.abs() @ k.abs().transpose(-2, -1) / d**0.5
    if causal:
        hidden = torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1)
        s = s.masked_fill(hidden, float("-inf"))
    p = s.softmax(-1)
    o = p @ v  # [B, H, n, d]
    m = s.max(-1, keepdim=True).values
    spread = torch.where(p > 0, (s - m).abs(), torch.zeros_like(s))
    w = (5 * d + 2) * (u * mag_s * p) ** 2  # [B, H, n, n]: a score's squares, times P_s^2
    scores = w @ v**2 - 2 * o * (w @ v) + o**2 * w.sum(-1, keepdim=True)  # sum_s w_s (v_s - o)^2
    probs = ((u * spread * p) ** 2 + 3 * (u * p) ** 2) @ (v**2)
    norm = n * (u * o) ** 2
    weighted = 4 * n * (u * (p @ v.abs())) ** 2
    return rounding.LAMBDA * (scores.clamp_min(0) + probs + norm + weighted).sqrt()
