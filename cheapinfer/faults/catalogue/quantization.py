"""Weight quantization (section 3): scales, levels, codes, formats, kernels."""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from ...chapter.batching import batching
from ...chapter.quantization import formats, lowbit, quant, quant_error
from ...runtime import roofline
from ..base import CONSTANT, DISABLED, RULE, STATISTIC, fault, patched
from .patches import replaying_first

# ------------------------------------------------------------------------------------------------
# 3. Weight quantization
# ------------------------------------------------------------------------------------------------


@fault("q-sizes-in-gib", section="quantization", kind=CONSTANT, targets=("Q-SIZES",),
       what="model sizes computed in binary GiB (2^30 B) while the chapter's GB are decimal (10^9 B)")
def _q_sizes_in_gib():
    with patched(quant_error, "decimal_gb", lambda parameters, bytes_per_parameter: parameters * bytes_per_parameter / 2**30):
        yield


def _listing_with_scale(scale_of):
    """The chapter's listing with its scale line replaced by ``scale_of(W, bits)``."""

    def listing(W, bits):
        qmax = 2 ** (bits - 1) - 1
        scale = scale_of(W, bits)
        Wq = torch.round(W / scale).clamp(-qmax - 1, qmax)
        return Wq, scale, Wq * scale

    return patched(quant, "absmax_listing", listing)


def _schemes_parsed_as(change):
    """Every parsed scheme passed through ``change(scheme) -> scheme`` (a wrong group or granularity)."""
    real = quant.parse_scheme
    return patched(quant, "parse_scheme", lambda name: change(real(name)))


@fault("q-absmax-scale-over-2-pow-b-1", section="quantization", kind=CONSTANT, targets=("Q-ABSMAX",),
       what="the absmax scale divides by 2^(b-1) (128 at 8 bits) instead of qmax = 2^(b-1) - 1, so the largest weight lands beyond qmax and is clamped")
def _q_absmax_over_128():
    with _listing_with_scale(lambda W, bits: W.abs().max() / 2 ** (bits - 1)):
        yield


@fault("q-absmax-signed-max", section="quantization", kind=RULE, targets=("Q-ABSMAX",),
       what="the scale is taken from W.max() instead of W.abs().max(): a matrix whose largest magnitude is negative gets a too small (or negative) scale")
def _q_absmax_signed_max():
    with _listing_with_scale(lambda W, bits: W.max() / (2 ** (bits - 1) - 1)):
        yield


def _listing_clamped(clamp):
    """The chapter's listing with its clamp line replaced by ``clamp(codes, qmax)``."""

    def listing(W, bits):
        qmax = 2 ** (bits - 1) - 1
        scale = W.abs().max() / qmax
        Wq = clamp(torch.round(W / scale), qmax)
        return Wq, scale, Wq * scale

    return patched(quant, "absmax_listing", listing)


@fault("q-absmax-clamp-dropped", section="quantization", kind=RULE, targets=("Q-ABSMAX",),
       what="the listing's clamp is left out (it looks dead, since the scale maps the largest weight to qmax): a bf16 weight whose W / scale rounds to qmax + 1/2 gets the code qmax + 1, 128 at 8 bits, which an int8 cast wraps to -128")
def _q_absmax_clamp_dropped():
    with _listing_clamped(lambda codes, qmax: codes):
        yield


@fault("q-absmax-clamp-symmetric", section="quantization", kind=CONSTANT, targets=("Q-ABSMAX",),
       what="the listing clamps to [-qmax, qmax] (LLM.int8()'s symmetric range) instead of the printed [-qmax - 1, qmax]: the bf16 weights whose W / scale rounds to -(qmax + 1/2) lose the code -128")
def _q_absmax_clamp_symmetric():
    with _listing_clamped(lambda codes, qmax: codes.clamp(-qmax, qmax)):
        yield


@fault("q-suite-rounds-half-away", section="quantization", kind=RULE, targets=("Q-ABSMAX",),
       what="the suite's quantizer rounds halves away from zero (C's roundf, gguf's rule) instead of the chapter's torch.round")
def _q_suite_rounds_half_away():
    with patched(quant, "ROUNDING", "half-away"):
        yield


@fault("q-group-64-for-128", section="quantization", kind=CONSTANT, targets=("Q-BITS-G128",),
       what="a group-128 scheme quantizes with groups of 64 (a default block size that overrides the one asked for)")
