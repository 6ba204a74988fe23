"""The catalogue of faults, one block per section of the chapter (see :mod:`cheapinfer.faults`).

Every fault is a realistic bug in the measured system or a library regression, written as a patch of
the measurement code that the claims' tests call. Each names the claims it must turn red.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from . import budget, kv, outliers, quant
from .faults import CONSTANT, DISABLED, RULE, STATISTIC, fault, patched  # noqa: F401

# ------------------------------------------------------------------------------------------------
# 1. KV cache
# ------------------------------------------------------------------------------------------------


@fault(
    "kv-bytes-counts-query-heads",
    section="KV",
    kind=CONSTANT,
    targets=("KV-BYTES-FORMULA", "KV-RESIDENT-ONLY"),
    what="the cache-size formula counts the 14 query heads instead of the 2 KV heads (the MHA formula applied to a GQA model)",
)
def _kv_bytes_query_heads():
    real = kv.kv_bytes_per_token

    def wrong(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
        return real(layers, kv_heads * 7, head_dim, bytes_per_element)

    with patched(kv, "kv_bytes_per_token", wrong):
        yield


# ------------------------------------------------------------------------------------------------
# 2. Batching, paged cache
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# 3-4. Weight quantization, activation outliers
# ------------------------------------------------------------------------------------------------


@fault(
    "q-sizes-in-gib",
    section="Q",
    kind=CONSTANT,
    targets=("Q-SIZES",),
    what="model sizes computed in binary GiB (2^30 B) while the chapter's GB are decimal (10^9 B)",
)
def _q_sizes_in_gib():
    with patched(quant, "decimal_gb", lambda parameters, bytes_per_parameter: parameters * bytes_per_parameter / 2**30):
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


@fault(
    "q-absmax-scale-over-2-pow-b-1",
    section="Q",
    kind=CONSTANT,
    targets=("Q-ABSMAX",),
    what="the absmax scale divides by 2^(b-1) (128 at 8 bits) instead of qmax = 2^(b-1) - 1, so the largest weight lands beyond qmax and is clamped",
)
def _q_absmax_over_128():
    with _listing_with_scale(lambda W, bits: W.abs().max() / 2 ** (bits - 1)):
        yield


@fault(
    "q-absmax-signed-max",
    section="Q",
    kind=RULE,
    targets=("Q-ABSMAX",),
    what="the scale is taken from W.max() instead of W.abs().max(): a matrix whose largest magnitude is negative gets a too small (or negative) scale",
)
def _q_absmax_signed_max():
    with _listing_with_scale(lambda W, bits: W.max() / (2 ** (bits - 1) - 1)):
        yield


@fault(
    "q-suite-rounds-half-away",
    section="Q",
    kind=RULE,
    targets=("Q-ABSMAX",),
    what="the suite's quantizer rounds halves away from zero (C's roundf, gguf's rule) instead of the chapter's torch.round",
)
def _q_suite_rounds_half_away():
    with patched(quant, "ROUNDING", "half-away"):
        yield


@fault(
    "q-group-64-for-128",
    section="Q",
    kind=CONSTANT,
    targets=("Q-BITS-G128",),
    what="a group-128 scheme quantizes with groups of 64 (a default block size that overrides the one asked for)",
)
def _q_group_64_for_128():
    with _schemes_parsed_as(lambda s: replace(s, group=64) if s.group == 128 else s):
        yield


@fault(
    "q-scales-stored-fp32",
    section="Q",
    kind=CONSTANT,
    targets=("Q-BITS-G128",),
    what="scales are stored in fp32 instead of fp16 (bitsandbytes' absmax dtype), 32 instead of 16 bits per group",
)
def _q_scales_fp32():
    with patched(quant, "SCALE_DTYPE", torch.float32):
        yield


@fault(
    "q-nf4-uniform-levels",
    section="Q",
    kind=RULE,
    targets=("Q-NF4",),
    what="the NF4 codebook is 16 evenly spaced levels over [-1, 1] instead of the normal quantiles",
)
def _q_nf4_uniform():
    with patched(quant, "nf4_codebook", lambda dtype=torch.float32: torch.linspace(-1.0, 1.0, 16, dtype=dtype)):
        yield


@fault(
    "q-row-scales-per-tensor",
    section="Q",
    kind=DISABLED,
    targets=("Q-ROW-3.4", "Q-ABSMAX"),
    what="per-row scaling silently falls back to one scale per tensor",
)
def _q_row_per_tensor():
    with _schemes_parsed_as(lambda s: replace(s, granularity="tensor") if s.granularity == "row" else s):
        yield


@fault(
    "q-tensor-scales-per-row",
    section="Q",
    kind=RULE,
    targets=("Q-TWO-THREE-LEVELS",),
    what="a per-tensor scheme silently takes one scale per row (an axis mix-up in the absmax), hiding the collapse",
)
def _q_tensor_per_row():
    with _schemes_parsed_as(lambda s: replace(s, granularity="row") if s.granularity == "tensor" else s):
        yield


@fault(
    "q-count-includes-biases",
    section="Q",
    kind=RULE,
    targets=("Q-COUNT",),
    what="the projection filter matches every '*_proj.*' parameter, so the q, k, v biases count as matrices",
)
def _q_count_biases():
    pattern = re.compile(r"\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.")

    with patched(quant, "_PROJ", pattern):
        yield


@fault(
    "q-std-is-frobenius-norm",
    section="Q",
    kind=STATISTIC,
    targets=("Q-DOWNPROJ-STATS",),
    what="the spread of a matrix is its Frobenius norm instead of its standard deviation (sqrt(n) times too large)",
)
def _q_std_norm():
    with patched(quant, "spread", lambda w: float(torch.linalg.vector_norm(w))):
        yield


@fault(
    "out-scan-reads-weights",
    section="OUT",
    kind=RULE,
    targets=("OUT-DIM62", "OUT-PERSISTS"),
    what="the outlier scan reads each layer's down_proj weight (the matrix that writes into the residual stream) instead of the residual stream itself",
)
def _out_reads_weights():
    def weights_as_stream(model, input_ids):
        layers = model.model.layers
        per_layer = [layer.mlp.down_proj.weight.detach().float().T.cpu() for layer in layers]  # [intermediate, hidden]
        return torch.stack(per_layer[:1] + per_layer)  # [L+1, intermediate, hidden]

    with patched(outliers, "residual_stream", weights_as_stream):
        yield


@fault(
    "out-layer-floors-to-embedding",
    section="OUT",
    kind=CONSTANT,
    targets=("OUT-HISTOGRAM", "OUT-INT8-LEVELS", "OUT-ONE-LEVEL", "OUT-EXCLUDE-4"),
    what="the book's layer is scaled with integer division first (16 // 24 * n = 0), so the layer-16 tensor is the embedding output",
)
def _out_layer_zero():
    with patched(outliers, "scaled_layer", lambda book_layer, n_layers: book_layer // outliers.BOOK_LAYERS * n_layers):
        yield


@fault(
    "out-int8-scale-ignores-outlier",
    section="OUT",
    kind=STATISTIC,
    targets=("OUT-INT8-LEVELS", "OUT-ONE-LEVEL", "OUT-EXCLUDE-4"),
    what="the INT8 level count uses a calibrated scale (99.9th percentile of |h| / 127) that clips the outlier instead of the tensor's absmax",
)
def _out_scale_ignores_outlier():
    def clipped_scale(h):
        return float(torch.quantile(h.abs().flatten().double(), 0.999)) / 127

    with patched(outliers, "tensor_scale", clipped_scale):
        yield


# ------------------------------------------------------------------------------------------------
# 5. Does quantization hurt?
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# 6-7. Speculative decoding, distillation
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# 8. The budget
# ------------------------------------------------------------------------------------------------


@fault(
    "budget-reserve-ignored",
    section="BUD",
    kind=CONSTANT,
    targets=("BUD-13B-8GB", "BUD-16GB-INT8"),
    what="the budget forgets the memory reserved for activations and the runtime, so every configuration seems to hold more tokens",
)
def _budget_reserve_ignored():
    real = budget.budget

    def no_reserve(model: str, bits: float, memory_gib: float, reserve_gib: float = budget.RESERVE_GIB) -> budget.Budget:
        return real(model, bits, memory_gib, 0.0)

    with patched(budget, "budget", no_reserve):
        yield
