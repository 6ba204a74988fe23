"""Section 6 of the chapter: speculative decoding.

The arithmetic (expected tokens, net speedup, the book's two worked numbers), the sampling rule,
and a real greedy speculative loop with every quantized stand-in as draft for the reference.
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from scipy import stats

from cheapinfer import SEED
from cheapinfer.chapter.evaluation import evaluation
from cheapinfer.chapter.quantization.quant import SCHEMES
from cheapinfer.chapter.speculative import speculative as spec
from cheapinfer.harness import registry
from cheapinfer.runtime import evidence, rounding, timing
from cheapinfer.testing import on_profiles

ALPHAS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
GAMMAS = (1, 2, 4, 8)
DRAFTS = SCHEMES[1:]
CLOSED_FORM_PAIRS = 200


@pytest.mark.claim("SPEC-VERIFY-COST")
def test_verifying_gamma_tokens_costs_about_one_pass(claim, twin, timed):
    """SPEC-VERIFY-COST: "verifying a proposed sequence of gamma tokens costs one forward pass over gamma positions, a
    matrix-matrix product, barely more expensive than the pass over one"."""
    context = 128
    variants = spec.verify_callables(twin.model, context, widths=(1, 5, 9), seed=SEED)
    samples = timed(variants, rounds=5, warmup=1, quantities=spec.verify_costs, forwards_of=twin.model)
    used = evidence.traced_each(twin.model, variants)  # each timed pass once more, traced, outside the clock
    claim.note(f"the timed verification passes, traced once: {evidence.describe(used)}")
    claim.note(evidence.describe_timed(samples, "verification pass"))
    one = samples["k=1"].median
    found = timing.estimates(samples, spec.verify_costs)
    claim.verify(
        "twin",
        **evidence.conditions(used),
        **evidence.timed_forwards(samples),
        **timing.measured(found),
        rounds=found["cost"].rounds,
        cost_gamma8=samples["k=9"].median / one,
        seconds_one_position=one,
        seconds_5_positions=samples["k=5"].median,
        seconds_9_positions=samples["k=9"].median,
        context=context,
        dtype=str(twin.dtype),
    )


@pytest.mark.claim("SPEC-EXACT-GREEDY")
@on_profiles("stand-in", "book")
def test_greedy_speculation_yields_the_targets_tokens(claim, profile, reference_continuations, speculative_runs, quantized_variant):
    """SPEC-EXACT-GREEDY: "with greedy decoding that is obvious: a token is only accepted if the target would have produced it"."""
    conts = reference_continuations(profile)
    runs = speculative_runs(profile)
    used = evidence.combine(*(e for d in DRAFTS for r in runs[d] for e in r.evidence.values()))
    claim.note(f"every target and draft pass of the loop, traced: {evidence.describe(used)}")
    judge = rounding.GreedyJudge(profile.model)  # equal tokens, or a difference at a near-tie of the two paths' rounding
    compared = {d: [judge(c.prompt, c.tokens, r.tokens) for r, c in zip(runs[d], conts)] for d in DRAFTS}
    same = {d: all(c.agree for c in cs) for d, cs in compared.items()}
    # transformers' own assisted generation, on the first prompt, with the best and a middling draft
    first = conts[0]
    assisted = {}
    for d in ("int8-row", "nf4"):
        draft = quantized_variant(profile, d)
        compared[f"assisted, {d}"] = [judge(first.prompt, first.tokens[:24], spec.assisted_generate(profile.model, draft, first.prompt, 24))]
        assisted[d] = compared[f"assisted, {d}"][0].agree
    near = [f"{d}, prompt {i}: {c.describe()}" for d, cs in compared.items() for i, c in enumerate(cs) if not c.equal]
    claim.note("Every run gave the target's own tokens." if not near else "Where a run's tokens differ from the target's: " + "; ".join(near))
    claim.note(
        f"Speculative loop: draft proposes gamma = {spec.RUN_GAMMA} tokens greedily from its KV cache, the target verifies them in one "
        "cached forward pass, both caches are cropped to the kept sequence. Compared token by token with the target's plain "
        "greedy generate() on 3 prompts x 48 tokens, and on the first prompt (24 tokens) with transformers' assisted generation."
    )
    claim.verify(
        profile.name,
        **evidence.conditions(used),
        identical=all(same.values()) and all(assisted.values()),
        identical_per_draft=same,
        assisted_identical=assisted,
        tokens_compared=sum(len(c.tokens) for c in conts),
    )


