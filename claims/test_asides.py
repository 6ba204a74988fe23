"""Section 9 of the chapter: asides."""

import pytest
import torch

from cheapinfer import asides, kv

MIB = 2**20


@pytest.mark.claim("FLASH-NO-SCORES")
def test_fused_attention_equals_explicit_without_the_scores(claim, device):
    """FLASH-NO-SCORES: "FlashAttention computes the same function without writing the n x n scores, so the 67 MB is smaller in practice"."""
    rows, worst = [], 0.0
    for n, causal in ((256, True), (1024, True), (1024, False)):
        q, k, v = asides.qkv(n, device=device)  # [1, 14, n, 64] fp32
        with torch.inference_mode():
            diff = asides.max_abs_diff(asides.fused(q, k, v, causal), asides.explicit(q, k, v, causal))
        worst = max(worst, diff)
        rows.append([n, "causal" if causal else "full", "fp32", f"{diff:.2e}"])
    claim.table(f"scaled_dot_product_attention vs softmax(QK^T/sqrt(d))V, 14 heads, d = 64, {device}",
                ["n", "mask", "dtype", "max |difference|"], rows)

    # Memory at n = 4,096, one head: what each path allocates above its inputs.
    n = 4096
    dtype = torch.float16 if device.type == "cuda" else torch.float32  # the flash kernel wants half precision
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
    claim.verify("twin", max_abs_diff=worst, fused_peak_over_scores=fused_peak / scores, explicit_peak_over_scores=explicit_peak / scores)
