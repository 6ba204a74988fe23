"""Section 4 of the chapter: activation outliers in the residual stream."""

import math
import statistics

import pytest

from cheapinfer.chapter.outliers import outliers
from cheapinfer.harness import registry
from cheapinfer.testing import on_profiles

#: The ordinary dimensions the book names (Qwen2.5-0.5B: 826, 336, 96), from the registry; inputs of
#: the measurement on the book profile only.
BOOK_EXAMPLE_DIMS = tuple(registry.get("OUT-ONE-LEVEL").book[f"dim_{i}"] for i in (1, 2, 3))


def _example_dims(profile, dim_max):
    """The book's named dimensions on the book; elsewhere (or where a model given as the book is too
    narrow to have them) ordinary dimensions at the 95th, 50th and 10th percentile of max |h|."""
    if profile.name == "book" and max(BOOK_EXAMPLE_DIMS) < len(dim_max):
        return BOOK_EXAMPLE_DIMS
    order = dim_max.argsort().tolist()  # ascending
    return tuple(order[round(q * (len(order) - 1))] for q in (0.95, 0.5, 0.1))


def _prompt_note(claim, profile):
    full = len(profile.tokenizer(outliers.PROMPT, add_special_tokens=False)["input_ids"])
    claim.note(
        f"Prompt: the first {outliers.PROMPT_TOKENS} tokens of the suite's prose text ({full} tokens in full under "
        f"the {profile.name}'s tokenizer); the book's own prompt is not printed."
    )
    return full


def _layer(profile, book_layer):
    return outliers.scaled_layer(book_layer, profile.config.num_hidden_layers)


@pytest.mark.claim("OUT-DIM62")
@on_profiles("stand-in", "book")
def test_one_dimension_reaches_1579_while_the_median_stays_below_1_6(claim, profile, residual_streams):
    """OUT-DIM62: "dimension 62 reaches 1,579.6 while the median dimension never exceeds 1.6"."""
    states, stats, _ = residual_streams(profile)
    full = _prompt_note(claim, profile)
    covered, negative = outliers.signs_covered(states, stats)
    top = stats.top_dim
    dim_max = stats.dim_max
    ranked = dim_max.argsort(descending=True)[:5].tolist()
    claim.table(f"Largest max |h| per dimension over all layers ({profile.name})", ["dimension", "max |h|"], [[d, f"{float(dim_max[d]):.1f}"] for d in ranked])
    claim.verify(
        profile.name,
        dim=top,
        max=float(dim_max[top]),
        median_dim_max=stats.median_dim_max(),
        top_over_median=float(dim_max[top]) / stats.median_dim_max(),
        prompt_tokens=outliers.PROMPT_TOKENS,
        prompt_tokens_full_text=full,
        hidden=int(dim_max.numel()),
        maxima_cover_both_signs=covered,
        maxima_reached_below_zero=negative,
    )


@pytest.mark.claim("OUT-PERSISTS")
@on_profiles("stand-in", "book")
def test_the_outlier_dimension_persists_from_layer_4_to_20(claim, profile, residual_streams):
    """OUT-PERSISTS: "the same dimension is there at layer 4 and still at layer 20, at nearly the same value"."""
    _, stats, mismatch = residual_streams(profile)
    lo, hi = (_layer(profile, b) for b in outliers.BOOK_PERSIST)
    tops = stats.top_dim_by_layer()[lo : hi + 1]
    dim = tops[0]
    at_lo, at_hi = float(stats.per_layer_dim_max[lo, dim]), float(stats.per_layer_dim_max[hi, dim])
    med_lo, med_hi = (float(stats.per_layer_dim_max[layer].median()) for layer in (lo, hi))
    apart = abs(math.log2(at_hi / at_lo)) if at_lo > 0 and at_hi > 0 else float("inf")
    bulk = abs(math.log2(med_hi / med_lo)) if med_lo > 0 and med_hi > 0 else float("nan")
    claim.table(f"Top dimension by layer ({profile.name})", ["layer", "top dimension", "its max |h|"], [[lo + i, d, f"{float(stats.per_layer_dim_max[lo + i, d]):.1f}"] for i, d in enumerate(tops)])
    claim.verify(
        profile.name,
        dim=dim,
        persists=len(set(tops)) == 1,
        first_layer=lo,
        last_layer=hi,
        max_at_first=at_lo,
        max_at_last=at_hi,
        last_over_first=at_hi / at_lo,
        octaves_apart=apart,
        bulk_octaves_apart=bulk,
        steadier_than_bulk=apart < bulk,
        layer_capture_mismatch=mismatch,
    )


