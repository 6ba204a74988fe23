"""The other side of a bound (issue #43): faults that a one-sided check passes and that lie beyond the physical or
mathematical limit on its other side (a rounding floor, a byte floor, at least one level, a doubling's 2x).

Each is red on the check that bounds its claim from the other side, and on nothing the one-sided check saw.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ...chapter.batching import knee
from ...chapter.outliers import outliers
from ...chapter.quantization import quant, quant_error
from ...chapter.speculative import speculative
from ...runtime import accel, roofline
from ..base import CONSTANT, DISABLED, RULE, fault, patched


def _codes_unrounded_where(chooses):
    """quant.to_codes returning the normalised weights themselves (no rounding, no clamp) for the schemes ``chooses`` takes."""
    real = quant.to_codes

    def to_codes(x, s, rounding=None):
        return x.clone() if chooses(s) else real(x, s, rounding)

    return patched(quant, "to_codes", to_codes)


@fault(
    "q-int8-codes-not-rounded",
    section="quantization",
    kind=DISABLED,
    targets=("Q-ERROR-TABLE",),
    what="the 8-bit schemes' codes are never rounded (a round dropped where the codes are kept in a float dtype), so INT8 gives W back to fp32 precision: an error of about 1e-7, inside the upper bound",
)
def _q_int8_codes_not_rounded():
    with _codes_unrounded_where(lambda s: s.kind == "int" and s.bits == 8):
        yield


@fault(
    "q-group-codes-not-rounded",
    section="quantization",
    kind=DISABLED,
    targets=("Q-ROW-3.4",),
    what="the INT group schemes' codes are never rounded, so group-128 reconstructs every matrix exactly: the gap it recovers is all of it, and the row over group-128 ratio infinite",
)
def _q_group_codes_not_rounded():
    with _codes_unrounded_where(lambda s: s.kind == "int" and s.granularity == "group"):
        yield


@fault(
    "q-central-band-inverted",
    section="quantization",
    kind=RULE,
    targets=("Q-TWO-THREE-LEVELS",),
    what="the ordinary weights' band takes its percentiles in the wrong order (the 99.5th as its lower end, the 0.5th as its upper), so it holds no weight and occupies no level",
)
def _q_central_band_inverted():
    real = quant_error._quantiles
    with patched(quant_error, "_quantiles", lambda w, qs: real(w, tuple(reversed(tuple(qs))))):
        yield


@fault(
    "roofline-int8-counted-as-nibbles",
    section="quantization",
    kind=CONSTANT,
    targets=("Q-BYTES-SPEED",),
    what="the byte count takes every 8-bit integer tensor for packed 4-bit codes, two to a byte, and counts half its bytes: the int8 step's weights and the 4-bit step's packed codes are both undercounted, which eases every roofline",
)
def _roofline_int8_as_nibbles():
    import torch

    real = roofline.tensor_bytes

    def tensor_bytes(t):
        whole = real(t)
        if t.dtype in (torch.int8, torch.uint8) and not hasattr(t, "__tensor_flatten__"):
            return whole - t.numel() * t.element_size() // 2
        return whole

    with patched(roofline, "tensor_bytes", tensor_bytes):
        yield


@fault(
    "out-levels-count-changes",
    section="outliers",
    kind=RULE,
    targets=("OUT-ONE-LEVEL",),
    what="the distinct codes of each dimension are counted as the changes between its sorted codes, one fewer than the codes: a dimension on a single code counts 0",
)
def _out_levels_count_changes():
    def changes(codes):
        s = codes.sort(dim=0).values
        return (s[1:] != s[:-1]).sum(dim=0).tolist()

    with patched(outliers, "_levels_per_dim", changes):
        yield


@fault(
    "knee-gain-before-over-two-doublings",
    section="batching",
    kind=RULE,
    targets=("BAT-KNEE",),
    what="the steepest doubling before the knee is read from its batch to the size two doublings on (an index one too far), so the gain reported is two doublings' product, above 2",
)
def _knee_gain_before_over_two_doublings():
    real = knee.knee_summary

    def summary(found, threshold=1.25, sigmas=3.0):
        found = list(found)
        k = real(found, threshold, sigmas)
        at = next((i for i, d in enumerate(found) if k.batch is not None and d.small < k.batch and d.gain == k.gain_before), None)
        if at is None or at + 1 >= len(found):
            return k
        nxt = found[at + 1]
        return replace(k, gain_before=k.gain_before * nxt.gain,
                       gain_before_se=math.hypot(k.gain_before_se * nxt.gain, nxt.gain_se * k.gain_before))

    with patched(knee, "knee_summary", summary):
        yield


@fault(
    "spec-target-charged-per-proposal",
    section="speculative",
    kind=RULE,
    targets=("SPEC-SLOWDOWN", "SPEC-SPEEDUP"),
    what="each proposal is charged a target pass besides its draft pass, E / (gamma (c + 1)) instead of E / (gamma c + 1): every speedup falls, and 'slower' holds all the more",
)
def _spec_target_per_proposal():
    with patched(speculative, "speedup", lambda alpha, gamma, c: speculative.expected_tokens(alpha, gamma) / (gamma * (c + 1.0))):
        yield


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
