"""Section 6 of the chapter: speculative decoding.

- The arithmetic: expected tokens kept per target pass, ``E = (1 - a^(g+1)) / (1 - a)``
  (Leviathan et al. 2023, eq. 1, with i.i.d. acceptance a and draft length g), and the net speedup
  ``E / (g c + 1)`` where c is the draft's cost per token as a fraction of the target's.
- A Monte Carlo simulation of the same process (a pass keeps the leading accepted proposals plus
  one token of the target's own).
- The modified acceptance rule for sampling: accept a draft token x ~ q with probability
  ``min(1, p(x) / q(x))``, else sample from ``norm(max(0, p - q))``; the output is distributed as p.
- A real greedy speculative loop over two transformers causal LMs (batch 1): the draft proposes g
  tokens greedily, one at a time from its own KV cache; the target scores all of them in one
  forward pass from its KV cache; the longest prefix on which the draft's token equals the target's
  argmax is kept, plus the target's token after it (a correction, or a bonus token when all g were
  accepted). Both caches are then cropped back to the kept sequence (``Cache.crop``).
  Invariant: each cache holds the key/values of a prefix of the kept sequence; what it lacks is fed
  at its next call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ...runtime import hf, rounding
from ..evaluation.evaluation import greedy

#: Draft length of the exactness/acceptance runs. Under greedy decoding every judged proposal is
#: conditioned on the target's own prefix, so the measured acceptance does not depend on gamma;
#: gamma = 2 keeps the run short on a CPU when the draft accepts nothing (gamma + 1 passes per token).
RUN_GAMMA = 2

# ------------------------------------------------------------------------------------------------
# arithmetic
# ------------------------------------------------------------------------------------------------


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens kept per target pass: (1 - a^(g+1)) / (1 - a); g + 1 at a = 1."""
    if alpha == 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def speedup(alpha: float, gamma: int, c: float) -> float:
    """Net speedup over plain decoding: E / (g c + 1), a draft pass costing c target passes."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def implied_c(printed_speedup: float, alpha: float, gamma: int) -> float:
    """The draft cost c that makes ``speedup(alpha, gamma, c)`` equal the printed value."""
    return (expected_tokens(alpha, gamma) / printed_speedup - 1.0) / gamma


def implied_c_interval(printed_speedup: float, alpha: float, gamma: int, half_ulp: float) -> tuple[float, float]:
    """The range of c consistent with a speedup printed to +- ``half_ulp``."""
    return implied_c(printed_speedup + half_ulp, alpha, gamma), implied_c(printed_speedup - half_ulp, alpha, gamma)


def series_error(alphas: Sequence[float], gammas: Sequence[int]) -> float:
    """max |E - (1 + a + ... + a^g)| over the grid: the closed form against its defining sum."""
    return max(abs(expected_tokens(a, g) - sum(a**k for k in range(g + 1))) for a in alphas for g in gammas)


def simulate_tokens_per_pass(alpha: float, gamma: int, passes: int, rng: np.random.Generator) -> np.ndarray:
    """Tokens kept in each of ``passes`` simulated passes: leading accepted proposals + 1. ``[passes]``"""
    accepted = rng.random((passes, gamma)) < alpha  # [passes, gamma]
    leading = np.cumprod(accepted, axis=1).sum(axis=1)  # accepted before the first rejection
    return leading + 1


def simulate_speedup(alpha: float, gamma: int, c: float, tokens: int, rng: np.random.Generator) -> float:
    """Net speedup of a simulated generation of ``tokens`` tokens, cost counted pass by pass.

    Each verification pass costs the target one pass plus ``gamma`` draft passes of ``c`` target
    passes each; plain decoding costs one target pass per token.
    """
    kept = simulate_tokens_per_pass(alpha, gamma, tokens, rng)  # [tokens]: at least one token per pass, so enough passes
    passes = int(np.searchsorted(np.cumsum(kept), tokens)) + 1  # passes until ``tokens`` are generated
    cost = passes * (1.0 + gamma * c)  # in target passes
    return float(kept[:passes].sum()) / cost


# ------------------------------------------------------------------------------------------------
# the sampling rule
# ------------------------------------------------------------------------------------------------


def accept_probability(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The modified acceptance rule: a draft token x ~ q is kept with probability min(1, p(x) / q(x))."""
    return torch.clamp(p / q, max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dimension (p where p == q everywhere, never used then)."""
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(p.dtype).tiny), p)


def output_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Closed form of the rule's output law: P(x) = q(x) accept(x) + P(reject) r(x), from the same
    ``accept_probability`` and ``residual`` the sampler uses."""
    kept = torch.where(q > 0, q * accept_probability(p, q), torch.zeros_like(q))  # [.., V]
    return kept + (1 - kept.sum(-1, keepdim=True)) * residual(p, q)


def closed_form_error(pairs: int, generator: torch.Generator, max_vocab: int = 12) -> float:
    """max |P - p| of the closed-form output law over ``pairs`` random (p, q) pairs of 2..``max_vocab`` tokens.

    Half the pairs get exact zeros in p or q (a token the target or the draft never proposes).
    """
    worst = 0.0
    for i in range(pairs):
        v = int(torch.randint(2, max_vocab + 1, (1,), generator=generator))
        p = torch.rand(v, generator=generator, dtype=torch.float64) ** 2
        q = torch.rand(v, generator=generator, dtype=torch.float64) ** 2
        if i % 2:
            p[0] = 0.0
            q[-1] = 0.0
        p, q = p / p.sum(), q / q.sum()
        worst = max(worst, float((output_distribution(p, q) - p).abs().max()))
    return worst


def speculative_sample(p: torch.Tensor, q: torch.Tensor, draws: int, generator: torch.Generator) -> torch.Tensor:
    """``draws`` independent outputs of one speculative position with target p and draft q (``[V]`` each)."""
    x = torch.multinomial(q, draws, replacement=True, generator=generator)  # [draws] draft proposals
    u = torch.rand(draws, generator=generator, dtype=p.dtype)
    accept = u < accept_probability(p[x], q[x])
    y = torch.multinomial(residual(p, q), draws, replacement=True, generator=generator)  # [draws] resamples
    return torch.where(accept, x, y)


# ------------------------------------------------------------------------------------------------
# the greedy loop
# ------------------------------------------------------------------------------------------------


@dataclass
class Run:
    tokens: list[int]  # the generated continuation
    target_passes: int = 0
    draft_passes: int = 0
    proposed: int = 0  # draft tokens proposed
    evaluated: int = 0  # proposals compared with the target's choice on the target's prefix
    accepted: int = 0  # proposals kept
    kept_per_pass: list[int] = field(default_factory=list)
    accepted_per_pass: list[int] = field(default_factory=list)
    ended_at_eos: bool = False
    evidence: dict[str, dict] = field(default_factory=dict)  # cache use of the target's and the draft's passes (generate_traced)

    @property
    def alpha(self) -> float:
        """Acceptance rate: accepted over evaluated proposals (proposals after a rejection are never judged)."""
        return self.accepted / self.evaluated if self.evaluated else float("nan")


def accept_greedy(proposals: Sequence[int], target_choice: Sequence[int]) -> tuple[int, list[int]]:
    """Greedy verification: (proposals accepted, tokens kept).

    ``target_choice[i]`` is the target's argmax after the kept prefix and ``proposals[:i]``
    (``len(proposals) + 1`` of them). The leading proposals that equal the target's choice are kept,
    then the target's own token at the first mismatch (a correction) or after the last proposal (a bonus).
    """
    n = 0
    while n < len(proposals) and proposals[n] == target_choice[n]:
        n += 1
    return n, list(proposals[:n]) + [int(target_choice[n])]


def passes_keep_one_target_token(run: Run) -> bool:
    """Whether every verification pass of ``run`` kept its accepted proposals plus exactly one token of the target's
    own (the correction at the first mismatch, or the bonus after the last proposal): that token is what a pass buys
    even when the draft is wrong, and what makes E(alpha, gamma) count gamma + 1 terms. Only a run that stopped at
    EOS may have cut its last pass short. A loop that drops the target's token and lets the next pass find it again
    still emits the target's tokens, at one token per pass fewer: False."""
    passes = list(zip(run.kept_per_pass, run.accepted_per_pass))
    if not passes or len(passes) != run.target_passes:
        return False
    *before, (kept, accepted) = passes
    return all(k == a + 1 for k, a in before) and (kept == accepted + 1 or (run.ended_at_eos and kept <= accepted + 1))


def rule_expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens kept per pass by the loop's own rule (:func:`accept_greedy`), exactly: the first mismatch at
    proposal k (0 <= k < gamma) with probability alpha^k (1 - alpha), none with alpha^gamma, each outcome's kept
    tokens counted by the rule itself. A second computation of :func:`expected_tokens`, independent of its algebra."""
    proposals = list(range(1, gamma + 1))
    total = 0.0
    for k in range(gamma + 1):
        p = alpha**k * (1 - alpha) if k < gamma else alpha**gamma
        choice = proposals[:k] + [0] * (gamma + 1 - k)  # the target agrees with the first k proposals, then not (0 is none of them)
        total += p * len(accept_greedy(proposals, choice)[1])
    return total


def slowdown(alpha: float, gamma: int, c: float) -> dict[str, float]:
    """SPEC-SLOWDOWN's numbers at draft length ``gamma``: tokens kept per pass (the closed form, and its distance from
    the loop's rule) and the net speedup at a draft costing ``c`` target passes per token."""
    kept = expected_tokens(alpha, gamma)
    return {"kept_tokens": kept, "kept_tokens_exact": kept, "kept_tokens_minus_rule": abs(kept - rule_expected_tokens(alpha, gamma)),
            "speedup": speedup(alpha, gamma, c), "cost_in_target_passes": gamma * c + 1}


def acceptance_rate(runs: Sequence[Run]) -> float:
    """Accepted over judged proposals, pooled over runs (a proposal after a rejection is never judged)."""
    judged = sum(r.evaluated for r in runs)
    return sum(r.accepted for r in runs) / judged if judged else float("nan")


def _new_cache(model):
    return hf.new_cache(model.config)


def _forward(model, tokens: Sequence[int], cache, keep: int) -> torch.Tensor:
    """Feed ``tokens`` after what ``cache`` holds; the argmax at the last ``keep`` positions. ``[keep]``

    Every pass of the loop, the draft's and the target's (the verification pass), goes through here."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)  # [1, n]
    out = hf.forward(model, ids, cache=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:].argmax(-1).cpu()  # [keep]


_crop_to = hf.crop


@torch.no_grad()
def generate(target, prompt: Sequence[int], new_tokens: int, draft=None, gamma: int = 4, stop_at_eos: bool = True) -> Run:
    """Greedy decoding of ``new_tokens`` tokens, speculative when a ``draft`` is given.

    Without a draft (or with ``gamma=0``) this is plain cached greedy decoding through the same code,
    which is what the wall-clock comparison needs.
    """
    seq = list(prompt)
    start = len(seq)
    eos = hf.eos_ids(target) if stop_at_eos else set()
    t_cache = _new_cache(target)
    d_cache = _new_cache(draft) if draft is not None else None
    run = Run(tokens=[])
    while len(seq) - start < new_tokens:
        remaining = new_tokens - (len(seq) - start)
        g = min(gamma, remaining - 1) if draft is not None else 0
        proposals: list[int] = []
        if g > 0:
            feed = seq[d_cache.get_seq_length():]  # what the draft cache lacks (>= 1 token)
            for _ in range(g):
                proposals.append(int(_forward(draft, feed, d_cache, 1)[0]))
                run.draft_passes += 1
                feed = proposals[-1:]
        t_choice = _forward(target, seq[t_cache.get_seq_length():] + proposals, t_cache, g + 1).tolist()  # [g + 1]
        run.target_passes += 1
        n, kept = accept_greedy(proposals, t_choice)
        run.proposed += g
        run.accepted += n
        run.evaluated += n + (1 if n < g else 0)
        for i, tok in enumerate(kept):
            if tok in eos:
                kept = kept[: i + 1]
                break
        run.kept_per_pass.append(len(kept))
        run.accepted_per_pass.append(n)
        seq.extend(kept)
        _crop_to(t_cache, len(seq) - 1)
        if d_cache is not None:
            _crop_to(d_cache, len(seq) - 1)
        _check_rolled_back(t_cache, d_cache, len(seq) - 1)
        if kept[-1] in eos:
            run.ended_at_eos = True
            break
    run.tokens = seq[start:]
    return run


def _check_rolled_back(t_cache, d_cache, kept: int) -> None:
    """The loop's invariant after each pass: neither cache holds more than the kept sequence but its last token. A cache
    whose crop keeps what it was fed (a release's crop that silently does nothing) breaks it; the loop stops here with
    that cause rather than later, on an empty feed, with a shape error that names neither.

    A cache that holds less was not filled: its forwards were handed it under a keyword the model swallowed (what 4.x
    did with ``cache=``). The loop then runs on, each pass without its history, and the trace of its forwards
    (``Run.evidence``) makes its claims deviate; stopping here would turn that verdict into an error before one."""
    held = t_cache.get_seq_length()
    drafted = d_cache.get_seq_length() if d_cache is not None else 0
    if held > kept or drafted > kept:
        raise RuntimeError(f"the speculative loop's caches were not rolled back: cropped to {kept} tokens, the target's holds {held}"
                           + (f" and the draft's {drafted}" if d_cache is not None else "")
                           + " (the installed transformers' Cache.crop kept what it was fed)")


def generate_traced(target, prompt: Sequence[int], new_tokens: int, draft=None, gamma: int = 4, stop_at_eos: bool = True) -> Run:
    """:func:`generate` with the target's and the draft's forwards traced; ``run.evidence`` says whether each
    model's passes used their cache (``{"target": ..., "draft": ...}``, :func:`cheapinfer.runtime.evidence.cache_use`).

    A trace sees every forward of its model, also from another thread running the same target."""
    from ...runtime.evidence import cache_use
    from ...runtime.hf import ForwardTrace

    with ForwardTrace(target) as t_trace, (ForwardTrace(draft) if draft is not None else _Nothing()) as d_trace:
        run = generate(target, prompt, new_tokens, draft=draft, gamma=gamma, stop_at_eos=stop_at_eos)
    run.evidence = {"target": cache_use(target, t_trace.forwards)}
    if draft is not None:
        run.evidence["draft"] = cache_use(draft, d_trace.forwards)
    return run


def counting_pair(noise: float = 0.1, seed: int = 0):
    """A target and a draft for counting the loop's passes on a CPU: a seeded tiny Qwen2 (:mod:`kv_macs`) whose
    projections are scaled 20x (at their initial scale a tiny model repeats its last token, which every draft
    predicts), and as draft its copy with Gaussian noise of ``noise`` times each matrix's spread added (acceptance
    about 0.26 at 0.1, a mix of kept and rejected proposals). ``(target, draft)``, float32, eval mode."""
    import copy

    from ..kv_cache.kv_macs import tiny_arch, tiny_model

    torch.manual_seed(seed)
    target = tiny_model(tiny_arch()).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in target.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(20)
        draft = copy.deepcopy(target)
        for p in draft.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=generator) * p.std() * noise)
    return target, draft


def forwards_per_pass(target, draft, prompt: Sequence[int], new_tokens: int, gamma: int) -> dict[str, object]:
    """What one verification pass of the loop (:func:`generate`) costs in forward passes, counted twice.

    The models' own forwards are traced from outside (a forward pre-hook on each model), in order, and split
    at each of the target's: a verification pass is the draft's forwards since the last target forward plus
    that one. ``full``: the forwards of each pass that had room for all ``gamma`` proposals (the loop drafts
    ``min(gamma, tokens left - 1)``, so passes near the end draft fewer). ``loop``: the loop's own count
    (``Run.draft_passes``, ``Run.target_passes``); ``traced``: the same from the hooks.
    """
    order: list[str] = []
    handles = [m.register_forward_pre_hook(lambda module, args, name=name: order.append(name))
               for name, m in (("target", target), ("draft", draft))]
    try:
        run = generate(target, prompt, new_tokens, draft=draft, gamma=gamma, stop_at_eos=False)
    finally:
        for h in handles:
            h.remove()
    costs, drafted = [], 0
    for name in order:
        drafted += name == "draft"
        if name == "target":
            costs.append(drafted + 1)
            drafted = 0
    starts = np.concatenate([[0], np.cumsum(run.kept_per_pass)[:-1]])  # tokens kept before each pass
    room = [new_tokens - int(k) - 1 >= gamma for k in starts]
    return {
        "full": [c for c, r in zip(costs, room) if r],
        "loop": [run.target_passes, run.draft_passes],
        "traced": [order.count("target"), order.count("draft")],
        "passes": len(costs),
        "trailing_drafts": drafted,  # draft forwards after the last target forward: none in a sound loop
        "alpha": run.alpha,
    }


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc) -> None:
        return None


def assisted_generate(target, draft, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """transformers' own assisted generation (greedy, no repetition penalty), for comparison."""
    return greedy(target, prompt, new_tokens, assistant_model=draft)


# ------------------------------------------------------------------------------------------------
# the cost of verification
# ------------------------------------------------------------------------------------------------


def verify_costs(times: Mapping[str, float]) -> dict[str, float]:
    """SPEC-VERIFY-COST's quantities from one set of pass times (``k=<positions>``): a pass over 5 and over 9 positions
    against the pass over 1 (a pass over k positions does the one-position pass's work and more: at least 1 and 1/9)."""
    return {"cost": times["k=5"] / times["k=1"], "cost_per_position_gamma8": times["k=9"] / (9 * times["k=1"])}


def verify_callables(model, context: int, widths: Sequence[int], seed: int) -> dict[str, Callable[[], object]]:
    """One callable per width k: the loop's verification pass (``_forward``) over k new positions
    after a cached ``context``.

    Each call feeds k random tokens after the prefilled cache and crops the cache back, so every
    call sees the same ``context`` tokens of history. Keys are ``"k=<width>"``.
    """
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    cache = _new_cache(model)
    with torch.no_grad():
        _forward(model, torch.randint(vocab, (context,), generator=g).tolist(), cache, 1)
    fresh = {k: torch.randint(vocab, (k,), generator=g).tolist() for k in widths}

    def make(k: int) -> Callable[[], object]:
        def step() -> object:
            with torch.no_grad():
                out = _forward(model, fresh[k], cache, k)  # the verification pass of the greedy loop
            _crop_to(cache, context)
            return out

        return step

    return {f"k={k}": make(k) for k in widths}


def grid(alphas: Sequence[float], gammas: Sequence[int], c: float) -> list[list[float]]:
    """Rows over alpha, columns over gamma: (E, speedup) pairs flattened as E then speedup per gamma."""
    return [[v for g in gammas for v in (expected_tokens(a, g), speedup(a, g, c))] for a in alphas]


# ------------------------------------------------------------------------------------------------
# a priori rounding bounds of the formulas in float64 (the claims' tests and the properties compare against them)
# ------------------------------------------------------------------------------------------------

_U64 = 2.0**-53  # float64's unit roundoff


def expected_tokens_rounding_bound(alpha: float, gamma: int) -> float:
    """|(1 - a^(g+1)) / (1 - a) - sum_k a^k| in float64, a priori.

    The closed form: the power within 2u relative (pow to 1 ulp), 1 - a^(g+1) adds u of itself,
    1 - a one u and the division one: at most 6u / (1 - a) absolute. The sum: each power within
    2u of a^k, g + 1 sums of at most u E (E <= g + 1): (g + 2) u E.
    """
    return _U64 * (6 / (1 - alpha) + (gamma + 2) * (gamma + 1))


def law_rounding_bound(vocab: int) -> float:
    """Bound of |P - p| of the closed-form output law in float64, for p and q normalised in float64 over ``vocab`` tokens.

    P = min(p, q) + (1 - sum min(p, q)) r / sum r with r = max(0, p - q) is p exactly when sum p = 1;
    normalising leaves sum p within u of 1; the quotient, products and differences are one rounding
    each, each sum of V terms V - 1: at most 2V + 10 roundings of at most u of a number <= 1: gamma_{2V+10}(2^-53).
    """
    return rounding.gamma(2 * vocab + 10, _U64)