@pytest.mark.claim("OUT-HISTOGRAM")
@on_profiles("arithmetic", "stand-in", "book")
def test_layer_16_maxima_leave_empty_octaves_below_one_outlier(claim, profile, request):
    """OUT-HISTOGRAM: "layer 16: 254, 283, 226, 93, 18, 9, 7, 5, 0, 0, 0, 1" (octave bins of per-dimension max |h|)."""
    if profile is None:  # the book against itself: its printed bins against its '896 maxima', 'Negenhonderd' and 'drie octaven'
        book = registry.get("OUT-HISTOGRAM").book
        bins = [(float(k.split("_")[1]), float(k.split("_")[2]), book[k]) for k in book if k.startswith("n_")]
        counts = [c for _, _, c in bins]
        claim.verify(request.node.callspec.params["profile"], dimensions=sum(counts), under_8=sum(c for _, hi, c in bins if hi <= 8),
                     empty_octaves=outliers.empty_octaves_between(counts), bins=",".join(map(str, counts)))
        return
    _, stats, mismatch = request.getfixturevalue("residual_streams")(profile)
    layer = _layer(profile, outliers.BOOK_HIST_LAYER)
    dim_max = stats.per_layer_dim_max[layer]  # [H]
    edges = outliers.octave_edges(float(dim_max.max()))
    counts = outliers.octave_histogram(dim_max, edges)
    claim.table(f"Per-dimension max |h| at layer {layer} of {stats.layers} ({profile.name})", ["bin", "dimensions"], [[line.rsplit(" ", 1)[0], c] for line, c in zip(outliers.histogram_lines(counts, edges), counts)])
    title = f"{profile.name}: max |h| per dimension, layer {layer} of {stats.layers}"
    claim.figure("out-histogram" if profile.name == "stand-in" else f"out-histogram-{profile.name}", outliers.histogram_figure(counts, title, edges))
    bins = {f"n_{lo:g}_{hi:g}": c for lo, hi, c in zip(edges[:-1], edges[1:], counts)}
    under_8 = sum(c for lo, c in zip(edges[:-1], counts) if lo < 8)
    claim.verify(
        profile.name,
        **bins,
        bins=",".join(map(str, counts)),
        under_8=under_8,
        empty_octaves=outliers.empty_octaves_between(counts),
        layer=layer,
        dimensions=sum(counts),
        layer_capture_mismatch=mismatch,
    )


@pytest.mark.claim("OUT-INT8-LEVELS")
@on_profiles("stand-in", "book")
def test_int8_per_tensor_uses_14_of_256_levels(claim, profile, residual_streams):
    """OUT-INT8-LEVELS: "fourteen levels of the 256; scale 12.44; median magnitude 0.26, 99th percentile 2.51"."""
    states, _, mismatch = residual_streams(profile)
    layer = _layer(profile, outliers.BOOK_HIST_LAYER)
    h = states[layer]  # [T, H]
    r = outliers.int8_report(h)
    claim.verify(profile.name, levels=r.levels, absmax=float(h.abs().max()), scale=r.scale, median_abs=r.median_abs, p99_abs=r.p99_abs, layer=layer,
                 layer_capture_mismatch=mismatch)


@pytest.mark.claim("OUT-ONE-LEVEL")
@on_profiles("stand-in", "book")
def test_ordinary_dimensions_get_one_level_under_the_tensor_scale(claim, profile, residual_streams):
    """OUT-ONE-LEVEL: "dim 826 (max |h| = 4.77): 1 distinct level out of 256" (and 336, 96)."""
    states, _, mismatch = residual_streams(profile)
    layer = _layer(profile, outliers.BOOK_HIST_LAYER)
    h = states[layer]  # [T, H]
    r = outliers.int8_report(h)
    dim_max = h.abs().amax(dim=0)
    dims = _example_dims(profile, dim_max)
    claim.table(
        f"single tensor-wide scale = {r.scale:.4f} (layer {layer}, {profile.name})",
        ["dimension", "max |h|", "distinct levels of 256"],
        [[d, f"{float(dim_max[d]):.2f}", r.dim_levels[d]] for d in dims],
    )
    claim.verify(
        profile.name,
        scale=r.scale,
        **{f"dim_{i}": d for i, d in enumerate(dims, 1)},
        **{f"max_{i}": float(dim_max[d]) for i, d in enumerate(dims, 1)},
        **{f"levels_{i}": r.dim_levels[d] for i, d in enumerate(dims, 1)},
        median_dim_levels=statistics.median(r.dim_levels),
        one_level_dims=sum(1 for n in r.dim_levels if n == 1),
        hidden=len(r.dim_levels),
        layer_capture_mismatch=mismatch,
    )


@pytest.mark.claim("OUT-EXCLUDE-4")
@on_profiles("stand-in", "book")
def test_excluding_4_dimensions_shrinks_the_scale_22x(claim, profile, residual_streams):
    """OUT-EXCLUDE-4: "after excluding the top 4 dimensions, scale = 0.5749 (22x smaller); dim 826: 8 levels, 336: 4, 96: 3"."""
    states, stats, mismatch = residual_streams(profile)
    layer = _layer(profile, outliers.BOOK_HIST_LAYER)
    h = states[layer]  # [T, H]
    r = outliers.int8_report(h, exclude=4)
    dims = _example_dims(profile, h.abs().amax(dim=0))
    # the four largest maxima of this layer, from the scan (not from the report), and the scale the fifth sets
    ranked = stats.per_layer_dim_max[layer].argsort(descending=True).tolist()
    largest = set(ranked[: r.excluded]) == set(r.top_dims[: r.excluded])
    fifth = float(stats.per_layer_dim_max[layer, ranked[r.excluded]]) / 127
    per_dim = {f"example_levels_{i}": r.dim_levels_excl[d] for i, d in enumerate(dims, 1)}
    claim.table(
        f"after excluding the top {r.excluded} dimensions {r.top_dims[: r.excluded]}, scale = {r.scale_excl:.4f} ({r.scale / r.scale_excl:.0f}x smaller)",
        ["dimension", "levels before", "levels after"],
        [[d, r.dim_levels[d], r.dim_levels_excl[d]] for d in dims],
    )
    claim.verify(
        profile.name,
        scale=r.scale_excl,
        shrink=r.scale / r.scale_excl,
        **per_dim,
        example_dims=",".join(map(str, dims)),
        levels=",".join(str(r.dim_levels_excl[d]) for d in dims),
        excluded=r.excluded,
        excluded_dims=",".join(map(str, r.top_dims[: r.excluded])),
        median_dim_levels_excl=statistics.median(r.dim_levels_excl),
        excluded_are_the_largest=largest,
        scale_over_fifth_largest=r.scale_excl / fifth,
        layer_capture_mismatch=mismatch,
    )