def _q_group_64_for_128():
    with _schemes_parsed_as(lambda s: replace(s, group=64) if s.group == 128 else s):
        yield


@fault("q-scales-stored-fp32", section="quantization", kind=CONSTANT, targets=("Q-BITS-G128",),
       what="scales are stored in fp32 instead of fp16 (bitsandbytes' absmax dtype), 32 instead of 16 bits per group")
def _q_scales_fp32():
    with patched(quant, "SCALE_DTYPE", torch.float32):
        yield


@fault("q-nf4-uniform-levels", section="quantization", kind=RULE, targets=("Q-NF4",),
       what="the NF4 codebook is 16 evenly spaced levels over [-1, 1] instead of the normal quantiles")
def _q_nf4_uniform():
    with patched(quant, "nf4_codebook", lambda dtype=torch.float32, device="cpu": torch.linspace(-1.0, 1.0, 16, dtype=dtype, device=device)):
        yield


@fault("q-row-scales-per-tensor", section="quantization", kind=DISABLED, targets=("Q-ROW-3.4", "Q-ABSMAX"),
       what="per-row scaling silently falls back to one scale per tensor")
def _q_row_per_tensor():
    with _schemes_parsed_as(lambda s: replace(s, granularity="tensor") if s.granularity == "row" else s):
        yield


@fault("q-tensor-scales-per-row", section="quantization", kind=RULE, targets=("Q-TWO-THREE-LEVELS", "Q-ERROR-TABLE"),
       what="a per-tensor scheme silently takes one scale per row (an axis mix-up in the absmax), hiding the collapse")
def _q_tensor_per_row():
    with _schemes_parsed_as(lambda s: replace(s, granularity="row") if s.granularity == "tensor" else s):
        yield


@fault("q-count-includes-biases", section="quantization", kind=RULE, targets=("Q-COUNT",),
       what="the projection filter matches every '*_proj.*' parameter, so the q, k, v biases count as matrices")
def _q_count_biases():
    pattern = re.compile(r"\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.")

    with patched(quant, "_PROJ", pattern):
        yield


@fault("q-tail-expectation-one-tailed", section="quantization", kind=STATISTIC, targets=("Q-DOWNPROJ-STATS",),
       what="a normal tail's expected count beyond k sigma takes one tail (sf(k)) for |w|'s two, so every matrix's excess over a normal tail doubles")
def _q_tail_one_tailed():
    from scipy.stats import norm

    with patched(quant_error, "normal_tail_fraction", lambda sigmas: float(norm.sf(sigmas))):
        yield


@fault("q-row-scales-from-transposed-view", section="quantization", kind=RULE, targets=("Q-ROW-3.4",),
       what="per-row scales are taken from the rows of the transposed weight's memory viewed as [out, in] (W.T.reshape(out, in)): each row's scale is the largest |w| of other weights, along the wrong axis")
def _q_row_scales_transposed():
    real = quant._region_absmax

    def wrong_axis(w, s, blocks):
        if s.granularity != "row":
            return real(w, s, blocks)
        return w.t().reshape(w.shape).abs().amax(dim=1, keepdim=True)

    with patched(quant, "_region_absmax", wrong_axis):
        yield


@fault("q-group-scales-from-transposed-view", section="quantization", kind=RULE, targets=("Q-ROW-3.4",),
       what="INT group scales are taken from the groups of the transposed weight's memory viewed as [out, in]: each group's scale is the largest |w| of 128 other weights, along the wrong axis")
def _q_group_scales_transposed():
    real = quant._region_absmax

    def wrong_axis(w, s, blocks):
        if s.granularity != "group" or s.kind != "int":
            return real(w, s, blocks)
        return real(w, s, quant._regions(w.t().reshape(w.shape), s)[0])

    with patched(quant, "_region_absmax", wrong_axis):
        yield


@fault("formats-bnb-absmax-in-16-bits", section="quantization", kind=CONSTANT, targets=("Q-NF4",),
       what="the NF4 storage is measured on a QuantState whose fp32 absmax was cast to fp16 (the chapter's 16-bit assumption) before it is counted and written: the library's own layout is no longer what is measured")
def _formats_bnb_absmax_16():
    real = formats._bnb_state

    def half_absmax(w, double_quant):
        codes, qs = real(w, double_quant)
        if qs.state2 is None:
            qs.absmax = qs.absmax.half()
        return codes, qs

    with patched(formats, "_bnb_state", half_absmax):
        yield


