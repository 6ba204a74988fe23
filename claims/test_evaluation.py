"""Section 5 of the chapter: does quantization hurt? One table, seven schemes, three columns.

The table (perplexity on 2,048 held-out tokens, a 16-question battery, agreement on 144 positions)
is built once per profile by the ``evaluation_table`` fixture; each claim below reads its rows.
"""

import math

import pytest

from cheapinfer.chapter import stats
from cheapinfer.chapter.evaluation import battery, evaluation, perplexity
from cheapinfer.runtime import rounding
from cheapinfer.testing import on_profiles

INT4 = ("int4-tensor", "int4-row", "int4-g128", "nf4")


def _ppls(table, schemes):
    return {f"ppl_{s.replace('-', '_')}": table.ppl(s) for s in schemes}


@pytest.mark.claim("EVAL-TABLE")
@on_profiles("stand-in", "book")
def test_seven_schemes_by_perplexity_battery_and_agreement(claim, profile, evaluation_table, corpus_source):
    """EVAL-TABLE: "perplexity on 2,048 held-out tokens of English prose, a battery of 16 short factual
    questions under greedy decoding, and the fraction of tokens on which the quantized model agrees"."""
    table = evaluation_table(profile)
    claim.table(f"Does quantization hurt? ({profile.name})", table.header(), table.table_rows())
    claim.note(
        f"Corpus: {corpus_source}, cleaned (headers, page markers, hyphenated line breaks, whitespace); the first "
        f"{table.tokens:,} predicted tokens of the article. Perplexity: token-level exp(mean NLL), "
        f"{perplexity.WINDOWS} non-overlapping windows of {perplexity.WINDOW} tokens (stride {perplexity.WINDOW}) in one batch, "
        f"each window restarting its context; cross-checked on the reference against transformers' own shifted loss. "
        f"Battery: {len(battery.BATTERY)} questions through the chat template, greedy, "
        f"first {battery.ANSWER_TOKENS} tokens, stock repetition penalty {table.stock_penalty:g}"
        + (" (this model's generation config sets none, so the 'penalty off' column repeats the stock one)" if table.stock_penalty == 1.0 else "")
        + f". Agreement: {len(table.continuations)} prompts x {evaluation.AGREEMENT_TOKENS} reference greedy tokens, teacher-forced. "
        "The sizes (tokens, questions, positions, schemes) are the suite's settings, chosen to match the book: reported, not checked."
    )
    ref = table["reference"]
    library, bound = table.cross_check.library_ppl, table.cross_check.ln_bound
    # The batch computes what each question asked alone computes: the most padded one, without the penalty.
    q = battery.shortest_question(profile.tokenizer)
    asked = battery.question_ids(profile.tokenizer, q)
    alone = rounding.GreedyJudge(profile.model)(asked, battery.until_end(profile.model, evaluation.greedy(profile.model, asked, battery.ANSWER_TOKENS)),
                                                battery.until_end(profile.model, ref.battery_no_penalty.tokens[q]))
    claim.note(f"battery question {q} (the shortest, padded most in the batch), asked alone: "
               + ("the batch's answer, token for token" if alone.equal else alone.describe()))
    claim.note(f"perplexity against transformers' own loss: |ln ratio| {abs(math.log(ref.ppl / library)):.3g}, its first-order rounding bound {bound:.3g}")
    claim.verify(
        profile.name,
        ppl_vs_library=abs(ref.ppl / library - 1),
        ppl_vs_library_over_bound=abs(math.log(ref.ppl / library)) / bound,
        ppl_ref=ref.ppl,
        ppl_ref_library=library,
        schemes=len(table.rows),
        tokens=table.tokens,
        questions=ref.battery.n,
        positions=ref.positions,
        seconds_per_scheme={s: round(t, 1) for s, t in table.seconds.items() if s in table.schemes},
        seconds_cross_check=round(table.seconds["cross-check"], 1),
        battery_batch_equals_alone=alone.agree,
        battery_question_alone=q,
        **_ppls(table, table.schemes),
    )


@pytest.mark.claim("EVAL-INT8-FREE")
@on_profiles("stand-in", "book")
def test_per_row_int8_is_free(claim, profile, evaluation_table):
    """EVAL-INT8-FREE: "Per-row INT8 scores 22.96 against the reference's 23.08 ... on the repository's public-domain
    corpus the same two schemes come out at 22.24 against 22.18 ... agrees with the full-precision model on 142 of 144 tokens"."""
    table = evaluation_table(profile)
    ref, row = table["reference"], table["int8-row"]
    claim.verify(
        profile.name,
        ppl_ref=ref.ppl,
        ppl_int8_row=row.ppl,
        ppl_gap_rel=abs(row.ppl / ref.ppl - 1),
        ppl_gap_sign="+" if row.ppl >= ref.ppl else "-",
        agreement=row.agree,
        agreement_frac=row.agreement,
        positions=row.positions,
    )


