"""Section 4: activation outliers in the residual stream.

One forward pass over a fixed, ordinary English prose prompt; the residual stream is captured after
every decoder layer. Layer ``L`` is the residual stream after ``L`` decoder layers (transformers'
``hidden_states[L]`` for ``L < n_layers``; for the last layer this module takes the decoder layer's
own output, before the final RMSNorm, so every entry is the residual stream itself). Layer 0 is the
embedding output. Which dimensions are outliers is measured here, never assumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: Ordinary English prose. Every profile reads exactly its first :data:`PROMPT_TOKENS` tokens
#: (the text is longer than that under any common BPE tokenizer), so the book's 84 tokens hold on
#: every tokenizer; the cut may fall inside a word.
PROMPT = (
    "The village sat at the bottom of a wide green valley, where the river slowed down and spread "
    "out into a shallow lake. Every morning the baker opened his shop before sunrise, and the smell "
    "of fresh bread drifted along the narrow street towards the school. The children walked past "
    "slowly, hoping for a warm roll, while their parents hurried to the station to catch the early "
    "train into the city. In the afternoon the market square filled with farmers selling apples, "
    "cheese and honey, and old friends sat on the benches under the chestnut trees, talking about "
    "the weather, the harvest and the news from the capital."
)
PROMPT_TOKENS = 84

#: The book's reference depths (Qwen2.5-0.5B has 24 layers): histogram at 16, persistence 4..20.
BOOK_LAYERS = 24
BOOK_HIST_LAYER = 16
BOOK_PERSIST = (4, 20)

#: Octave bins of the book's histogram: [0,1), [1,2), [2,4), ..., [512,1024), [1024,4096).
OCTAVE_EDGES = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0)


def scaled_layer(book_layer: int, n_layers: int) -> int:
    """The layer at the same relative depth as ``book_layer`` of the book's 24 (16 of 24 -> 20 of 30)."""
    return round(book_layer * n_layers / BOOK_LAYERS)


def prompt_ids(tokenizer, n_tokens: int = PROMPT_TOKENS) -> torch.Tensor:
    """The first ``n_tokens`` tokens of :data:`PROMPT`, no special tokens: ``[1, n_tokens]``."""
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    if len(ids) < n_tokens:
        raise ValueError(f"the prompt has only {len(ids)} tokens under this tokenizer; {n_tokens} needed")
    return torch.tensor([ids[:n_tokens]])


@torch.no_grad()
def residual_stream(model, input_ids: torch.Tensor) -> torch.Tensor:
    """The residual stream after every decoder layer, one forward pass: ``[n_layers + 1, T, hidden]`` (fp32).

    Entry 0 is the embedding output; entry ``L`` the output of decoder layer ``L`` (1-based).
    """
    layers = model.model.layers
    last: list[torch.Tensor] = []

    def grab(_module, _args, output):
        last.append(output[0] if isinstance(output, tuple) else output)

    handle = layers[-1].register_forward_hook(grab)
    try:
        out = model(input_ids=input_ids.to(next(model.parameters()).device), output_hidden_states=True, use_cache=False)
    finally:
        handle.remove()
    states = list(out.hidden_states[:-1]) + [last[0]]  # replace the final-normed entry with the raw residual
    return torch.stack([h[0].float().cpu() for h in states])  # [L+1, T, H]


#: How far :func:`layer_capture_mismatch` may go: 2^-10 of a state's largest |h|, 16,384 fp32 unit roundoffs, room for
#: another summation order in a second forward; a stream one layer off moves by that layer's whole update.
LAYER_MISMATCH_BOUND = 2.0**-10