@fault("formats-bnb-count-misses-absmax", section="quantization", kind=RULE, targets=("Q-NF4",),
       what="the count of the bytes bitsandbytes holds leaves out the absmax of each block (codes and code books only)")
def _formats_bnb_count_misses_absmax():
    real = formats._bnb_parts

    def codes_only(codes, qs):
        return {k: v for k, v in real(codes, qs).items() if k != "absmax"}

    with patched(formats, "_bnb_parts", codes_only):
        yield


@fault("formats-bnb-double-quant-flag-dropped", section="quantization", kind=DISABLED, targets=("Q-NF4",),
       what="the double-quantization flag never reaches bitsandbytes' quantize_4bit (a renamed keyword), so the 'double quant' layout is the plain one with fp32 absmax")
def _formats_bnb_double_quant_dropped():
    real = formats._bnb_state
    with patched(formats, "_bnb_state", lambda w, double_quant: real(w, False)):
        yield


@fault("q-listing-codes-cast-to-int8", section="quantization", kind=RULE, targets=("Q-ABSMAX",),
       what="the chapter's absmax listing is run with its codes cast to int8 (a silent fix of the listing): what is measured is no longer the listing as printed")
def _q_listing_cast():
    real = quant.absmax_listing

    def cast(W, bits):
        Wq, scale, W_hat = real(W, bits)
        return Wq.to(torch.int8), scale, W_hat

    with patched(quant, "absmax_listing", cast):
        yield


@fault("q-tail-share-as-fraction", section="quantization", kind=CONSTANT, targets=("Q-DOWNPROJ-STATS",),
       what="the share of weights beyond six standard deviations is given as a fraction where the listing prints a percentage (100 times too small)")
def _q_tail_share_fraction():
    real = quant_error.tail_summary

    def as_fraction(max_abs, std, beyond, numel):
        return {**real(max_abs, std, beyond, numel), "beyond_percent": beyond / numel}

    with patched(quant_error, "tail_summary", as_fraction):
        yield


@fault("q-std-is-frobenius-norm", section="quantization", kind=STATISTIC, targets=("Q-DOWNPROJ-STATS",),
       what="the spread of a matrix is its Frobenius norm instead of its standard deviation (sqrt(n) times too large)")
def _q_std_norm():
    with patched(quant_error, "spread", lambda w: float(torch.linalg.vector_norm(w))):
        yield


@fault("lowbit-left-in-16bit", section="quantization", kind=DISABLED, targets=("Q-BYTES-SPEED",),
       what="the quantized copy is silently left in 16 bits (a quantization call that matched no layer): same bytes, same speed")
def _lowbit_left_in_16bit():
    def unchanged(model, name, random_codes=False, seed=0, projections_only=False, act_dtype=None):
        return lowbit._sharing_copy(model).eval().requires_grad_(False)

    with patched(lowbit, "variant", unchanged):
        yield


@fault("lowbit-int8-dequantizes-every-call", section="quantization", kind=DISABLED, targets=("Q-BYTES-SPEED",),
       what="the int8 layer dequantizes its whole weight to the activation dtype on every call and runs a dense product, instead of the kernel that reads the codes")
def _lowbit_dequantize_every_call():
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.codes.to(x.dtype) * self.scales[:, None]  # [out, in], rebuilt every call
        return torch.nn.functional.linear(x, w, self.bias)

    with patched(lowbit.Int8Linear, "forward", forward):
        yield


@fault("lowbit-step-replays-first", section="quantization", kind=RULE, targets=("Q-BYTES-SPEED",),
       what="the low-bit copies' decode step runs its forward once and replays that result on every later call (a step cached by its arguments: "
         "the packed codes never change), so the clock times no kernel; the speedups grow, bounded below only")
def _lowbit_step_replays():
    real = batching.decode_step

    def replaying(model, batch, context=64, seed=batching.SEED):
        step = real(model, batch, context, seed)
        low_bit = any(isinstance(m, (lowbit.Int8Linear, lowbit.Int4Linear)) for m in model.modules())
        return replaying_first(step) if low_bit else step

    with patched(batching, "decode_step", replaying):
        yield


