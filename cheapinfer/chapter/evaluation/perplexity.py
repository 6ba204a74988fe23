"""Section 5, does quantization hurt? The perplexity column: ``WINDOWS`` = 4 non-overlapping windows of
``WINDOW`` = 512 tokens in one batched forward pass, the same number through transformers' own shifted
loss, and the rounding bound between the two (see :mod:`cheapinfer.chapter.evaluation.evaluation`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# ------------------------------------------------------------------------------------------------
# perplexity
# ------------------------------------------------------------------------------------------------

WINDOW = 512
WINDOWS = 4



def _windows(ids: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The suite's windows of ``ids`` (``[n + 1]``, n a multiple of ``window``): the inputs ``[W, window]`` and their
    targets ``[W, window]`` (token t+1 of each window)."""
    n = ids.numel() - 1
    if n % window:
        raise ValueError(f"{n} predicted tokens is not a multiple of the window {window}")
    return ids[:-1].reshape(-1, window), ids[1:].reshape(-1, window)


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, window: int = WINDOW) -> float:
    """Token-level perplexity of ``ids`` (``[n + 1]``, n a multiple of ``window``) in one forward pass."""
    device = next(model.parameters()).device
    inputs, targets = (x.to(device) for x in _windows(ids, window))
    logits = model(input_ids=inputs, use_cache=False).logits  # [W, window, V]
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="mean")
    return math.exp(nll.item())


@torch.no_grad()
def library_perplexity(model, ids: torch.Tensor, window: int = WINDOW) -> float:
    """The same perplexity through transformers' own loss: ``labels=`` shifts inside the model.

    Row w holds tokens ``[w * window, (w + 1) * window]`` (``window + 1`` tokens, consecutive rows
    share one): the model predicts the last ``window`` of them, so every held-out token is scored
    exactly once. The mean of equal-sized window means is the mean over all tokens.
    """
    n = ids.numel() - 1
    if n % window:
        raise ValueError(f"{n} predicted tokens is not a multiple of the window {window}")
    device = next(model.parameters()).device
    rows = torch.stack([ids[s : s + window + 1] for s in range(0, n, window)]).to(device)  # [W, window + 1]
    loss = model(input_ids=rows, labels=rows, use_cache=False).loss
    return math.exp(float(loss))


def ln_ppl_bound(model, ids: torch.Tensor, window: int = WINDOW) -> float:
    """How far two fp32 evaluations of the windows' mean log-likelihood may differ: 2 (B + L).

    B: the first-order probable bound of the model's rounding (:func:`cheapinfer.runtime.rounding.first_order_bound`
    at fp32) for the mean over the windows' predictions, evaluated in an fp32 copy
    (:func:`cheapinfer.runtime.rounding.bound_copy`). L: each path's loss in fp32, per token a log-sum-exp over V
    logits (max-subtraction, exp, V - 1 sums, log, the target's difference: V + 4 roundings of at most u of
    the token's NLL scale, 1 + |NLL|) and the mean's N - 1 sums, independent across tokens:
    LAMBDA u sqrt((V + 4) / N + N / N^2) (1 + mean NLL).

    The windows' roundings are disjoint independent sets, so the squares add: B = sqrt(sum_w B_w^2) / W; each
    window is bounded by itself (memory).
    """
    from ...runtime import rounding

    windows, targets = _windows(ids, window)  # the windows perplexity() evaluates
    n = targets.numel()
    copy32, fp32 = rounding.bound_copy(model), rounding.Precision.of(torch.float32)
    per_window = [rounding.first_order_bound(copy32, windows[w : w + 1], lambda z, w=w: F.cross_entropy(z[0], targets[w].to(z.device)), fp32)
                  for w in range(len(windows))]
    b = math.sqrt(sum(x.probable**2 for x in per_window)) / len(windows)
    nll = sum(x.value for x in per_window) / len(windows)
    v, u = model.config.vocab_size, rounding.unit_roundoff(torch.float32)
    loss = rounding.LAMBDA * u * math.sqrt((v + 4) / n + 1 / n) * (1 + nll)
    return 2 * (b + loss)
