"""Activation outliers (section 4): the residual stream's capture, its maxima, the INT8 coding of one layer."""

from __future__ import annotations

from dataclasses import replace

import torch

from ...chapter.outliers import outliers
from ..base import CONSTANT, RULE, STATISTIC, fault, patched, result_mapped


@fault(
    "out-scan-reads-weights",
    section="outliers",
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
    "out-scan-takes-signed-maxima",
    section="outliers",
    kind=RULE,
    targets=("OUT-DIM62",),
    what="the outlier scan takes each dimension's largest signed value (h.amax) instead of its largest magnitude (h.abs().amax), so a maximum reached on the negative side is lost",
)
def _out_signed_maxima():
    with patched(outliers, "outlier_stats", lambda states: outliers.OutlierStats(states.amax(dim=1), states.shape[0] - 1)):
        yield


@fault(
    "out-capture-shifted-by-one-layer",
    section="outliers",
    kind=RULE,
    targets=("OUT-PERSISTS", "OUT-HISTOGRAM", "OUT-INT8-LEVELS", "OUT-ONE-LEVEL", "OUT-EXCLUDE-4"),
    what="the residual-stream capture reads hidden_states from index 1 (forgetting that entry 0 is the embedding), so 'layer L' is the stream after L + 1 layers",
)
def _out_capture_shifted():
    def shifted(states):
        return torch.cat([states[1:], states[-1:]])  # the bug: entry L is the stream after layer L + 1

    with result_mapped(outliers, "residual_stream", shifted):
        yield


@fault(
    "out-exclude-ranks-by-mean",
    section="outliers",
    kind=STATISTIC,
    targets=("OUT-EXCLUDE-4",),
    what="the dimensions to exclude are ranked by their mean |h| over the tokens instead of their max |h|",
)
def _out_exclude_by_mean():
    real = outliers.int8_report

    def int8_report(h, exclude=4):
        by_mean = h.abs().mean(dim=0).argsort(descending=True)
        keep = torch.ones(h.shape[1], dtype=torch.bool)
        keep[by_mean[:exclude]] = False
        r = real(h, exclude)
        scale_excl = outliers.tensor_scale(h[:, keep])
        return replace(r, top_dims=by_mean.tolist(), scale_excl=scale_excl, dim_levels_excl=outliers._levels_per_dim(outliers.int8_codes(h, scale_excl)))

    with patched(outliers, "int8_report", int8_report):
        yield


@fault(
    "out-layer-floors-to-embedding",
    section="outliers",
    kind=CONSTANT,
    targets=("OUT-HISTOGRAM", "OUT-INT8-LEVELS", "OUT-ONE-LEVEL", "OUT-EXCLUDE-4"),
    what="the book's layer is scaled with integer division first (16 // 24 * n = 0), so the layer-16 tensor is the embedding output",
)
def _out_layer_zero():
    with patched(outliers, "scaled_layer", lambda book_layer, n_layers: book_layer // outliers.BOOK_LAYERS * n_layers):
        yield


@fault(
    "out-gap-counts-bin-distance",
    section="outliers",
    kind=RULE,
    targets=("OUT-HISTOGRAM",),
    what="the empty octaves between the bulk and the outlier are counted as the distance between their two bins (4 for bins 7 and 11), not the empty bins between them (3)",
)
def _out_gap_off_by_one():
    def distance(counts):
        full = [i for i, c in enumerate(counts) if c]
        return max((b - a for a, b in zip(full, full[1:]) if b - a > 1), default=0)

    with patched(outliers, "empty_octaves_between", distance):
        yield


@fault(
    "out-int8-scale-ignores-outlier",
    section="outliers",
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
# the other side of a bound (issue #43): a fault a one-sided check passes that lies beyond the limit on its
# other side; red on the check that bounds its claim from there, and on nothing the one-sided check saw
# ------------------------------------------------------------------------------------------------


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