@pytest.mark.claim("EVAL-INT8-TENSOR")
@on_profiles("stand-in", "book")
def test_per_tensor_int8_costs_half_a_point_and_no_answers(claim, profile, evaluation_table):
    """EVAL-INT8-TENSOR: "one scale per matrix costs 0.5 perplexity points and no answers in the battery"."""
    table = evaluation_table(profile)
    ref, t8 = table["reference"], table["int8-tensor"]
    change = stats.mcnemar_exact(ref.battery.correct, t8.battery.correct)
    claim.verify(
        profile.name,
        ppl_cost=t8.ppl - ref.ppl,
        ppl_ratio=t8.ppl / ref.ppl,
        battery_ref=ref.battery.score,
        battery_int8_tensor=t8.battery.score,
        battery_lost=change.lost,
        battery_gained=change.gained,
        battery_change_p=change.p_value,
        agreement=t8.agree,
    )


@pytest.mark.claim("EVAL-INT4-COLLAPSE")
@on_profiles("stand-in", "book")
def test_per_tensor_int4_destroys_the_model(claim, profile, evaluation_table):
    """EVAL-INT4-COLLAPSE: "INT4 with one scale per tensor destroys the model. Perplexity 365 million: not degraded, wiped out"."""
    table = evaluation_table(profile)
    claim.verify(
        profile.name,
        ppl=table.ppl("int4-tensor"),
        ppl_millions=table.ppl("int4-tensor") / 1e6,
        ppl_ratio=table.ppl("int4-tensor") / table.ppl("reference"),
        battery=table["int4-tensor"].battery.score,
        agreement=table["int4-tensor"].agree,
    )


@pytest.mark.claim("EVAL-GRANULARITY")
@on_profiles("stand-in", "book")
def test_granularity_orders_the_four_bit_schemes(claim, profile, evaluation_table):
    """EVAL-GRANULARITY: "per-tensor 365,416,000, per-row 46.18, per-group-of-128 31.08, NF4 24.55 ... a factor of fifteen million"."""
    table = evaluation_table(profile)
    ppl = [table.ppl(s) for s in INT4]
    claim.verify(
        profile.name,
        granularity_order=ppl[0] > ppl[1] > ppl[2],
        nf4_best=ppl[3] < ppl[2],
        worst_over_best=max(ppl) / min(ppl),
        **_ppls(table, INT4),
    )


@pytest.mark.claim("EVAL-NOISE")
@on_profiles("stand-in", "book")
def test_one_question_in_sixteen_distinguishes_nothing(claim, profile, evaluation_table):
    """EVAL-NOISE: "between NF4 and group-128 INT4 the perplexity gap is 6.5 points and the battery differs by one
    question, and the confidence interval of chapter 4 says that one question in sixteen distinguishes nothing"."""
    table = evaluation_table(profile)
    nf4, g128 = table["nf4"], table["int4-g128"]
    res = stats.resolution(nf4.battery.n)
    change = stats.mcnemar_exact(g128.battery.correct, nf4.battery.correct)
    off = stats.mcnemar_exact(g128.battery_no_penalty.correct, nf4.battery_no_penalty.correct)
    stock_order = (nf4.battery.score > g128.battery.score) - (nf4.battery.score < g128.battery.score)
    off_order = (nf4.battery_no_penalty.score > g128.battery_no_penalty.score) - (nf4.battery_no_penalty.score < g128.battery_no_penalty.score)
    if table.stock_penalty == 1.0:
        claim.note(f"{profile.name}: its generation config has no repetition penalty, so turning it off changes nothing and no swap can appear.")
    claim.verify(
        profile.name,
        **_resolution(res),
        ppl_gap=g128.ppl - nf4.ppl,
        battery_gap=abs(nf4.battery.score - g128.battery.score),
        battery_nf4=nf4.battery.score,
        battery_g128=g128.battery.score,
        nf4_lost_vs_g128=change.lost,
        nf4_gained_vs_g128=change.gained,
        battery_change_p=change.p_value,
        battery_intervals_overlap=stats.intervals_overlap(nf4.battery.score, g128.battery.score, nf4.battery.n),
        interval_nf4=[round(v, 3) for v in stats.binomial_interval(nf4.battery.score, nf4.battery.n)],
        interval_g128=[round(v, 3) for v in stats.binomial_interval(g128.battery.score, g128.battery.n)],
        rows_swap_without_penalty=stock_order != 0 and off_order == -stock_order,
        battery_change_p_without_penalty=off.p_value,
        battery_no_penalty_nf4=nf4.battery_no_penalty.score,
        battery_no_penalty_g128=g128.battery_no_penalty.score,
    )


