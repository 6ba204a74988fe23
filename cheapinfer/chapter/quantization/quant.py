"""Section 3: weight quantization.

Symmetric absmax quantizers (INT8/INT4 per tensor, per output row, per group of N along the input
dimension) and NF4 (blocks of N along the input dimension, levels at the normal quantiles). Storage
is real: integer codes (4-bit codes packed two per byte) plus one scale per tensor, row or group.

Scales are stored as **fp16** (16 bits), as GGUF's Q8_0/Q4_0 and the book's bit counts assume:
group-128 INT4 is 4 + 16/128 = 4.125 bits per weight, NF4 with blocks of 64 is 4 + 16/64 = 4.25.
Codes are computed against the stored (rounded) scale, so every element is within half a step of
its dequantized value. ``scale_dtype=torch.float32`` keeps fp32 scales (bitsandbytes' NF4 stores
its absmax in fp32; the cross-check uses that).

The chapter's listing (:func:`absmax_listing`) is implemented as printed: one fp32 scale per
tensor, ``torch.round`` (halves to the even integer), clamp to ``[-qmax - 1, qmax]``. The suite's
quantizer follows the same rule by default (``ROUNDING = "half-even"``), so its error table measures
the book's definition; ``rounding="half-away"`` (C's ``roundf``, as llama.cpp and the ``gguf``
package round) is kept for the bit-level cross-check against gguf's Q8_0, and
:func:`cheapinfer.chapter.quantization.quant_error.error_table` measures both rules (how many codes differ, and the error under each).

Assumptions: weights are ``[out_features, in_features]`` (``nn.Linear`` layout).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass

import torch

#: The schemes of the book's error table, in its order. ``reference`` is the unquantized fp32 weight.
SCHEMES = ("reference", "int8-tensor", "int8-row", "int4-tensor", "int4-row", "int4-g128", "nf4")

#: Block size of ``nf4`` without an explicit ``-gN``: bitsandbytes' default ``blocksize`` for NF4
#: (QLoRA's), an outside fact; the chapter prints only "a smaller block" and 4.25 bits per weight.
NF4_BLOCK = 64

#: The dtype scales are stored in: 16 bits, as the chapter's bit counts and GGUF's Q8_0/Q4_0 assume.
SCALE_DTYPE = torch.float16

#: How codes are rounded: ``half-even`` is the chapter's ``torch.round``; ``half-away`` is C's ``roundf``.
ROUNDING = "half-even"
ROUNDINGS = ("half-even", "half-away")

#: The published NF4 codebook (QLoRA, Dettmers et al. 2023; the table in bitsandbytes): 16 levels at
#: quantiles of N(0, 1), normalised to [-1, 1], with an exact zero (8 positive, 7 negative levels).
NF4_CODEBOOK = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)

_SCHEME = re.compile(r"^(?:(int)(\d+)-(tensor|row|g(\d+))|(nf4)(?:-g(\d+))?)$")


@dataclass(frozen=True)
class Scheme:
    """A parsed scheme name: ``int8-tensor``, ``int4-row``, ``int4-g128``, ``int8-g32``, ``nf4``, ``nf4-g128``."""

    name: str
    kind: str  # "int" | "nf4"
    bits: int
    granularity: str  # "tensor" | "row" | "group"
    group: int = 0  # elements per scale along the input dimension (group only)

    @property
    def qmax(self) -> int:
        """Largest positive code; codes lie in [-qmax - 1, qmax] (two's complement range)."""
        return 2 ** (self.bits - 1) - 1


def parse_scheme(name: str) -> Scheme:
    m = _SCHEME.match(name)
    if not m:
        raise ValueError(f"unknown quantization scheme {name!r}; known: {', '.join(SCHEMES)} (and int<b>-g<N>, nf4-g<N>)")
    if m.group(5):
        return Scheme(name, "nf4", 4, "group", int(m.group(6) or NF4_BLOCK))
    bits = int(m.group(2))
    if bits not in (4, 8):
        raise ValueError(f"{name!r}: only 4- and 8-bit integer codes are stored")
    gran = m.group(3)
    if gran.startswith("g"):
        return Scheme(name, "int", bits, "group", int(m.group(4)))
    return Scheme(name, "int", bits, gran)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``: halves round away from zero (torch.round rounds them to even)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def round_codes(x: torch.Tensor, rounding: str | None = None) -> torch.Tensor:
    """Round to integers under ``rounding`` (default :data:`ROUNDING`): ``half-even`` is ``torch.round``."""
    rule = rounding or ROUNDING
    if rule == "half-even":
        return torch.round(x)
    if rule == "half-away":
        return round_half_away(x)
    raise ValueError(f"unknown rounding {rule!r}; known: {', '.join(ROUNDINGS)}")


def absmax_listing(W: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chapter's listing, line for line: ``(Wq, scale, W_hat)``.

    One scale for the whole tensor, in ``W``'s dtype; ``torch.round`` rounds halves to even. As
    printed, an all-zero ``W`` divides by zero (NaN codes).
    """
    qmax = 2 ** (bits - 1) - 1
    scale = W.abs().max() / qmax
    Wq = torch.round(W / scale).clamp(-qmax - 1, qmax)
    W_hat = Wq * scale  # dequantized
    return Wq, scale, W_hat


def bf16_magnitudes() -> torch.Tensor:
    """Every bf16 number in [1, 2): its 128 mantissas. Scaling by a power of two is exact in bf16 (away from
    subnormals and overflow), so these are all the absmax values a bf16 tensor can have, up to the exponent. ``[128]``"""
    return torch.arange(0x3F80, 0x4000, dtype=torch.int16).view(torch.bfloat16)


def listing_code_span_bf16(bits: int = 8) -> dict[str, int]:
    """The listing's own codes on bf16 weights: for every bf16 magnitude ``a`` (:func:`bf16_magnitudes`), the listing
    (:func:`absmax_listing`, as the suite calls it) run on ``W = [a, -a]``. ``lowest`` and ``highest``: the smallest and
    largest code over all of them; ``ties``: how many magnitudes ``a / scale`` (both rounded to bf16) lands on
    ``qmax + 1/2``, the tie that ``torch.round`` takes to ``qmax + 1`` and the clamp alone keeps in range."""
    qmax = 2 ** (bits - 1) - 1
    lowest, highest, ties = 0, 0, 0
    for a in bf16_magnitudes():
        W = torch.stack([a, -a])  # [2] bf16
        Wq = absmax_listing(W, bits)[0]
        lowest, highest = min(lowest, int(Wq.min())), max(highest, int(Wq.max()))
        ties += int(float(a / (a.abs() / qmax)) == qmax + 0.5)
    return {"lowest": lowest, "highest": highest, "ties": ties, "magnitudes": int(bf16_magnitudes().numel())}


def listing_blockwise(W: torch.Tensor, bits: int, block: int | None = None, rows: bool = False) -> torch.Tensor:
    """The chapter's listing applied to each region on its own: the whole tensor, each row
    (``rows=True``), or each group of ``block`` consecutive weights of a row; ``W_hat`` ``[out, in]``.

    A region that is all zero stays zero (the listing as printed would divide by zero there).
    """
    w = as_matrix(W)
    out = torch.zeros_like(w)
    regions = [(slice(None), slice(None))] if not (rows or block) else [
        (slice(r, r + 1), slice(c, c + (block or w.shape[1]))) for r in range(w.shape[0]) for c in range(0, w.shape[1], block or w.shape[1])
    ]
    for rs, cs in regions:
        part = w[rs, cs]
        if bool((part != 0).any()):
            out[rs, cs] = absmax_listing(part, bits)[2]
    return out


def rounding_rule(quantizer) -> str:
    """Which rule ``quantizer(W, bits) -> (Wq, scale, W_hat)`` rounds halves by, read from exact ties.

    ``W = [127, 0.5, 1.5, 2.5, -0.5, -2.5]`` at 8 bits has scale exactly 1, so ``W / scale`` hits the
    ties 0.5, 1.5, 2.5: halves to even give codes 0, 2, 2; halves away from zero 1, 2, 3.
    """
    w = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -2.5])
    codes = quantizer(w, 8)[0].tolist()
    if codes == [127, 0, 2, 2, 0, -2]:
        return "half to even"
    if codes == [127, 1, 2, 3, -1, -3]:
        return "half away from zero"
    return f"other: {codes}"


def nf4_codebook(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 NF4 levels, on ``device``: the device of the values they are compared with or indexed for."""
    return torch.tensor(NF4_CODEBOOK, dtype=dtype, device=device)


def nf4_from_quantiles() -> list[float]:
    """The NF4 levels rebuilt from normal quantiles, as QLoRA constructs them (offset 0.9677).

    8 positive levels at ``Phi^-1`` of ``linspace(offset, 0.5, 9)[:-1]``, 7 negative at
    ``-Phi^-1`` of ``linspace(offset, 0.5, 8)[:-1]``, plus zero, all divided by the largest.
    """
    from scipy.stats import norm

    offset = 0.9677083
    pos = norm.ppf(torch.linspace(offset, 0.5, 9)[:-1].double().numpy()).tolist()
    neg = (-norm.ppf(torch.linspace(offset, 0.5, 8)[:-1].double().numpy())).tolist()
    levels = sorted(pos + [0.0] + neg)
    top = max(abs(v) for v in levels)
    return [v / top for v in levels]


@dataclass
class QuantizedTensor:
    """Codes and scales as stored. ``codes`` is int8 (8-bit) or uint8 with two 4-bit codes per byte."""

    scheme: Scheme
    shape: tuple[int, ...]  # the weight's shape [out, in]
    codes: torch.Tensor  # int8 [out, in_padded] or uint8 [ceil(out * in_padded / 2)]
    scales: torch.Tensor  # [1, 1] (tensor) | [out, 1] (row) | [out, in_padded / group] (group)
    padded_in: int  # input dimension padded to a whole number of groups

    @property
    def nbytes(self) -> int:
        """Bytes actually stored: codes plus scales (the shape is metadata, not counted)."""
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * self.scales.element_size()

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / math.prod(self.shape)

    def unpacked_codes(self) -> torch.Tensor:
        """Signed codes ``[out, in_padded]`` (int8): for INT the integer level, for NF4 the codebook index - 8."""
        if self.scheme.bits == 8:
            return self.codes
        lo = (self.codes & 0x0F).to(torch.int8)
        hi = (self.codes >> 4).to(torch.int8)
        flat = torch.stack([lo, hi], dim=-1).reshape(-1)[: self.shape[0] * self.padded_in]
        return (flat - 8).reshape(self.shape[0], self.padded_in)

    def element_scales(self) -> torch.Tensor:
        """The stored scale of every element, as fp32: ``[out, in]``."""
        out, inp = self.shape
        s = self.scales.to(torch.float32)
        if self.scheme.granularity == "group":
            s = s.repeat_interleave(self.scheme.group, dim=1)[:, :inp]
        return s.expand(out, inp)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        out, inp = self.shape
        values = code_values(self.unpacked_codes(), self.scheme)  # [out, in_padded]
        scales = self.scales.to(torch.float32)
        if self.scheme.granularity == "group":
            g = self.scheme.group
            w = values.reshape(out, self.padded_in // g, g) * scales.unsqueeze(-1)  # [out, groups, g]
            w = w.reshape(out, self.padded_in)
        else:
            w = values * scales  # [out, in] * [1|out, 1]
        return w[:, :inp].to(dtype)


def as_matrix(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() == 1:
        return weight.reshape(1, -1)
    if weight.dim() != 2:
        raise ValueError(f"expected a [out, in] matrix, got shape {tuple(weight.shape)}")
    return weight


def _regions(w: torch.Tensor, s: Scheme) -> tuple[torch.Tensor, int]:
    """``w`` ``[out, in]`` as the scheme's regions, ``[out | 1, blocks | 1, block]``, and the input dimension
    padded to whole groups (zero padding: it never raises a group's absmax)."""
    out, inp = w.shape
    if s.granularity == "group":
        padded = -(-inp // s.group) * s.group
        if padded != inp:
            w = torch.nn.functional.pad(w, (0, padded - inp))
        return w.reshape(out, padded // s.group, s.group), padded
    return (w.unsqueeze(1) if s.granularity == "row" else w.reshape(1, 1, -1)), inp


def _region_absmax(w: torch.Tensor, s: Scheme, blocks: torch.Tensor) -> torch.Tensor:
    """The largest |w| of each region (``blocks`` from :func:`_regions`), ``[out | 1, blocks | 1]``."""
    return blocks.abs().amax(dim=-1)


def normalise(w: torch.Tensor, s: Scheme, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(x, scales, padded)``: ``x = w / scale`` per block ``[out, blocks, block]``, the stored scales
    ``[out | 1, blocks | 1]`` in ``scale_dtype``, and the input dimension padded to whole groups."""
    blocks, padded = _regions(w, s)
    absmax = _region_absmax(w, s, blocks)
    top = 1.0 if s.kind == "nf4" else float(s.qmax)
    scales = (absmax / top).to(scale_dtype)  # stored
    stored = scales.to(torch.float32).unsqueeze(-1)  # [., ., 1]
    # the listing's W / scale; an all-zero block (scale 0) stays zero instead of dividing by zero
    x = torch.where(stored > 0, blocks / torch.where(stored > 0, stored, torch.ones_like(stored)), torch.zeros_like(blocks))
    return x, scales, padded


def to_codes(x: torch.Tensor, s: Scheme, rounding: str | None = None) -> torch.Tensor:
    """Signed int8 codes of normalised values: INT levels, or for NF4 the nearest level's index - 8."""
    if s.kind == "nf4":
        book = nf4_codebook(x.dtype, x.device)
        mids = (book[1:] + book[:-1]) / 2  # 15 decision thresholds
        return (torch.bucketize(x, mids) - 8).to(torch.int8)  # nearest level; index 0..15 -> -8..7
    return round_codes(x, rounding).clamp_(-s.qmax - 1, s.qmax).to(torch.int8)


def code_values(codes: torch.Tensor, s: Scheme) -> torch.Tensor:
    """The normalised value of each code (fp32): the integer itself, or the NF4 level."""
    return nf4_codebook(device=codes.device)[codes.long() + 8] if s.kind == "nf4" else codes.to(torch.float32)


def quantize(weight: torch.Tensor, scheme: str, scale_dtype: torch.dtype | None = None, rounding: str | None = None) -> QuantizedTensor:
    """Quantize a ``[out, in]`` weight (a 1-D tensor is treated as one row) into codes and scales.

    ``scale_dtype`` defaults to :data:`SCALE_DTYPE` (fp16), ``rounding`` to :data:`ROUNDING` (the
    chapter's ``torch.round``).
    """
    s = parse_scheme(scheme)
    w = as_matrix(weight).detach().to(torch.float32)
    out, inp = w.shape
    x, scales, padded = normalise(w, s, scale_dtype or SCALE_DTYPE)
    codes = to_codes(x, s, rounding).reshape(out, padded)
    if s.bits == 4:
        flat = (codes.reshape(-1) + 8).to(torch.uint8)  # 0..15
        if flat.numel() % 2:
            flat = torch.cat([flat, flat.new_zeros(1)])
        pairs = flat.reshape(-1, 2)
        codes = pairs[:, 0] | (pairs[:, 1] << 4)  # two codes per byte, first in the low nibble
    return QuantizedTensor(s, (out, inp), codes.contiguous(), scales.contiguous(), padded)


def fake_quantize(weight: torch.Tensor, scheme: str, scale_dtype: torch.dtype | None = None, rounding: str | None = None) -> torch.Tensor:
    """Quantize then dequantize: same shape and dtype as ``weight``. ``reference`` returns a copy.

    Equal, bit for bit, to ``quantize(...).dequantize()``, without packing 4-bit codes into bytes.
    """
    if scheme == "reference":
        return weight.detach().clone()
    s = parse_scheme(scheme)
    w = as_matrix(weight).detach().to(torch.float32)
    out, inp = w.shape
    x, scales, padded = normalise(w, s, scale_dtype or SCALE_DTYPE)
    w_hat = code_values(to_codes(x, s, rounding), s) * scales.to(torch.float32).unsqueeze(-1)  # [out, blocks, block]
    return w_hat.reshape(out, padded)[:, :inp].reshape(weight.shape).to(weight.dtype)


def extremes_kept(weight: torch.Tensor, scheme: str, scale_dtype: torch.dtype | None = None) -> float:
    """The fraction of ``scheme``'s regions (the tensor, each row, each group) whose largest |w| survives
    :func:`fake_quantize` to the rounding of its stored scale.

    Absmax quantization maps a region's largest |w| to the top code (x = absmax / fl(absmax / top) is top
    within the scale's relative rounding u_s, far from a rounding boundary), and top x fl(absmax / top) gives
    it back within u_s and three fp32 roundings. A property of the format that holds in every region, on any
    weights; a scale computed over other weights than its region's keeps it only by coincidence."""
    w = as_matrix(weight).detach().to(torch.float32)
    return absmax_kept(w, fake_quantize(w, scheme, scale_dtype), scheme, scale_dtype)


def absmax_kept(w: torch.Tensor, w_hat: torch.Tensor, scheme: str, scale_dtype: torch.dtype | None = None) -> float:
    """:func:`extremes_kept` of a reconstruction ``w_hat`` already made (``[out, in]`` fp32, as ``w``): the fraction of
    ``scheme``'s regions whose largest |w| it gives back within the stored scale's rounding and three fp32 roundings.
    The error table (:func:`cheapinfer.chapter.quantization.quant_error.error_table`) reads it off its own reconstruction."""
    s = parse_scheme(scheme)
    a = _regions(w, s)[0].abs()
    at = a.argmax(dim=-1, keepdim=True)
    top, got = a.gather(-1, at), _regions(w_hat, s)[0].abs().gather(-1, at)
    tol = (torch.finfo(scale_dtype or SCALE_DTYPE).eps / 2 + 3 * 2.0**-24) * top
    return float(((got - top).abs() <= tol).float().mean())


_PROJ = re.compile(r"\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")


def projection_weights(model) -> dict[str, torch.Tensor]:
    """Every projection matrix of the decoder layers (q, k, v, o, gate, up, down), by parameter name.

    Embeddings, the LM head and norms are excluded. Names look like ``model.layers.12.mlp.down_proj.weight``.
    """
    return {name: p for name, p in model.named_parameters() if _PROJ.search(name)}


@torch.no_grad()
def quantized_copy(model, scheme: str):
    """A copy of ``model`` with every projection matrix replaced by ``fake_quantize(W, scheme)`` (in ``W``'s dtype and layout).

    Every other tensor (the embedding, the LM head, the norms, the buffers) is shared with ``model``, not copied: the copy
    holds only its quantized matrices (a ``reference`` copy holds none), and changing one of its modules leaves ``model``
    as it was. Never change a shared tensor in place, in either.
    """
    if scheme != "reference":
        parse_scheme(scheme)  # fail before the copy on an unknown name
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    for p in projection_weights(model).values() if scheme != "reference" else ():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p).copy_(fake_quantize(p, scheme)), requires_grad=False)
    clone = copy.deepcopy(model, memo)
    clone.eval()
    clone.requires_grad_(False)
    return clone
