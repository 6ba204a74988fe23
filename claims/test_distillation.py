"""Section 7 of the chapter: the teacher's soft labels and what temperature does to them."""

import math

import pytest
import torch
from hypothesis import given, strategies as st

from cheapinfer import distill, registry
from fixtures.plugin import on_profiles

# The book's printed top five, from the registry: ' jug' 0.1355, ' cup' 0.1051, ...
BOOK_TOP5 = {" " + q.removeprefix("p_"): p for q, p in registry.get("DIST-MILK").book.items()}


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
        order_unchanged=distill.order_unchanged(logits, book["t2"]),
    )


@given(st.lists(st.floats(-30, 30, width=32), min_size=3, max_size=64, unique=True), st.floats(0.25, 8.0))
def test_temperature_takes_a_root_of_every_ratio(logits, t):
    """A plain property of the package (the claim above is checked on measured logits)."""
    z = torch.tensor(logits, dtype=torch.float32)
    p1, pt = distill.distribution(z), distill.distribution(z, t)
    i, j = int(torch.argmax(z)), int(torch.argmin(z))
    assert float(pt[i] / pt[j]) == pytest.approx(float(p1[i] / p1[j]) ** (1 / t), rel=1e-9)
    assert distill.order_unchanged(z, t)