def _resolution(res: stats.Resolution) -> dict:
    return {
        "questions": res.n,
        "interval_coverage": res.interval_coverage,
        "one_question_intervals_disjoint": res.one_question_intervals_disjoint,
        "one_question_p": res.one_question_p,
        "smallest_disjoint_gap": res.smallest_disjoint_gap,
        "smallest_significant_change": res.smallest_significant_change,
    }


@pytest.mark.claim("EVAL-AGREEMENT")
@on_profiles("stand-in", "book")
def test_agreement_orders_schemes_like_perplexity(claim, profile, evaluation_table):
    """EVAL-AGREEMENT: "144 independent observations instead of 16, no ground truth needed, and it degrades smoothly"."""
    table = evaluation_table(profile)
    schemes = list(table.schemes)
    judged = _self_disagreements(profile.model, table.continuations)
    claim.note("The reference teacher-forced on its own greedy tokens chose every one again." if not judged else
               "Where the reference teacher-forced on its own greedy tokens chose another: " + "; ".join(judged))
    outcomes = {s: table[s].matches for s in schemes if s != "reference"}
    serial = stats.serial_dependence([seq for seqs in outcomes.values() for seq in seqs])
    clustered = {s: stats.design_effect(seqs) for s, seqs in outcomes.items()}
    claim.table("Are the positions independent? Per scheme: disagreements per prompt, and the intra-prompt correlation (ANOVA) with its design effect",
                ["scheme", "disagreements per prompt", "intra-prompt correlation", "design effect", "effective positions"],
                [[s, " / ".join(str(sum(not x for x in seq)) for seq in outcomes[s]), f"{d.icc:+.3f}", f"{d.design_effect:.2f}", f"{d.effective_n:.0f}"]
                 for s, d in clustered.items()])
    claim.note(f"Serial dependence: {serial.observed} adjacent positions both disagree over the {len(outcomes)} quantized schemes' prompts, "
               f"{serial.expected:.1f} expected if each prompt's outcomes were in random order; permutation p = {serial.p:.3g} "
               f"({serial.rounds:,} seeded shuffles, one-sided, level {stats.SERIAL_LEVEL}). Clustering by prompt is reported only: three prompts "
               "cannot estimate it well.")
    claim.verify(
        profile.name,
        adjacent_disagreements_p=serial.p,
        adjacent_disagreements=serial.observed,
        adjacent_disagreements_expected=serial.expected,
        smallest_effective_positions=min(d.effective_n for d in clustered.values()),
        self_disagreements_beyond_rounding=sum("DIFFER" in j for j in judged),
        reference_self_agreement=table["reference"].agreement,
        discordant_pairs=evaluation.discordant_pairs(table, schemes, min_ppl_gap=0.05),
        kendall_tau=evaluation.kendall_tau(table, schemes),
        levels_agreement_minus_battery=len({table[s].agree for s in schemes}) - len({table[s].battery.score for s in schemes}),
        agreement={s: table[s].agree for s in schemes},
        battery={s: table[s].battery.score for s in schemes},
        positions=table["reference"].positions,
    )


def _self_disagreements(model, continuations) -> list[str]:
    """The reference's own guesses, teacher-forced on its greedy tokens (the agreement column's pass and alignment),
    where they differ from those tokens, each judged against the first-order bound of its rounding
    (:func:`cheapinfer.runtime.rounding.compare_greedy`); judging stops at the first that is not a near-tie."""
    judge, judged = rounding.GreedyJudge(model), []
    for i, (c, guessed) in enumerate(zip(continuations, evaluation.teacher_forced_guesses(model, continuations))):
        guesses = guessed.tolist()
        for t in (t for t, (g, want) in enumerate(zip(guesses, c.tokens)) if g != want):
            same = judge(c.prompt + c.tokens[:t], [c.tokens[t]], [guesses[t]])
            judged.append(f"prompt {i}, token {t}: {same.describe().replace(' at token 0', '')}")
            if not same.agree:
                return judged
    return judged
