"""Does quantization hurt? (section 5): the error table's perplexity, battery and agreement."""

from __future__ import annotations

from ...chapter import stats
from ...chapter.evaluation import battery, evaluation, perplexity
from ...chapter.quantization import quant
from ..base import CONSTANT, DISABLED, RULE, STATISTIC, fault, patched, result_mapped

# ------------------------------------------------------------------------------------------------
# 5. Does quantization hurt?
# ------------------------------------------------------------------------------------------------


@fault(
    "eval-ppl-windows-overlap",
    section="evaluation",
    kind=STATISTIC,
    targets=("EVAL-TABLE",),
    what="the perplexity slides its windows with a stride of half a window and forgets to mask the overlap, so every token after the first half-window is scored twice",
)
def _eval_ppl_windows_overlap():
    import math

    import torch
    import torch.nn.functional as F

    @torch.no_grad()
    def overlapping(model, ids, window=perplexity.WINDOW):
        device = next(model.parameters()).device
        inputs = ids[:-1].unfold(0, window, window // 2).to(device)  # [W', window], windows overlapping by half
        targets = ids[1:].unfold(0, window, window // 2).to(device)
        logits = model(input_ids=inputs, use_cache=False).logits
        return math.exp(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).item())

    with patched(perplexity, "perplexity", overlapping):
        yield


@fault(
    "eval-agreement-off-by-one",
    section="evaluation",
    kind=RULE,
    targets=("EVAL-INT8-FREE", "EVAL-AGREEMENT", "SPEC-ALPHA"),
    what="agreement compares the model's guess at position t (which predicts t + 1) with the reference token at t: the logits are not shifted",
)
def _eval_agreement_off_by_one():
    def unshifted(pred_row, continuation):
        start = len(continuation.prompt)  # should be start - 1
        return pred_row[start : start + len(continuation.tokens)]

    with patched(evaluation, "aligned_guesses", unshifted):
        yield


@fault(
    "eval-agreement-free-running",
    section="evaluation",
    kind=RULE,
    targets=("EVAL-AGREEMENT",),
    what="agreement compares each scheme's own greedy continuation of the prompt with the reference's tokens, instead of its guess at the reference's context: once a scheme leaves the reference's path, every later position is judged on another text",
)
def _eval_agreement_free_running():
    def free_running(model, continuations):
        return [[g == t for g, t in zip(evaluation.greedy(model, c.prompt, len(c.tokens)), c.tokens)] for c in continuations]

    with patched(evaluation, "agreement_by_position", free_running):
        yield


@fault(
    "eval-agreement-scores-the-reference",
    section="evaluation",
    kind=RULE,
    targets=("EVAL-AGREEMENT",),
    what="every row's agreement pass runs the table's reference model instead of the row's quantized one (a variable captured from the enclosing scope), so every scheme agrees at every position",
)
def _eval_agreement_scores_the_reference():
    real_init, real_agreement = evaluation.Table.__init__, evaluation.agreement_by_position
    reference: dict[str, object] = {}

    def init(self, model, *args, **kwargs):
        reference["model"] = model
        real_init(self, model, *args, **kwargs)

    def on_the_reference(model, continuations):
        return real_agreement(reference.get("model", model), continuations)

    with patched(evaluation.Table, "__init__", init), patched(evaluation, "agreement_by_position", on_the_reference):
        yield


@fault(
    "eval-battery-padded-right",
    section="evaluation",
    kind=RULE,
    targets=("EVAL-TABLE",),
    what="the battery's batch is padded on the right (a tokenizer's default side) instead of the left, so the short questions are continued after their padding",
)
def _eval_battery_padded_right():
    def right_padded(padded):
        ids, mask = padded
        for i in range(len(ids)):  # the bug: each row's padding moved after its tokens
            pad = int((mask[i] == 0).sum())
            ids[i], mask[i] = ids[i].roll(-pad), mask[i].roll(-pad)
        return ids, mask

    with result_mapped(battery, "_left_padded", right_padded):
        yield


@fault(
    "eval-mcnemar-counts-ties",
    section="evaluation",
    kind=STATISTIC,
    targets=("EVAL-INT8-TENSOR",),
    what="McNemar's test is run over all questions instead of the discordant ones: questions both schemes answer alike count as trials, so 'no change' looks like a significant one",
)
def _eval_mcnemar_counts_ties():
    from scipy import stats as scipy_stats

    def over_all(first, second):
        lost = sum(a and not b for a, b in zip(first, second))
        gained = sum(b and not a for a, b in zip(first, second))
        return stats.PairedChange(lost, gained, float(scipy_stats.binomtest(lost, len(first), 0.5).pvalue))

    with patched(stats, "mcnemar_exact", over_all):
        yield


@fault(
    "eval-nf4-codebook-read-from-the-top",
    section="evaluation",
    kind=CONSTANT,
    targets=("EVAL-NOISE", "EVAL-GRANULARITY"),
    what="the NF4 codes index the codebook from its top level (15 - i for i), as a table stored in descending order would be read: every NF4 weight comes back near its own negative, and NF4's answers in the battery with it",
)
def _eval_nf4_codebook_from_the_top():
    real = quant.code_values

    def from_the_top(codes, s):
        return quant.nf4_codebook(device=codes.device)[7 - codes.long()] if s.kind == "nf4" else real(codes, s)

    with patched(quant, "code_values", from_the_top):
        yield


@fault(
    "eval-quantization-not-applied",
    section="evaluation",
    kind=DISABLED,
    targets=("EVAL-INT4-COLLAPSE", "EVAL-GRANULARITY"),
    what="the quantized copy writes its fake-quantized weights into a detached clone, so every scheme's model keeps the full-precision weights",
)
def _eval_quantization_not_applied():
    import copy

    def unquantized(model, scheme):
        clone = copy.deepcopy(model)
        for p in quant.projection_weights(clone).values():
            p.detach().clone().copy_(quant.fake_quantize(p, scheme))  # written into a copy that is thrown away
        clone.eval()
        clone.requires_grad_(False)
        return clone

    with patched(quant, "quantized_copy", unquantized):
        yield
