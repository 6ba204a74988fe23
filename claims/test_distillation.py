"""Section 7 of the chapter: the teacher's soft labels and what temperature does to them."""

import math

import pytest
import torch

from cheapinfer.chapter.distillation import distill
from cheapinfer.harness import registry
from cheapinfer.testing import on_profiles

# The book's printed top five, from the registry: ' jug' 0.1355, ' cup' 0.1051, ...
BOOK_TOP5 = {" " + q.removeprefix("p_"): p for q, p in registry.get("DIST-MILK").book.items() if q.startswith("p_")}


@pytest.mark.claim("DIST-MILK")
@on_profiles("stand-in", "book")
def test_soft_label_after_she_poured_the_milk_into_the(claim, profile):
    """DIST-MILK: '"She poured the milk into the" -> ' jug' 0.1355 ' cup' 0.1051 ' bowl' 0.0605 ' large' 0.0380 ' milk' 0.0360'."""
    logits, after_prompt = distill.logits_read_after_the_prompt(profile.model, profile.tokenizer)
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
        reads_after_the_prompt=after_prompt,
    )


@pytest.mark.claim("DIST-TEMPERATURE")
@on_profiles("stand-in", "book")
def test_temperature_two_takes_the_square_root(claim, profile):
    """DIST-TEMPERATURE: "the ratio between the top token and the third falls from 2.24 at T = 1 to 1.50 at T = 2, the square root of the first"."""
    book = registry.get("DIST-TEMPERATURE").book
    logits, after_prompt = distill.logits_read_after_the_prompt(profile.model, profile.tokenizer)
    r1 = distill.rank_ratio(distill.distribution(logits, book["t1"]))
    r2 = distill.rank_ratio(distill.distribution(logits, book["t2"]))
    claim.verify(
        profile.name,
        ratio_t1=r1,
        ratio_t2=r2,
        sqrt_of_ratio_t1=math.sqrt(r1),
        sqrt_identity_err=distill.root_identity_error(logits, book["t2"]),
        sqrt_identity_err_over_bound=distill.root_identity_error(logits, book["t2"]) / max(_root_bounds(logits, book["t2"], 20)),
        mass_err_over_bound=max(distill.mass_error(logits, t) for t in (book["t1"], book["t2"])) / distill.mass_bound(logits.numel()),
        mass_err={t: distill.mass_error(logits, t) for t in (book["t1"], book["t2"])},
        reads_after_the_prompt=after_prompt,
    )


def _root_bounds(logits: torch.Tensor, t: float, k: int) -> list[float]:
    """:func:`_root_bound` of the top token against each of ranks 2..k (the pairs ``distill.root_identity_error`` reads)."""
    order = torch.argsort(logits.double(), descending=True)[:k].tolist()
    return [distill.root_ratio_bound(logits, t, order[0], j) for j in order[1:]]
