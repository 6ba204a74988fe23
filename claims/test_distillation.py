"""Section 7 of the chapter: the teacher's soft labels and what temperature does to them."""

import math

import pytest
import torch
from hypothesis import given, strategies as st

from cheapinfer.chapter import distill
from cheapinfer.harness import registry
from cheapinfer.runtime import rounding
from fixtures.plugin import on_profiles

# The book's printed top five, from the registry: ' jug' 0.1355, ' cup' 0.1051, ...
BOOK_TOP5 = {" " + q.removeprefix("p_"): p for q, p in registry.get("DIST-MILK").book.items() if q.startswith("p_")}


@pytest.mark.claim("DIST-MILK")
@on_profiles("stand-in", "book")
def test_soft_label_after_she_poured_the_milk_into_the(claim, profile):
    """DIST-MILK: '"She poured the milk into the" -> ' jug' 0.1355 ' cup' 0.1051 ' bowl' 0.0605 ' large' 0.0380 ' milk' 0.0360'."""
    logits = distill.next_token_logits(profile.model, profile.tokenizer)
    words = distill.word_probabilities(logits, profile.tokenizer)
    top = distill.top_k(logits, profile.tokenizer, 5)
    claim.table(
        f"Next token after {distill.MILK_PROMPT!r} ({profile.name})",
        ["rank", "token", "p", "book word", "its p here (rank)", "book p"],
        [[i + 1, repr(t), f"{p:.4f}", repr(w.word), f"{w.prob:.4f} ({w.rank})", f"{BOOK_TOP5[w.word]:.4f}"] for i, ((t, p), w) in enumerate(zip(top, words))],
    )
    multi = [w.word for w in words if len(w.token_ids) > 1]
    if multi:
        claim.note(f"{profile.name}: {', '.join(map(repr, multi))} take more than one token; the probability of the first is reported.")
    claim.verify(
        profile.name,
        **{f"p_{w.word.strip()}": w.prob for w in words},
        order=[w.word.strip() for w in sorted(words, key=lambda w: -w.prob)],
        top1_prob=top[0][1],
        runner_up_mass=sum(p for _, p in top[1:]),
        top5=[[t, round(p, 4)] for t, p in top],
    )


@pytest.mark.claim("DIST-TEMPERATURE")
@on_profiles("stand-in", "book")
def test_temperature_two_takes_the_square_root(claim, profile):
    """DIST-TEMPERATURE: "the ratio between the top token and the third falls from 2.24 at T = 1 to 1.50 at T = 2, the square root of the first"."""
    book = registry.get("DIST-TEMPERATURE").book
    logits = distill.next_token_logits(profile.model, profile.tokenizer)
    r1 = distill.rank_ratio(distill.distribution(logits, book["t1"]))
    r2 = distill.rank_ratio(distill.distribution(logits, book["t2"]))
    claim.verify(
        profile.name,
        ratio_t1=r1,
        ratio_t2=r2,
        sqrt_of_ratio_t1=math.sqrt(r1),
        sqrt_identity_err=distill.root_identity_error(logits, book["t2"]),
        sqrt_identity_err_over_bound=distill.root_identity_error(logits, book["t2"]) / max(_root_bounds(logits, book["t2"], 20)),
        order_unchanged=distill.order_unchanged(logits, book["t2"]),
    )


@given(st.lists(st.floats(-30, 30, width=32), min_size=3, max_size=64, unique=True), st.floats(0.25, 8.0))
def test_temperature_takes_a_root_of_every_ratio(logits, t):
    """A plain property of the package (the claim above is checked on measured logits)."""
    z = torch.tensor(logits, dtype=torch.float32)
    p1, pt = distill.distribution(z), distill.distribution(z, t)
    i, j = int(torch.argmax(z)), int(torch.argmin(z))
    got, want = float(pt[i] / pt[j]), float(p1[i] / p1[j]) ** (1 / t)
    assert abs(got / want - 1) <= _root_bound(z, t, i, j)
    assert distill.order_unchanged(z, t)


def _root_bound(logits: torch.Tensor, t: float, i: int, j: int) -> float:
    """Relative bound of |(p_T(i) / p_T(j)) / (p_1(i) / p_1(j))^(1/T) - 1| in float64 (logits exact in float64).

    softmax(z / T) divides (u |z / T|), subtracts the max (u |a|, a = z / T - max), exponentiates
    (2u: 1 ulp) and divides by the sum; in the ratio of two probabilities the sum cancels, leaving
    u (|z_i / T| + |z_j / T| + |a_i| + |a_j|) + 4u + 2u for the two divisions and 1u for the ratio;
    the root takes 1/T of the T = 1 ratio's error plus 2u (pow); the final quotient 1u.
    """
    u = rounding.unit_roundoff(torch.float64)
    z = logits.double()

    def ratio_err(temp):
        x = z / temp
        a = x - x.max()
        return u * (x[i].abs() + x[j].abs() + a[i].abs() + a[j].abs() + 7)

    return float(ratio_err(t) + ratio_err(1.0) / t + 3 * u)


def _root_bounds(logits: torch.Tensor, t: float, k: int) -> list[float]:
    """:func:`_root_bound` of the top token against each of ranks 2..k (the pairs ``distill.root_identity_error`` reads)."""
    order = torch.argsort(logits.double(), descending=True)[:k].tolist()
    return [_root_bound(logits, t, order[0], j) for j in order[1:]]
