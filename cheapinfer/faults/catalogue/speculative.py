"""Speculative decoding (section 6): acceptance, verification, the loop."""

from __future__ import annotations

from ...chapter.speculative import speculative
from ..base import CONSTANT, DISABLED, RULE, STATISTIC, fault, patched, result_mapped
from .patches import MISSPELLED_HF, misspelled_while, replaying_first

# ------------------------------------------------------------------------------------------------
# 6. Speculative decoding
# ------------------------------------------------------------------------------------------------


def _spec_passes_misspelled(which: str):
    """speculative.generate whose ``which`` ("target" or "draft") passes misspell the cache keyword."""
    real_generate, real_forward = speculative.generate, speculative._forward

    def generate(target, prompt, new_tokens, draft=None, gamma=4, stop_at_eos=True):
        broken = target if which == "target" else draft

        def forward(model, tokens, cache, keep):
            if model is broken:
                with patched(speculative, "hf", MISSPELLED_HF):
                    return real_forward(model, tokens, cache, keep)
            return real_forward(model, tokens, cache, keep)

        with patched(speculative, "_forward", forward):
            return real_generate(target, prompt, new_tokens, draft=draft, gamma=gamma, stop_at_eos=stop_at_eos)

    return generate


@fault(
    "spec-verify-cost-inverted",
    section="speculative",
    kind=RULE,
    targets=("SPEC-VERIFY-COST",),
    what="the verification costs are taken the wrong way round, the pass over one position over the pass over 5 (and over 9 x the pass over 9): a wider pass then reads as cheaper than one position (about 0.45 and 0.04), which the ceilings alone pass",
)
def _spec_verify_cost_inverted():
    def inverted(costs):  # time(1) / time(5), and time(1) / (9 time(9)) = 1 / (81 x time(9) / (9 time(1)))
        return {"cost": 1 / costs["cost"], "cost_per_position_gamma8": 1 / (81 * costs["cost_per_position_gamma8"])}

    with result_mapped(speculative, "verify_costs", inverted):
        yield


@fault(
    "spec-verify-pass-replays-first",
    section="speculative",
    kind=RULE,
    targets=("SPEC-VERIFY-COST",),
    what="each repeatable verification pass runs its forward once and replays that result on every later call (a pass cached by its arguments), so the clock times no pass at any width",
)
def _spec_verify_replays():
    real = speculative.verify_callables

    def replaying(model, context, widths, seed):
        return {name: replaying_first(step) for name, step in real(model, context, widths, seed).items()}

    with patched(speculative, "verify_callables", replaying):
        yield


@fault(
    "spec-plain-generation-replayed-from-store",
    section="speculative",
    kind=RULE,
    targets=("SPEC-REAL-SLOWDOWN",),
    what="plain greedy generation (no draft) keeps a store keyed by its model, prompt and length (a response cache) and returns the stored run for a prompt it has seen without running the model, so every timed round of the baseline after the first times a lookup and speculation looks slower than ever",
)
def _spec_plain_generation_replayed():
    real, store = speculative.generate, {}

    def replaying(target, prompt, new_tokens, draft=None, gamma=4, stop_at_eos=True):
        if draft is not None:
            return real(target, prompt, new_tokens, draft=draft, gamma=gamma, stop_at_eos=stop_at_eos)
        key = (id(target), tuple(prompt), new_tokens, stop_at_eos)
        if key not in store:
            store[key] = real(target, prompt, new_tokens, stop_at_eos=stop_at_eos)
        return store[key]

    with patched(speculative, "generate", replaying):
        yield


@fault(
    "spec-target-cache-keyword-dropped",
    section="speculative",
    kind=DISABLED,
    targets=("SPEC-VERIFY-COST", "SPEC-EXACT-GREEDY", "SPEC-ALPHA", "SPEC-REAL-SLOWDOWN"),
    what="the target's verification pass hands its cache over under a keyword the model swallows: each pass scores the proposals without the sequence before them",
)
def _spec_target_cache_dropped():
    real_verify = speculative.verify_callables

    def verify_callables(*args, **kwargs):
        with patched(speculative, "hf", MISSPELLED_HF):
            made = real_verify(*args, **kwargs)
        return {name: misspelled_while(speculative, call) for name, call in made.items()}

    with patched(speculative, "generate", _spec_passes_misspelled("target")), patched(speculative, "verify_callables", verify_callables):
        yield


