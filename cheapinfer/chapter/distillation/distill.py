"""Section 7 of the chapter: distillation's soft labels and temperature.

The teacher's next-token distribution after a prompt (softmax of the last position's logits, no
special tokens added beyond what the tokenizer adds by default), and what dividing the logits by a
temperature T does to it: for any two tokens, p_i / p_j = exp((z_i - z_j) / T), so at T = 2 every
probability ratio becomes the square root of its T = 1 value and the order is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MILK_PROMPT = "She poured the milk into the"
BOOK_WORDS = (" jug", " cup", " bowl", " large", " milk")


@torch.no_grad()
def next_token_logits(model, tokenizer, prompt: str = MILK_PROMPT) -> torch.Tensor:
    """Logits of the token after ``prompt`` (fp32). ``[V]``"""
    ids = torch.tensor([tokenizer(prompt)["input_ids"]], device=next(model.parameters()).device)
    return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1].float().cpu()


@torch.no_grad()
def logits_read_after_the_prompt(model, tokenizer, prompt: str = MILK_PROMPT) -> tuple[torch.Tensor, bool]:
    """:func:`next_token_logits`, and whether it read the distribution right after ``prompt``: the ids the model is fed
    (caught by a forward pre-hook on the model, outside the function) decode to text that ends with the prompt, so
    the last position, whose logits are read, is the prompt's last token and nothing (an end-of-sequence id, a
    second template) comes after it."""
    fed: list[torch.Tensor] = []

    def grab(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            fed.append(ids[0].detach().cpu())

    handle = model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        logits = next_token_logits(model, tokenizer, prompt)
    finally:
        handle.remove()
    return logits, len(fed) == 1 and tokenizer.decode(fed[0].tolist(), skip_special_tokens=False).endswith(prompt)


def distribution(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """softmax(logits / T). ``[V]``"""
    return torch.softmax(logits.double() / temperature, dim=-1)


@dataclass
class WordProb:
    word: str
    token_ids: list[int]
    prob: float  # probability of the word's first token
    rank: int  # 1-based rank of that token


def word_probabilities(logits: torch.Tensor, tokenizer, words=BOOK_WORDS) -> list[WordProb]:
    """Probability of each word's first token (a word that is one token in the book's tokenizer may be more here)."""
    p = distribution(logits)
    order = torch.argsort(p, descending=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(1, p.numel() + 1)
    out = []
    for w in words:
        ids = tokenizer(w, add_special_tokens=False)["input_ids"]
        out.append(WordProb(w, ids, float(p[ids[0]]), int(rank[ids[0]])))
    return out


def top_k(logits: torch.Tensor, tokenizer, k: int = 5) -> list[tuple[str, float]]:
    p = distribution(logits)
    values, ids = torch.topk(p, k)
    return [(tokenizer.decode([int(i)]), float(v)) for v, i in zip(values, ids)]


def rank_ratio(probs: torch.Tensor, first: int = 1, other: int = 3) -> float:
    """p(rank ``first``) / p(rank ``other``), ranks 1-based by descending probability."""
    ordered = torch.sort(probs, descending=True).values
    return float(ordered[first - 1] / ordered[other - 1])


def root_identity_error(logits: torch.Tensor, temperature: float, k: int = 20) -> float:
    """max over the top token against ranks 2..k of |r_T / r_1^(1/T) - 1|, r the probability ratio.

    ``distribution`` at T and at 1, read on the measured logits: an identity, so ~1e-15 in float64.
    """
    p1, pt = distribution(logits), distribution(logits, temperature)
    order = torch.argsort(p1, descending=True)[:k]  # [k]
    r1 = p1[order[0]] / p1[order[1:]]  # [k - 1]
    rt = pt[order[0]] / pt[order[1:]]
    return float((rt / r1 ** (1.0 / temperature) - 1).abs().max())


def order_unchanged(logits: torch.Tensor, temperature: float, k: int | None = None) -> bool:
    """The descending order of the (top ``k``) probabilities is the same at T = 1 and at ``temperature``."""
    a = torch.argsort(distribution(logits), descending=True, stable=True)
    b = torch.argsort(distribution(logits, temperature), descending=True, stable=True)
    return bool(torch.equal(a[:k], b[:k]) if k else torch.equal(a, b))


def mass_error(logits: torch.Tensor, temperature: float) -> float:
    """|sum of the measured distribution at ``temperature`` - 1|: a softmax's probabilities sum to 1. ``distribution``
    as the claims call it, summed in float64."""
    return float((distribution(logits, temperature).double().sum() - 1).abs())


def mass_bound(vocab: int) -> float:
    """The float64 bound of :func:`mass_error` for a softmax over ``vocab`` logits: with e_i the computed exponentials and
    S their computed sum (relative error <= (V - 1) u, any order), each p_i = e_i / S within u, so sum(p) is
    sum(e_i) / S within (V - 1) u + u; the exponentials' own errors cancel, since the same e_i are summed. Summing
    the p_i to measure adds (V - 1) u: (2 V - 1) u to first order, (2 V + 1) u with the second-order terms inside."""
    return (2 * vocab + 1) * 2.0**-53


def root_ratio_bound(logits: torch.Tensor, t: float, i: int, j: int) -> float:
    """Relative bound of |(p_T(i) / p_T(j)) / (p_1(i) / p_1(j))^(1/T) - 1| in float64 (logits exact in float64).

    softmax(z / T) divides (u |z / T|), subtracts the max (u |a|, a = z / T - max), exponentiates
    (2u: 1 ulp) and divides by the sum; in the ratio of two probabilities the sum cancels, leaving
    u (|z_i / T| + |z_j / T| + |a_i| + |a_j|) + 4u + 2u for the two divisions and 1u for the ratio;
    the root takes 1/T of the T = 1 ratio's error plus 2u (pow); the final quotient 1u.
    """
    u = 2.0**-53  # float64's unit roundoff
    z = logits.double()

    def ratio_err(temp):
        x = z / temp
        a = x - x.max()
        return u * (x[i].abs() + x[j].abs() + a[i].abs() + a[j].abs() + 7)

    return float(ratio_err(t) + ratio_err(1.0) / t + 3 * u)