@torch.no_grad()
def layer_capture_mismatch(model, input_ids: torch.Tensor, states: torch.Tensor) -> float:
    """Whether ``states`` (from :func:`residual_stream`) are the layers they are named for, from a second forward.

    Forward hooks on the input embedding and on every decoder layer capture, in a forward without
    ``output_hidden_states``, what entry 0 (the embedding output) and entry ``L`` (decoder layer ``L``'s output)
    must be. Returns the largest ``|captured - states|`` over each state's largest ``|h|`` (``inf`` where the count of
    states differs): about 0 when they match; a capture that is one layer off moves it by a layer's update.
    """
    captured: list[torch.Tensor] = []

    def grab(_module, _args, output):
        captured.append((output[0] if isinstance(output, tuple) else output)[0].float().cpu())

    modules = [model.get_input_embeddings(), *model.model.layers]
    handles = [m.register_forward_hook(grab) for m in modules]
    try:
        model(input_ids=input_ids.to(next(model.parameters()).device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    if len(captured) != states.shape[0] or any(c.shape != s.shape for c, s in zip(captured, states)):
        return math.inf
    return max(float((c - s).abs().max()) / max(float(s.abs().max()), 1e-30) for c, s in zip(captured, states))


@dataclass
class OutlierStats:
    per_layer_dim_max: torch.Tensor  # [L+1, H]: max over tokens of |h| per layer and dimension
    layers: int  # decoder layers

    @property
    def dim_max(self) -> torch.Tensor:
        """Max |h| per dimension over every decoder layer (1..L) and token: ``[H]``."""
        return self.per_layer_dim_max[1:].amax(dim=0)

    @property
    def top_dim(self) -> int:
        return int(self.dim_max.argmax())

    def median_dim_max(self) -> float:
        """The largest, over decoder layers, of the median dimension's max |h| ("never exceeds")."""
        return float(self.per_layer_dim_max[1:].median(dim=1).values.max())

    def top_dim_by_layer(self) -> list[int]:
        """The dimension with the largest max |h| at each layer 0..L."""
        return self.per_layer_dim_max.argmax(dim=1).tolist()


def outlier_stats(states: torch.Tensor) -> OutlierStats:
    return OutlierStats(states.abs().amax(dim=1), states.shape[0] - 1)  # [L+1, H]


def signs_covered(states: torch.Tensor, stats: OutlierStats) -> tuple[bool, int]:
    """Whether the scan's maxima are maxima of magnitudes, and how many of them a negative value reaches.

    Each layer's and dimension's maximum in ``stats`` must be at least its largest value and the magnitude of its
    most negative value, both taken here separately (``amax`` and ``amin`` over the tokens of ``states``). The
    count is of the (layer, dimension) pairs whose most negative value is larger in magnitude than their
    largest: the maxima a scan of signed values would get wrong. Returns ``(covered, count)``.
    """
    largest, most_negative = states.amax(dim=1), (-states.amin(dim=1))  # [L+1, H] each
    covered = bool((stats.per_layer_dim_max >= largest).all() and (stats.per_layer_dim_max >= most_negative).all())
    return covered, int((most_negative > largest).sum())


def octave_edges(largest: float) -> tuple[float, ...]:
    """The book's octave edges, extended by whole octaves above 4096 until ``largest`` falls inside."""
    edges = list(OCTAVE_EDGES)
    while edges[-1] <= largest:
        edges.append(edges[-1] * 2)
    return tuple(edges)


def octave_histogram(dim_max: torch.Tensor, edges=OCTAVE_EDGES) -> list[int]:
    """Counts of per-dimension maxima in the octave bins ``[edges[i], edges[i+1])``."""
    e = torch.tensor(edges, dtype=dim_max.dtype)
    idx = torch.bucketize(dim_max, e, right=True) - 1  # bin index; values >= last edge fall outside
    return [int((idx == i).sum()) for i in range(len(edges) - 1)]


def empty_octaves_between(counts: list[int]) -> int:
    """The longest run of empty bins with non-empty bins on both sides (the gap bulk -> outlier)."""
    best, run, seen = 0, 0, False
    for c in counts:
        if c:
            if seen:
                best = max(best, run)
            seen, run = True, 0
        elif seen:
            run += 1
    return best


def int8_codes(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Symmetric INT8 codes of an activation under one scale: the chapter's listing,
    ``torch.round(h / scale)`` clamped to [-128, 127]."""
    from ..quantization.quant import round_codes

    return round_codes(h / scale, "half-even").clamp(-128, 127)


def tensor_scale(h: torch.Tensor) -> float:
    """The tensor-wide INT8 scale of the chapter's listing: max |h| / 127 (the outlier sets it)."""
    return float(h.abs().max()) / 127


def levels_used(codes: torch.Tensor) -> int:
    return int(codes.unique().numel())


@dataclass
class Int8Report:
    scale: float  # tensor-wide scale, absmax / 127
    levels: int  # distinct INT8 codes over the whole [T, H] tensor
    median_abs: float
    p99_abs: float
    dim_levels: list[int]  # [H] distinct codes per dimension under the tensor-wide scale
    top_dims: list[int]  # dimensions by max |h|, largest first
    scale_excl: float  # scale after excluding the top ``excluded`` dimensions
    dim_levels_excl: list[int]  # [H] distinct codes per dimension under that scale
    excluded: int


def int8_report(h: torch.Tensor, exclude: int = 4) -> Int8Report:
    """INT8 per-tensor quantization of one residual-stream tensor ``h``: ``[T, H]``."""
    absh = h.abs()
    dim_max = absh.amax(dim=0)  # [H]
    order = dim_max.argsort(descending=True)
    scale = tensor_scale(h)
    codes = int8_codes(h, scale)  # [T, H]
    keep = torch.ones_like(dim_max, dtype=torch.bool)
    keep[order[:exclude]] = False
    scale_excl = tensor_scale(h[:, keep])  # the same rule over the remaining dimensions
    codes_excl = int8_codes(h, scale_excl)
    return Int8Report(
        scale=scale,
        levels=levels_used(codes),
        median_abs=float(absh.median()),
        p99_abs=float(torch.quantile(absh.flatten().double(), 0.99)),
        dim_levels=_levels_per_dim(codes),
        top_dims=order.tolist(),
        scale_excl=scale_excl,
        dim_levels_excl=_levels_per_dim(codes_excl),
        excluded=exclude,
    )


def _levels_per_dim(codes: torch.Tensor) -> list[int]:
    """Distinct codes in every column of ``codes`` ``[T, H]``, vectorised: sort each column, count changes."""
    s = codes.sort(dim=0).values  # [T, H]
    return (1 + (s[1:] != s[:-1]).sum(dim=0)).tolist()


def histogram_lines(counts: list[int], edges=OCTAVE_EDGES, width: int = 40) -> list[str]:
    """The book's text histogram: ``lo - hi | ##### count`` (bars capped at ``width``)."""
    lines = []
    for lo, hi, c in zip(edges[:-1], edges[1:], counts):
        bar = "#" * min(width, c)  # the book caps its bars at 40 characters
        lines.append(f"{lo:6g} - {hi:6g} | {bar:<{width}} {c}")
    return lines


def histogram_figure(counts: list[int], title: str, edges=OCTAVE_EDGES):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    labels = [f"[{lo:g},{hi:g})" for lo, hi in zip(edges[:-1], edges[1:])]
    ax.bar(range(len(counts)), counts, color="#4a6fa5")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_xticks(range(len(counts)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("dimensions")
    ax.set_xlabel("max |h| over the prompt (octave bins)")
    ax.set_title(title, fontsize=10)
    for i, c in enumerate(counts):
        ax.text(i, c, str(c), ha="center", va="bottom", fontsize=7)
    return fig
