"""The suite's quantizers against the libraries that store the same formats: NF4 against bitsandbytes
(codebook and blockwise codes), group-32 INT8 against GGUF's Q8_0."""

from __future__ import annotations

import pytest
import torch

from cheapinfer.chapter.quantization import quant
from cheapinfer.runtime import rounding

U32, U16 = rounding.unit_roundoff(torch.float32), rounding.unit_roundoff(torch.float16)  # 2^-24, 2^-11


def test_nf4_codebook_equals_bitsandbytes_and_the_normal_quantiles():
    """The codebook is bitsandbytes' NF4 table bit for bit, and QLoRA's normal-quantile construction within its fp32 roundings.

    Both tables are the same published fp32 values: equal bitwise. The construction (bitsandbytes'
    ``create_normal_map``) stores each float64 quantile in fp32 and divides by the largest in fp32:
    each level is within 3 roundings of the float64 rebuild, 3 x 2^-24 of |level|.
    """
    import bitsandbytes.functional as bnbf

    ours = quant.nf4_codebook()
    assert torch.equal(ours, bnbf.get_4bit_type("nf4", device="cpu").float())
    rebuilt = torch.tensor(quant.nf4_from_quantiles(), dtype=torch.float64)
    assert bool(((ours.double() - rebuilt).abs() <= 3 * U32 * rebuilt.abs()).all())


def _nf4_codes_differ_only_at_thresholds(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, slack: torch.Tensor) -> None:
    """Two NF4 codings of the same blocks: equal but where the normalised value ``x`` lies within ``slack`` of a decision threshold, and there one level apart."""
    book = quant.nf4_codebook()
    mids = (book[1:] + book[:-1]) / 2
    differ = a != b
    assert int((a.long() - b.long()).abs().max()) <= 1, "codes differ by more than one level"
    near = (x.double()[..., None] - mids.double()).abs().min(-1).values <= slack
    assert bool(near[differ].all()), "codes differ away from a decision threshold"


@pytest.mark.parametrize("shape", [(256, 512), (64, 4864)], ids=lambda s: f"shape={s[0]}x{s[1]}")
def test_nf4_blockwise_equals_bitsandbytes(shape):
    """Own NF4 (block 64, fp32 scales as bitsandbytes stores them) equals bitsandbytes' quantize_4bit -> dequantize_4bit.

    Both take the same fp32 absmax and thresholds ((level + next) / 2 in fp32); the suite divides
    by the absmax (1 rounding), bitsandbytes multiplies by its reciprocal (2): the normalised values
    differ by at most 3 x 2^-24 (|x| <= 1), so a code can differ only that close to a threshold,
    by one level; every other weight dequantizes to the same fp32 product of level and absmax,
    bitwise. With the absmax stored in fp16 instead (relative change <= 2^-11 / (1 - 2^-11)), codes move
    only that much of |x|, plus 3 x 2^-24, from a threshold.
    """
    import bitsandbytes.functional as bnbf

    w = torch.randn(shape) * torch.exp(torch.randn(shape[0], 1))  # rows of different magnitude
    w[0, 3] = 40.0  # one heavy outlier
    packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4")
    theirs = bnbf.dequantize_4bit(packed, state, quant_type="nf4")
    fp32 = quant.quantize(w, "nf4", scale_dtype=torch.float32)
    ours = fp32.dequantize()
    x = w / fp32.element_scales()  # normalised, [-1, 1]
    book = quant.nf4_codebook()
    their_codes = (theirs / fp32.element_scales()).reshape(-1, 1).sub(book).abs().argmin(-1).reshape(shape) - 8  # exact: level x absmax / absmax
    _nf4_codes_differ_only_at_thresholds(fp32.unpacked_codes()[:, : shape[1]], their_codes, x, 3 * U32 * torch.ones(()))
    same = fp32.unpacked_codes()[:, : shape[1]] == their_codes
    assert torch.equal(ours[same], theirs[same])
    # the stored form keeps bitsandbytes' absmax rounded to fp16 (the same rounding of the same number)
    stored = quant.quantize(w, "nf4")
    assert torch.equal(stored.scales.flatten(), state.absmax.half().flatten())
    _nf4_codes_differ_only_at_thresholds(stored.unpacked_codes(), fp32.unpacked_codes(), x, U16 / (1 - U16) * x.abs() + 3 * U32)


@pytest.mark.parametrize("shape", [(64, 256), (8, 4864)], ids=lambda s: f"shape={s[0]}x{s[1]}")
def test_int8_group_32_equals_gguf_q8_0(shape):
    """Own INT8 group-32, rounding halves away from zero as gguf does, equals gguf's Q8_0 quantize ->
    dequantize up to the rounding of the quotient.

    Both store d = absmax/127 as fp16: the same rounding of the same fp32 number, equal bitwise.
    gguf codes round(w x fl(1/d32)) with the fp32 d (2 roundings), the suite round(w / d16) with
    the stored fp16 d (1 rounding). With q = w / d32 in float64 (|q| <= 127), the two quotients
    lie within 127 |d16 - d32| / d16 + 3 x 127 x 2^-24 (1 + 2^-10) of q, so codes differ only where q is
    that close to a half-integer, and there by one level. Every dequantized value is a code times
    an fp16 scale, exact in fp32 (8 + 11 bits): the difference is a whole number of steps, exactly.
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    w = (torch.randn(shape) * torch.exp(torch.randn(shape[0], 1))).numpy()
    theirs = torch.from_numpy(dequantize(quantize(w, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0).reshape(shape))
    q = quant.quantize(torch.from_numpy(w), "int8-g32", rounding="half-away")  # gguf rounds halves away from zero
    ours = q.dequantize()
    w = torch.from_numpy(w)
    d32 = (w.reshape(shape[0], -1, 32).abs().amax(-1) / 127).repeat_interleave(32, dim=1)  # [out, in] fp32 scale
    d16 = q.element_scales()
    assert torch.equal(d16, d32.half().float())  # scales: identical fp16 values
    step = (ours - theirs).abs() / d16
    differ = step > 0
    assert bool((step <= 1).all()), "codes differ by more than one level"
    exact = w.double() / d32.double()
    slack = 127 * (d16.double() - d32.double()).abs() / d16.double() + 3 * 127 * U32 * (1 + 2 * U16)
    near_half = ((exact.abs() - exact.abs().floor()) - 0.5).abs() <= slack
    assert bool(near_half[differ].all()), "codes differ away from a rounding tie"