@pytest.mark.claim("SPEC-EXACT-SAMPLING")
def test_modified_acceptance_rule_samples_the_target(claim):
    """SPEC-EXACT-SAMPLING: "with sampling it requires a modified acceptance rule, and Leviathan et al. prove the resulting distribution is exactly the target's"."""
    g = torch.Generator().manual_seed(SEED)
    closed_form = spec.closed_form_error(CLOSED_FORM_PAIRS, g)
    vocab, draws = 8, 400_000
    p = torch.rand(vocab, generator=g, dtype=torch.float64) ** 2  # squared uniforms: uneven, some small
    q = torch.rand(vocab, generator=g, dtype=torch.float64) ** 2
    p, q = p / p.sum(), q / q.sum()
    out = spec.speculative_sample(p, q, draws, g)
    counts = torch.bincount(out, minlength=vocab).double()
    chi2 = stats.chisquare(counts.numpy(), (draws * p).numpy())
    tv = 0.5 * float((counts / draws - p).abs().sum())
    naive = torch.bincount(torch.multinomial(q, draws, replacement=True, generator=g), minlength=vocab).double()
    claim.note(
        f"Closed form of the rule's output law against p on {CLOSED_FORM_PAIRS} seeded (p, q) pairs of 2 to 12 tokens, half with zeros. "
        f"Sampling: vocabulary {vocab}, p and q drawn once from the suite seed, {draws:,} independent speculative positions; "
        f"chi-square goodness of fit against p (level 0.001) and total variation distance. Keeping every draft token instead "
        f"would give TV {0.5 * float((naive / draws - p).abs().sum()):.3f} (TV(p, q) = {0.5 * float((p - q).abs().sum()):.3f})."
    )
    claim.verify(
        "arithmetic",
        exact=bool(closed_form <= spec.law_rounding_bound(CLOSED_FORM_MAX_VOCAB) and chi2.pvalue >= 1e-3 and tv < 0.01),
        closed_form_max_err=closed_form,
        chi2_pvalue=float(chi2.pvalue),
        tv=tv,
        tv_p_q=0.5 * float((p - q).abs().sum()),
        acceptance=float(torch.minimum(p, q).sum()),
    )


@pytest.mark.claim("SPEC-EXPECTED")
def test_expected_tokens_per_pass(claim):
    """SPEC-EXPECTED: "the expected number of tokens accepted per verification pass, at draft length gamma, is (1 - a^(g+1)) / (1 - a)"."""
    rng = np.random.default_rng(SEED)
    passes = 200_000
    z = {}
    for a in ALPHAS:
        for g in GAMMAS:
            kept = spec.simulate_tokens_per_pass(a, g, passes, rng)
            z[f"a={a},g={g}"] = (kept.mean() - spec.expected_tokens(a, g)) / (kept.std(ddof=1) / np.sqrt(passes))
    claim.verify(
        "arithmetic",
        max_abs_z=float(max(abs(v) for v in z.values())),
        series_max_err=spec.series_error(ALPHAS, GAMMAS),
        series_err_over_bound=max(abs(spec.expected_tokens(a, g) - sum(a**k for k in range(g + 1))) / spec.expected_tokens_rounding_bound(a, g) for a in ALPHAS for g in GAMMAS),
        cells=len(z),
        passes_per_cell=passes,
    )