# ------------------------------------------------------------------------------------------------
# the chapter's explanations, judged by the mechanism (cheapinfer/explanations.toml)
# ------------------------------------------------------------------------------------------------


@fault("q-codes-rounded-up", section="quantization", kind=RULE, targets=("Q-ERROR-TABLE",),
       what="the quantizer rounds codes up (torch.ceil for torch.round): no longer to the nearest level, so a weight can err by more than itself")
def _q_codes_rounded_up():
    with patched(quant, "round_codes", lambda x, rounding=None: torch.ceil(x)):
        yield



@fault("q-int-group-size-ignored", section="quantization", kind=CONSTANT, targets=("Q-NF4",),
       what="an INT group scheme ignores the group size in its name and quantizes with the default groups of 128 (int4-g64 runs as int4-g128)")
def _q_int_group_size_ignored():
    with _schemes_parsed_as(lambda s: replace(s, group=128) if s.kind == "int" and s.granularity == "group" else s):
        yield


def _scale_ratios_beside_the_table(weights, table=None):
    """Q-ROW-3.4's numbers with the absmax cross-check computed on a fresh quantizer call (quant.extremes_kept runs
    fake_quantize anew) instead of off the table's own reconstruction: the ratios and the check agree on correct code,
    and a fault on the table's path would pass the check."""
    out = _real_scale_ratios(weights, table)
    out["row_absmax_kept"] = min(quant.extremes_kept(w, "int4-row") for w in weights.values())
    out["g128_absmax_kept"] = min(quant.extremes_kept(w, "int4-g128") for w in weights.values())
    return out


_real_scale_ratios = quant_error.scale_ratios


@fault("q-absmax-kept-beside-the-table", section="quantization", kind=STATISTIC, targets=("Q-ROW-3.4",),
       what="the per-row and per-group absmax cross-check is computed on a fresh quantizer call beside the error table it vouches for, not off the table's own reconstruction")
def _q_absmax_kept_beside_the_table():
    with patched(quant_error, "scale_ratios", _scale_ratios_beside_the_table):
        yield


# ------------------------------------------------------------------------------------------------
# the other side of a bound (issue #43): a fault a one-sided check passes that lies beyond the limit on its
# other side; red on the check that bounds its claim from there, and on nothing the one-sided check saw
# ------------------------------------------------------------------------------------------------


def _codes_unrounded_where(chooses):
    """quant.to_codes returning the normalised weights themselves (no rounding, no clamp) for the schemes ``chooses`` takes."""
    real = quant.to_codes

    def to_codes(x, s, rounding=None):
        return x.clone() if chooses(s) else real(x, s, rounding)

    return patched(quant, "to_codes", to_codes)


@fault("q-int8-codes-not-rounded", section="quantization", kind=DISABLED, targets=("Q-ERROR-TABLE",),
       what="the 8-bit schemes' codes are never rounded (a round dropped where the codes are kept in a float dtype), so INT8 gives W back to fp32 precision: an error of about 1e-7, inside the upper bound")
def _q_int8_codes_not_rounded():
    with _codes_unrounded_where(lambda s: s.kind == "int" and s.bits == 8):
        yield


@fault("q-group-codes-not-rounded", section="quantization", kind=DISABLED, targets=("Q-ROW-3.4",),
       what="the INT group schemes' codes are never rounded, so group-128 reconstructs every matrix exactly: the gap it recovers is all of it, and the row over group-128 ratio infinite")
def _q_group_codes_not_rounded():
    with _codes_unrounded_where(lambda s: s.kind == "int" and s.granularity == "group"):
        yield


@fault("q-central-band-inverted", section="quantization", kind=RULE, targets=("Q-TWO-THREE-LEVELS",),
       what="the ordinary weights' band takes its percentiles in the wrong order (the 99.5th as its lower end, the 0.5th as its upper), so it holds no weight and occupies no level")
def _q_central_band_inverted():
    real = quant_error._quantiles
    with patched(quant_error, "_quantiles", lambda w, qs: real(w, tuple(reversed(tuple(qs))))):
        yield


@fault("roofline-int8-counted-as-nibbles", section="quantization", kind=CONSTANT, targets=("Q-BYTES-SPEED",),
       what="the byte count takes every 8-bit integer tensor for packed 4-bit codes, two to a byte, and counts half its bytes: the int8 step's weights and the 4-bit step's packed codes are both undercounted, which eases every roofline")
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
