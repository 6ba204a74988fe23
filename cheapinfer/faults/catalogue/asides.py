"""The asides (section 9): fused attention without the n x n scores, and the live-tensor peak that measures it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...chapter.asides import asides
from ...runtime import accel
from ..base import CONSTANT, DISABLED, RULE, fault, patched


@fault(
    "flash-fused-drops-causal-mask",
    section="asides",
    kind=RULE,
    targets=("FLASH-NO-SCORES",),
    what="the fused attention call forgets is_causal, so it attends to future positions: not the same function as the explicit path",
)
def _flash_drops_causal():
    real = asides.fused

    def no_mask(q, k, v, causal=True):
        return real(q, k, v, False)

    with patched(asides, "fused", no_mask):
        yield


@fault(
    "flash-fused-explicit-mask",
    section="asides",
    kind=DISABLED,
    targets=("FLASH-NO-SCORES",),
    what="the fused attention call builds an n x n boolean causal mask and passes attn_mask= instead of is_causal=True: the same function, but the mask is a quarter of the fp32 scores and the flash kernel cannot take it",
)
def _flash_explicit_mask():
    real = asides.fused

    def with_mask(q, k, v, causal=True):
        if not causal:
            return real(q, k, v, False)
        n = q.shape[-2]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(n, n, dtype=torch.bool, device=q.device).tril_())

    with patched(asides, "fused", with_mask):
        yield


# ------------------------------------------------------------------------------------------------
# the other side of a bound (issue #43): a fault a one-sided check passes that lies beyond the limit on its
# other side; red on the check that bounds its claim from there, and on nothing the one-sided check saw
# ------------------------------------------------------------------------------------------------


@fault(
    "live-peak-skips-storages-up-to-a-mib",
    section="asides",
    kind=CONSTANT,
    targets=("FLASH-NO-SCORES",),
    what="the live-tensor peak skips every storage of at most 1 MiB (a threshold meant for the dispatcher's scalars), so an attention call whose output is 1 MiB creates nothing it counts",
)
def _live_peak_skips_small():
    real = accel.LivePeak._track

    def track(self, t, input_storages):
        if t.untyped_storage().nbytes() > 2**20:
            real(self, t, input_storages)

    with patched(accel.LivePeak, "_track", track):
        yield