@pytest.mark.claim("SPEC-SPEEDUP")
def test_net_speedup_divides_by_the_drafts_cost(claim):
    """SPEC-SPEEDUP: "the net speedup divides that by the draft's own cost, a fraction c of the target per token"."""
    rng = np.random.default_rng(SEED)
    c, want = 0.2, 100_000
    errors = {(a, g): abs(spec.simulate_speedup(a, g, c, want, rng) / spec.speedup(a, g, c) - 1) for a in ALPHAS for g in GAMMAS}
    header = ["alpha"] + [f"{h} g={g}" for g in GAMMAS for h in ("E", "x")]
    rows = [[f"{a:.2f}"] + [f"{v:.2f}" for v in row] for a, row in zip(ALPHAS, spec.grid(ALPHAS, GAMMAS, c))]
    claim.table(f"Expected tokens per pass (E) and net speedup (x) over alpha x gamma, c = {c}", header, rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    fine = np.linspace(0.0, 0.99, 100)
    for g in GAMMAS:
        ax.plot(fine, [spec.speedup(a, g, c) for a in fine], label=f"gamma = {g}")
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xlabel("acceptance rate alpha")
    ax.set_ylabel(f"net speedup (c = {c})")
    ax.set_title("Speculative decoding: speedup over alpha x gamma")
    ax.legend()
    claim.figure("spec-speedup-grid", fig)
    claim.verify("arithmetic", max_rel_err=max(errors.values()), c=c, tokens_per_cell=want)


@pytest.mark.claim("SPEC-SLOWDOWN")
def test_low_acceptance_makes_generation_slower(claim):
    """SPEC-SLOWDOWN: "at 30% acceptance with a draft costing one fifth of the target, you pay for five forward passes and keep 1.4 tokens"."""
    book = registry.get("SPEC-SLOWDOWN").book
    alpha, c, gamma = book["alpha"], book["c"], book["gamma"]
    simulated = spec.simulate_tokens_per_pass(alpha, gamma, 200_000, np.random.default_rng(SEED))
    target, draft = spec.counting_pair()
    count = spec.forwards_per_pass(target, draft, list(range(2, 20)), 100, gamma)
    full = sorted(set(count["full"]))
    claim.verify(
        "arithmetic",
        passes=full[0] if len(full) == 1 else full,
        loop_count_is_traced=count["loop"] == count["traced"] and count["trailing_drafts"] == 0,
        loop_passes={"target": count["loop"][0], "draft": count["loop"][1], "full_passes": len(count["full"]), "alpha": round(count["alpha"], 3)},
        **spec.slowdown(alpha, gamma, c),
        kept_tokens_simulated=float(simulated.mean()),
    )


@pytest.mark.claim("SPEC-GAMMA8")
def test_gamma_8_gains_at_high_acceptance_and_loses_at_low(claim):
    """SPEC-GAMMA8: "at 90% acceptance gamma = 8 is worth 3.40x and at 30% it is worth 0.79x: the same configuration, gain or loss"."""
    book = registry.get("SPEC-GAMMA8").book
    c, gamma = book["c"], book["gamma"]  # the prose's c = 0.2 ("one fifth of the target")
    high, low = book["alpha_high"], book["alpha_low"]
    printed = {high: book["speedup_a09"], low: book["speedup_a03"]}
    implied = {a: spec.implied_c(v, a, gamma) for a, v in printed.items()}
    bands = {a: spec.implied_c_interval(v, a, gamma, 0.005) for a, v in printed.items()}
    claim.note(
        f"With the prose's c = {c} the formula gives {spec.speedup(high, gamma, c):.2f}x and {spec.speedup(low, gamma, c):.2f}x. "
        "The printed speedups imply c = "
        + ", ".join(f"{implied[a]:.4f} (band {bands[a][0]:.4f}..{bands[a][1]:.4f}) at alpha = {a}" for a in implied)
        + f"; with c = 0.1 the formula gives {spec.speedup(high, gamma, 0.1):.2f}x and {spec.speedup(low, gamma, 0.1):.2f}x. "
        "That c is inferred from the printed numbers themselves, so it is reported, not checked."
    )
    claim.verify(
        "arithmetic",
        speedup_a09=spec.speedup(high, gamma, c),
        speedup_a03=spec.speedup(low, gamma, c),
        c_implied_a09=implied[high],
        c_implied_a03=implied[low],
        speedup_a09_c01=spec.speedup(high, gamma, 0.1),
        speedup_a03_c01=spec.speedup(low, gamma, 0.1),
    )


@pytest.mark.claim("SPEC-ALPHA")
@on_profiles("stand-in", "book")
def test_acceptance_rate_is_the_agreement_column(claim, profile, reference_continuations, speculative_runs, quantized_variant):
    """SPEC-ALPHA: "Everything depends on the acceptance rate alpha, which is measurable: it is the agreement column
    above ... every quantized model as draft for the full-precision target, over 144 generated positions"."""
    conts = reference_continuations(profile)
    runs = speculative_runs(profile)
    used = evidence.combine(*(e for d in DRAFTS for r in runs[d] for e in r.evidence.values()))
    alpha = {d: spec.acceptance_rate(runs[d]) for d in DRAFTS}
    hits = {d: evaluation.agreement(quantized_variant(profile, d), conts) for d in DRAFTS}  # the table's column, one forward each
    agree = {d: h / n for d, (h, n) in hits.items()}
    rows = []
    for d in DRAFTS:
        evaluated = sum(r.evaluated for r in runs[d])
        kept = sum(len(r.tokens) for r in runs[d]) / sum(r.target_passes for r in runs[d])
        rows.append([d, f"{alpha[d]:.3f} ({sum(r.accepted for r in runs[d])}/{evaluated})", f"{agree[d]:.3f} ({hits[d][0]}/{hits[d][1]})", f"{kept:.2f}", f"{spec.expected_tokens(alpha[d], spec.RUN_GAMMA):.2f}"])
    claim.table(f"Acceptance per draft, gamma = {spec.RUN_GAMMA} ({profile.name})", ["draft", "alpha (accepted/judged)", "agreement", "tokens per target pass", "E at that alpha"], rows)
    claim.verify(
        profile.name,
        **evidence.conditions(used),
        positions=sum(len(c.tokens) for c in conts),
        alpha_int8_row=alpha["int8-row"],
        max_alpha_gap=max(abs(alpha[d] - agree[d]) for d in DRAFTS),
        every_pass_keeps_one_target_token=all(spec.passes_keep_one_target_token(r) for d in DRAFTS for r in runs[d]),
        alpha=alpha,
        agreement=agree,
    )


@pytest.mark.claim("SPEC-REAL-SLOWDOWN")
def test_a_low_acceptance_draft_slows_generation_down(claim, stand_in, quantized_stand_in, timed):
    """SPEC-REAL-SLOWDOWN: "speculative decoding can make generation slower"."""
    draft = quantized_stand_in["int4-tensor"].model
    prompt = stand_in.tokenizer("The river rises in the mountains to the north and flows south through")["input_ids"]
    gamma, new = 4, 8
    probe = spec.generate_traced(stand_in.model, prompt, new, draft=draft, gamma=gamma)  # the timed loop, once, traced
    used = evidence.combine(*probe.evidence.values())
    def slowdown(t) -> dict[str, float]:  # one set of generation times -> the claim's clocked ratio
        return {"slowdown": t["speculative"] / t["plain"]}

    samples = timed(
        {
            "plain": lambda: spec.generate(stand_in.model, prompt, new),
            "speculative": lambda: spec.generate(stand_in.model, prompt, new, draft=draft, gamma=gamma),
        },
        rounds=3,
        warmup=1,
        quantities=slowdown,
        forwards_of=stand_in.model,
    )
    found = timing.estimates(samples, slowdown)
    claim.note(
        "Draft: the stand-in with INT4 per-tensor weights, which accepts almost nothing. The draft is fake-quantized, so it "
        "costs as much as the target (c ~ 1): the formula predicts E / (gamma c + 1) ~ 1 / 5."
    )
    claim.note(f"the speculative loop, traced once: {evidence.describe(used)}")
    claim.note(evidence.describe_timed(samples, f"generation of {new} tokens"))
    claim.verify(
        "stand-in",
        **evidence.conditions(used),
        **evidence.timed_forwards(samples),
        **timing.measured(found),
        rounds=found["slowdown"].rounds,
        alpha=probe.alpha,
        predicted_speedup_c1=spec.speedup(probe.alpha if probe.evaluated else 0.0, gamma, 1.0),
        seconds_plain=samples["plain"].median,
        seconds_speculative=samples["speculative"].median,
        gamma=gamma,
        new_tokens=new,
    )


# ------------------------------------------------------------------------------------------------
# properties of the arithmetic (plain tests of the package; the claims above hand their measurements to the registry)
# ------------------------------------------------------------------------------------------------


CLOSED_FORM_MAX_VOCAB = 12  # spec.closed_form_error's default