@fault(
    "spec-draft-cache-keyword-dropped",
    section="speculative",
    kind=DISABLED,
    targets=("SPEC-EXACT-GREEDY", "SPEC-ALPHA", "SPEC-REAL-SLOWDOWN"),
    what="the draft's passes hand its cache over under a keyword the model swallows: the draft proposes from its last token alone, the target still verifies, so every emitted token stays the target's",
)
def _spec_draft_cache_dropped():
    with patched(speculative, "generate", _spec_passes_misspelled("draft")):
        yield


@fault(
    "spec-accept-q-over-p",
    section="speculative",
    kind=RULE,
    targets=("SPEC-EXACT-SAMPLING",),
    what="the acceptance rule is written min(1, q(x) / p(x)) instead of min(1, p(x) / q(x))",
)
def _spec_accept_q_over_p():
    import torch

    with patched(speculative, "accept_probability", lambda p, q: torch.clamp(q / p, max=1.0)):
        yield


@fault(
    "spec-residual-not-normalised",
    section="speculative",
    kind=RULE,
    targets=("SPEC-EXACT-SAMPLING",),
    what="the residual distribution max(0, p - q) is used without renormalising it",
)
def _spec_residual_not_normalised():
    with patched(speculative, "residual", lambda p, q: (p - q).clamp_min(0)):
        yield


@fault(
    "spec-greedy-keeps-draft-token",
    section="speculative",
    kind=RULE,
    targets=("SPEC-EXACT-GREEDY",),
    what="on the first mismatch the greedy loop keeps the draft's token instead of the target's correction",
)
def _spec_greedy_keeps_draft_token():
    real = speculative.accept_greedy

    def keeps_draft(proposals, target_choice):
        n, kept = real(proposals, target_choice)
        if n < len(proposals):
            kept[-1] = int(proposals[n])  # the bug: the draft's token where the target's correction belongs
        return n, kept

    with patched(speculative, "accept_greedy", keeps_draft):
        yield


@fault(
    "spec-greedy-drops-target-token",
    section="speculative",
    kind=RULE,
    targets=("SPEC-ALPHA", "SPEC-SLOWDOWN"),
    what="after accepted proposals the greedy loop drops the target's own token (the correction or the bonus) and lets the next pass find it again: the emitted tokens stay the target's, each pass keeps one token fewer",
)
def _spec_greedy_drops_target_token():
    real = speculative.accept_greedy

    def drops(proposals, target_choice):
        n, kept = real(proposals, target_choice)
        return (n, kept[:-1]) if n > 0 else (n, kept)

    with patched(speculative, "accept_greedy", drops):
        yield


@fault(
    "spec-alpha-over-proposed",
    section="speculative",
    kind=STATISTIC,
    targets=("SPEC-ALPHA",),
    what="the acceptance rate divides the accepted proposals by all proposed ones, counting the proposals after a rejection (never judged) as rejected",
)
def _spec_alpha_over_proposed():
    def acceptance_rate(runs):
        proposed = sum(r.proposed for r in runs)
        return sum(r.accepted for r in runs) / proposed if proposed else float("nan")

    with patched(speculative, "acceptance_rate", acceptance_rate):
        yield


@fault(
    "spec-expected-off-by-one",
    section="speculative",
    kind=CONSTANT,
    targets=("SPEC-EXPECTED", "SPEC-SPEEDUP", "SPEC-SLOWDOWN"),
    what="the expected tokens per pass sum gamma terms, (1 - a^gamma) / (1 - a), forgetting the target's own token",
)
def _spec_expected_off_by_one():
    def gamma_terms(alpha, gamma):
        return float(gamma) if alpha == 1.0 else (1.0 - alpha**gamma) / (1.0 - alpha)

    with patched(speculative, "expected_tokens", gamma_terms):
        yield


@fault(
    "spec-kept-tokens-at-the-passes-count",
    section="speculative",
    kind=CONSTANT,
    targets=("SPEC-SLOWDOWN",),
    what="the slowdown's kept tokens, their check against the loop's rule and its speedup are computed at gamma = the printed passes ('vijf', five) instead of the draft length passes - 1, while the loop runs at four: 1.4275 tokens, which rounds to the printed 1,4 as 1.4251 does",
)
def _spec_kept_tokens_at_the_passes_count():
    real = speculative.slowdown
    with patched(speculative, "slowdown", lambda alpha, gamma, c: real(alpha, gamma + 1, c)):
        yield


@fault(
    "spec-draft-cost-per-pass",
    section="speculative",
    kind=RULE,
    targets=("SPEC-SPEEDUP", "SPEC-SLOWDOWN", "SPEC-GAMMA8"),
    what="the draft's cost is charged once per verification pass instead of once per proposed token: E / (c + 1) instead of E / (gamma c + 1)",
)
def _spec_draft_cost_per_pass():
    with patched(speculative, "speedup", lambda alpha, gamma, c: speculative.expected_tokens(alpha, gamma) / (c + 1.0)):
        yield


