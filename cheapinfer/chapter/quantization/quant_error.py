"""Sections 3-4, weight quantization: what the section measures with the suite's quantizers
(:mod:`cheapinfer.chapter.quantization.quant`): the error table, the matrices' statistics and tails, the levels in use,
the bits stored and the error figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ... import SEED
from . import quant

# ----------------------------------------------------------------------------------------------
# measurements of the section
# ----------------------------------------------------------------------------------------------


def relative_error(weight: torch.Tensor, scheme: str, scale_dtype: torch.dtype | None = None, rounding: str | None = None) -> float:
    """``||W - W_hat||_F / ||W||_F`` for one matrix."""
    w = weight.detach().float()
    return float(torch.linalg.vector_norm(w - quant.fake_quantize(w, scheme, scale_dtype, rounding)) / torch.linalg.vector_norm(w))


@dataclass
class ErrorRow:
    scheme: str
    mean: float
    worst: float
    worst_matrix: str
    errors: dict[str, float]  # per matrix
    #: under the other rounding rule (half away from zero; INT schemes only): mean error, and how many
    #: weights get another code than under ``torch.round`` (the ties k + 1/2 with k even)
    mean_half_away: float | None = None
    codes_differ: int = 0
    #: per matrix, the fraction of the scheme's regions whose largest |w| this table's own reconstruction gives back
    #: (:func:`cheapinfer.chapter.quantization.quant.absmax_kept`): the cross-check of the errors, read off the same W_hat
    kept: dict[str, float] = field(default_factory=dict)
    #: NF4 schemes: the levels (code values at scale 1) that this table's own codes reconstruct, sorted: what the
    #: quantizer that made the errors above holds as its codebook, read off the same codes (Q-NF4's cross-check)
    levels: tuple[float, ...] = ()


def error_table(weights: dict[str, torch.Tensor], schemes=quant.SCHEMES, scale_dtype: torch.dtype | None = None) -> list[ErrorRow]:
    """Relative error of every matrix under every scheme: one row per scheme (mean and worst over matrices).

    Errors are those of the chapter's rounding (``torch.round``); for INT schemes the same codes are
    also rounded half away from zero, and the weights whose code differs are counted.
    """
    rows = []
    for scheme in schemes:
        errors, away, differ, kept, levels = {}, {}, 0, {}, set()
        for name, weight in weights.items():
            w = quant.as_matrix(weight).detach().float()
            norm = torch.linalg.vector_norm(w)
            if scheme == "reference":
                errors[name] = 0.0
                continue
            s = quant.parse_scheme(scheme)
            out, inp = w.shape
            x, scales, padded = quant.normalise(w, s, scale_dtype or quant.SCALE_DTYPE)
            stored = scales.to(torch.float32).unsqueeze(-1)  # [., ., 1]
            codes = quant.to_codes(x, s)
            w_hat = (quant.code_values(codes, s) * stored).reshape(out, padded)[:, :inp]
            residual = w - w_hat
            errors[name] = float(torch.linalg.vector_norm(residual) / norm)
            kept[name] = quant.absmax_kept(w, w_hat, scheme, scale_dtype)
            if s.kind == "nf4":  # the codes in use (a count of each), reconstructed by the same code_values as W_hat
                used = torch.bincount((codes.flatten().long() + 8), minlength=16).nonzero().flatten() - 8
                levels.update(quant.code_values(used.to(codes.dtype), s).tolist())
            if s.kind == "int":  # the other rule changes only ties, k + 1/2: recompute those
                xs = x.reshape(out, padded)[:, :inp]
                rows_, cols = ((xs - xs.floor()) == 0.5).nonzero(as_tuple=True)
                codes_other = quant.to_codes(xs[rows_, cols], s, "half-away" if quant.ROUNDING == "half-even" else "half-even")
                codes_tie = codes.reshape(out, padded)[rows_, cols]
                differ += int((codes_other != codes_tie).sum())
                scale = _scale_at(stored, s, rows_, cols)
                r_other = w[rows_, cols] - quant.code_values(codes_other, s) * scale
                f64 = torch.float64  # the tie terms are tiny beside the whole: sum in double
                err2 = float(residual.square().sum(dtype=f64) - residual[rows_, cols].square().sum(dtype=f64) + r_other.square().sum(dtype=f64))
                away[name] = max(err2, 0.0) ** 0.5 / float(norm)
        worst = max(errors, key=errors.get)
        mean_away = sum(away.values()) / len(away) if away else None
        rows.append(ErrorRow(scheme, sum(errors.values()) / len(errors), errors[worst], worst, errors, mean_away, differ, kept, tuple(sorted(levels))))
    return rows


def scale_ratios(weights: dict[str, torch.Tensor], table=None) -> dict[str, float]:
    """Q-ROW-3.4's numbers: the mean INT4 errors per tensor, per row and per group of 128, their ratios, and the
    cross-check they rest on (the fraction of rows, and of groups, whose largest |w| is given back, the worst matrix's),
    all read off one error table: ``table(weights, schemes)`` (:func:`error_table`, or a cache of it)."""
    schemes = ("int4-tensor", "int4-row", "int4-g128")
    rows = {r.scheme: r for r in (table or error_table)(weights, schemes)}
    tensor, row, g128 = (rows[s].mean for s in schemes)
    return {
        "row_absmax_kept": min(rows["int4-row"].kept.values()),
        "g128_absmax_kept": min(rows["int4-g128"].kept.values()),
        "tensor_over_row": tensor / row,
        "row_over_g128": row / g128,
        "gap_recovered": 1 - g128 / tensor,
        "int4_tensor_mean": tensor,
        "int4_row_mean": row,
        "int4_g128_mean": g128,
    }


def nf4_values(weights: dict[str, torch.Tensor], table=None) -> dict[str, float]:
    """Q-NF4's measured numbers, all read off one error table (``table(weights, schemes)``, :func:`error_table` or a cache
    of it): the errors of INT4 group-128, INT4 with NF4's block of 64 and NF4, the reduction and the block's share of
    it, and the cross-check they rest on: the levels the table's own NF4 codes reconstruct, against normal quantiles
    (QLoRA's construction rebuilt in float64; infinite when their count is not 16)."""
    schemes = ("int4-g128", "int4-g64", "nf4")
    rows = {r.scheme: r for r in (table or error_table)(weights, schemes)}
    levels, normal = rows["nf4"].levels, quant.nf4_from_quantiles()
    g128, g64, nf4 = (rows[s].mean for s in schemes)
    return {
        "levels": len(levels),
        "levels_vs_normal_quantiles": max(abs(a - b) for a, b in zip(levels, normal)) if len(levels) == len(normal) else float("inf"),
        "err_g128": g128,
        "err_nf4": nf4,
        "reduction": 1 - nf4 / g128,
        "nf4_over_g128": nf4 / g128,
        # the third row the chapter asks for: INT4 with NF4's block of 64 splits the gain into block and levels
        "err_int4_g64": g64,
        "block_share": (g128 - g64) / (g128 - nf4),
    }


def table_values(weights: dict[str, torch.Tensor], table=None, schemes=quant.SCHEMES) -> dict[str, float]:
    """Q-ERROR-TABLE's numbers read off one error table (``table(weights, schemes)``, :func:`error_table` or a cache of
    it): each scheme's mean and worst error, under the other rounding rule too, and ``error_max``, the largest error of
    any scheme on any matrix (the mechanism's cross-check of the rows)."""
    rows = {r.scheme: r for r in (table or error_table)(weights, schemes)}
    out = {f"{s.replace('-', '_')}_{k}": getattr(r, k) for s, r in rows.items() for k in ("mean", "worst")}
    out.update({f"{s.replace('-', '_')}_mean_half_away": r.mean_half_away for s, r in rows.items() if r.mean_half_away is not None})
    out["codes_differ_half_away"] = sum(r.codes_differ for r in rows.values())
    out["error_max"] = max(r.worst for s, r in rows.items() if s != "reference")
    return out


def reconstruction(weight: torch.Tensor, scheme: str = "int4-tensor") -> dict[str, float]:
    """What a reconstruction consists of, beside its error (the chapter's "noise of about the right size"):

    - ``kept_norm``: ``||W_hat|| / ||W||``, its size against the original's;
    - ``cosine``: ``<W, W_hat> / (||W|| ||W_hat||)``, how much of the original's direction it keeps (0 for noise
      drawn independently of W; 0 also where W_hat is all zero);
    - ``zero_fraction``: the share of weights reconstructed as exactly 0.

    Independent noise of W's size gives kept_norm ~1, cosine ~0 and a relative error ~sqrt(2); a rounding to the
    nearest level, with 0 a level, can give no error above 1 (:func:`relative_error`).
    """
    w = quant.as_matrix(weight).detach().double()
    w_hat = quant.fake_quantize(quant.as_matrix(weight).detach().float(), scheme).double()
    norm, norm_hat = torch.linalg.vector_norm(w), torch.linalg.vector_norm(w_hat)
    return {
        "kept_norm": float(norm_hat / norm),
        "cosine": float((w * w_hat).sum() / (norm * norm_hat)) if norm_hat > 0 else 0.0,
        "zero_fraction": float((w_hat == 0).double().mean()),
    }


def _scale_at(stored: torch.Tensor, s: quant.Scheme, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The stored scale (fp32) of the elements at ``(rows, cols)``; ``stored`` is ``[out | 1, blocks | 1, 1]``."""
    if s.granularity == "group":
        return stored[rows, cols // s.group, 0]
    if s.granularity == "row":
        return stored[rows, 0, 0]
    return stored.reshape(-1)[0].expand(rows.shape)


def spread(w: torch.Tensor) -> float:
    """The standard deviation of a matrix's weights (all elements, float64)."""
    return float(w.std())


def matrix_stats(weight: torch.Tensor, sigmas: float = 6.0) -> dict[str, float | int]:
    """The book's one-matrix listing: mean |w|, std, max |w|, max/std, count beyond ``sigmas`` std (|w| > k std)."""
    w = weight.detach().double().flatten()
    std = spread(w)
    beyond = int((w.abs() > sigmas * std).sum())
    expected = w.numel() * normal_tail_fraction(sigmas)  # under a normal distribution
    max_abs = float(w.abs().max())
    return {
        "mean_abs": float(w.abs().mean()),
        "std": std,
        "max_abs": max_abs,
        "beyond_6sigma": beyond,
        "numel": w.numel(),
        **tail_summary(max_abs, std, beyond, w.numel()),
        "tail_excess": beyond / expected,
    }


def normal_tail_fraction(sigmas: float) -> float:
    """The share of a normal distribution beyond ``sigmas`` standard deviations, both tails: 2 sf(k)."""
    from scipy.stats import norm

    return 2 * float(norm.sf(sigmas))


#: The threshold of the tail's calibration run: a normal sample of the matrix's size has thousands of weights beyond it
#: (2 x 0.00135 of them), so a wrong expectation shows as a count many Poisson standard deviations off. Beyond 6
#: sigma a normal sample has none to count (2 x 9.9e-10 of 4.4 million is 0.009 weights).
CALIBRATION_SIGMAS = 3.0


def tail_calibration(shape: tuple[int, ...], sigmas: float = CALIBRATION_SIGMAS, seed: int = SEED, stats=None) -> dict[str, float]:
    """:func:`matrix_stats` run on seeded standard-normal weights of ``shape``, at ``sigmas``: its ``tail_excess`` there
    must be 1 up to Poisson noise. ``normal_tail_z`` is the count's distance from a normal tail's expectation, in
    Poisson standard deviations, with the expectation computed here on another route (``erfc``, not scipy's ``sf``):
    ``|excess - 1| sqrt(expected)``. A wrong expectation in :func:`matrix_stats` (one tail for two, another threshold)
    moves the excess of every matrix it measures, and this run's z by dozens."""
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    got = (stats or matrix_stats)(w, sigmas)
    expected = w.numel() * math.erfc(sigmas / math.sqrt(2))
    return {"normal_tail_excess": got["tail_excess"], "normal_tail_expected": expected,
            "normal_tail_z": abs(got["tail_excess"] - 1) * math.sqrt(expected), "normal_tail_sigmas": sigmas}


def tail_values(weight: torch.Tensor, seed: int = SEED, stats=None) -> dict[str, float]:
    """Q-DOWNPROJ-STATS's numbers: the matrix's statistics (:func:`matrix_stats`) and the same measurement calibrated on
    seeded normal weights of its shape (:func:`tail_calibration`), both through ``stats`` (:func:`matrix_stats` unless
    given): the calibration vouches for the tail count only if it ran the function that made it."""
    stats = stats or matrix_stats
    return {**stats(weight), **tail_calibration(tuple(weight.shape), seed=seed, stats=stats)}


def tail_summary(max_abs: float, std: float, beyond: int, numel: int) -> dict[str, float]:
    """What the listing's numbers say about the tail: max/std, the share beyond the threshold in percent,
    and 'one in N'. From a measured matrix (:func:`matrix_stats`) or from the chapter's printed numbers."""
    return {
        "max_over_std": max_abs / std,
        "beyond_percent": 100 * beyond / numel,
        "one_in": numel / beyond if beyond else float("inf"),
    }


def central_levels(weight: torch.Tensor, scheme: str = "int4-tensor", central: float = 0.99) -> int:
    """Distinct codes that the central ``central`` fraction of the weights (by value) occupy under ``scheme``."""
    q = quant.quantize(weight, scheme)
    w = weight.detach().float().flatten()
    codes = q.unpacked_codes()[:, : q.shape[1]].flatten()
    lo, hi = _quantiles(w, ((1 - central) / 2, 1 - (1 - central) / 2))
    inside = (w >= lo) & (w <= hi)
    return int(codes[inside].unique().numel())


def _quantiles(w: torch.Tensor, qs) -> list[float]:
    """Exact order statistics (torch.quantile refuses tensors above 16 M elements)."""
    s = w.sort().values
    return [float(s[min(len(s) - 1, round(q * (len(s) - 1)))]) for q in qs]


def stored_bits(shapes: dict[str, tuple[int, int]], scheme: str, count: int = 1) -> tuple[int, int]:
    """(stored bytes, weights) of ``count`` copies of matrices of the given shapes, measured by quantizing them.

    The bytes depend on shapes only, so seeded random matrices stand in for the weights.
    """
    from collections import Counter

    g = torch.Generator().manual_seed(0)
    nbytes = weights = 0
    for shape, n in Counter(tuple(s) for s in shapes.values()).items():  # each distinct shape once
        q = quant.quantize(torch.randn(shape, generator=g), scheme)
        nbytes += count * n * q.nbytes
        weights += count * n * math.prod(shape)
    return nbytes, weights


def decimal_gb(parameters: int, bytes_per_parameter: int) -> float:
    """Bytes in decimal gigabytes (10^9 B), the chapter's GB (1.98 GB for 494 M parameters at 4 bytes)."""
    return parameters * bytes_per_parameter / 1e9


def error_figure(rows: list[ErrorRow], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.scheme != "reference"]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r.mean for r in rows], width=0.4, label="mean", color="#4a6fa5")
    ax.bar([i + 0.2 for i in x], [r.worst for r in rows], width=0.4, label="worst matrix", color="#c0504d")
    ax.set_xticks(list(x), [r.scheme for r in rows], rotation=20, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("||W - W_hat|| / ||W||")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return fig
