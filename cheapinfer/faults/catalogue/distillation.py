"""Distillation (section 7): the teacher's soft labels and their temperature."""

from __future__ import annotations

from ...chapter.distillation import distill
from ..base import RULE, fault, patched


@fault(
    "dist-temperature-after-softmax",
    section="distillation",
    kind=RULE,
    targets=("DIST-TEMPERATURE",),
    what="the temperature divides the probabilities after the softmax instead of the logits before it",
)
def _dist_temperature_after_softmax():
    import torch

    with patched(distill, "distribution", lambda logits, temperature=1.0: torch.softmax(logits.double(), dim=-1) / temperature):
        yield


@fault(
    "dist-softmax-unnormalised",
    section="distillation",
    kind=RULE,
    targets=("DIST-TEMPERATURE",),
    what="the tempered distribution is the exponentials of the shifted logits, exp(z / T - max), without the softmax's division by their sum (a sampler's weights, which torch.multinomial would normalise itself): every ratio, and so every printed ratio, is unchanged",
)
def _dist_softmax_unnormalised():
    with patched(distill, "distribution", _sampler_weights):
        yield


def _sampler_weights(logits, temperature=1.0):
    """exp(z / T - max(z / T)): a softmax without its normaliser."""
    x = logits.double() / temperature
    return (x - x.max()).exp()


@fault(
    "dist-hard-label",
    section="distillation",
    kind=RULE,
    targets=("DIST-MILK",),
    what="the teacher's label is its argmax token (one-hot), as when a distillation pipeline trains on the teacher's generated text instead of its distribution",
)
def _dist_hard_label():
    import torch

    def one_hot(logits, temperature=1.0):
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()

    with patched(distill, "distribution", one_hot):
        yield


@fault(
    "dist-prompt-ends-in-eos",
    section="distillation",
    kind=RULE,
    targets=("DIST-MILK", "DIST-TEMPERATURE"),
    what="the prompt is tokenized with an end-of-sequence id appended (a tokenizer loaded with add_eos_token), so the soft label read is the distribution after EOS, not after 'into the'",
)
def _dist_prompt_ends_in_eos():
    real = distill.next_token_logits

    class EosAppended:
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

        def __call__(self, text, **kwargs):
            out = self.tokenizer(text, **kwargs)
            return {**out, "input_ids": list(out["input_ids"]) + [self.tokenizer.eos_token_id]}

    with patched(distill, "next_token_logits", lambda model, tokenizer, prompt=distill.MILK_PROMPT: real(model, EosAppended(tokenizer), prompt)):
        yield