@fault(
    "spec-verify-pass-keeps-what-it-fed",
    section="speculative",
    kind=RULE,
    targets=("SPEC-VERIFY-COST",),
    what="the repeatable verification pass forgets to crop its cache back after scoring, so every call scores its positions after a longer history than the context it names",
)
def _spec_verify_pass_keeps_what_it_fed():
    with patched(speculative, "_crop_to", lambda cache, tokens: None):
        yield


@fault(
    "spec-verify-one-position-at-a-time",
    section="speculative",
    kind=DISABLED,
    targets=("SPEC-VERIFY-COST", "SPEC-SLOWDOWN"),
    what="the verification pass feeds the proposed positions one at a time (a loop of single-position passes) instead of one pass over all of them",
)
def _spec_verify_one_position_at_a_time():
    import torch

    real = speculative._forward

    def one_at_a_time(model, tokens, cache, keep):
        return torch.cat([real(model, [t], cache, 1) for t in tokens])[-keep:]

    with patched(speculative, "_forward", one_at_a_time):
        yield


@fault(
    "spec-draft-catch-up-forward",
    section="speculative",
    kind=RULE,
    targets=("SPEC-SLOWDOWN",),
    what="after its last proposal the draft runs one forward more, outside the loop's pass counter, to put that proposal into its own cache before the target verifies (a catch-up pass the crop then throws away): every pass costs gamma + 2 forwards",
)
def _spec_draft_catch_up_forward():
    real_forward, real_generate = speculative._forward, speculative.generate

    def generate(target, prompt, new_tokens, draft=None, gamma=4, stop_at_eos=True):
        pending: list = []  # the draft's cache and its last proposal, not yet in that cache

        def forward(model, tokens, cache, keep):
            if model is target and pending:
                d_cache, token = pending.pop()
                real_forward(draft, [token], d_cache, 1)  # the catch-up pass, which the loop does not count
            out = real_forward(model, tokens, cache, keep)
            if model is draft and model is not target:
                pending[:] = [(cache, int(out[-1]))]
            return out

        with patched(speculative, "_forward", forward):
            return real_generate(target, prompt, new_tokens, draft=draft, gamma=gamma, stop_at_eos=stop_at_eos)

    with patched(speculative, "generate", generate):
        yield


@fault(
    "spec-draft-dropped",
    section="speculative",
    kind=DISABLED,
    targets=("SPEC-REAL-SLOWDOWN",),
    what="the speculative generator drops the draft it is given and silently decodes plainly",
)
def _spec_draft_dropped():
    real = speculative.generate

    def plain(target, prompt, new_tokens, draft=None, gamma=4, stop_at_eos=True):
        return real(target, prompt, new_tokens, None, gamma, stop_at_eos)

    with patched(speculative, "generate", plain):
        yield


@fault(
    "cache-crop-does-nothing",
    section="speculative",
    kind=DISABLED,
    targets=("SPEC-VERIFY-COST", "KV-PREFILL-DECODE", "KV-DECODE-FLAT", "KV-DECODE-MEMBOUND", "KV-MEMORY-8.3X", "BAT-1-TO-16", "BAT-KNEE", "BAT-TRADEOFF", "BAT-STATIC-CONT",
             "Q-BYTES-SPEED"),
    what="a transformers release leaves the cache's crop a silent no-op (a layer type that does not implement it returns without a word): the repeatable verification pass and decode steps are timed against a history that grows by every call; the speculative loop keeps the proposals its target rejected and stops at the first one with a line naming the crop (its claims fail before a verdict)",
)
def _cache_crop_does_nothing():
    from transformers import DynamicCache

    with patched(DynamicCache, "crop", lambda self, *args, **kwargs: None):
        yield


# ------------------------------------------------------------------------------------------------
# the other side of a bound (issue #43): a fault a one-sided check passes that lies beyond the limit on its
# other side; red on the check that bounds its claim from there, and on nothing the one-sided check saw
# ------------------------------------------------------------------------------------------------


@fault(
    "spec-target-charged-per-proposal",
    section="speculative",
    kind=RULE,
    targets=("SPEC-SLOWDOWN", "SPEC-SPEEDUP"),
    what="each proposal is charged a target pass besides its draft pass, E / (gamma (c + 1)) instead of E / (gamma c + 1): every speedup falls, and 'slower' holds all the more",
)
def _spec_target_per_proposal():
    with patched(speculative, "speedup", lambda alpha, gamma, c: speculative.expected_tokens(alpha, gamma) / (gamma * (c + 1.0))):
        yield
