"""Section 5, does quantization hurt? The factual battery: 16 questions under greedy decoding (see
:mod:`cheapinfer.chapter.evaluation.evaluation`). Its statistics (McNemar's exact test between two schemes, the
Clopper-Pearson interval of one score, and what a battery of n questions can resolve at all) are
:mod:`cheapinfer.chapter.stats`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import torch

from ...runtime import hf

# ------------------------------------------------------------------------------------------------
# battery
# ------------------------------------------------------------------------------------------------

ANSWER_TOKENS = 16

#: (question, accepted answers as regular expressions matched on word boundaries, case-insensitive).
BATTERY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of France?", ("paris",)),
    ("How many days are there in a week?", ("seven", "7")),
    ("What is the chemical formula of water?", ("h2o", "h₂o")),
    ("Which planet is known as the Red Planet?", ("mars",)),
    ("Who wrote the play Romeo and Juliet?", ("shakespeare",)),
    ("What is the largest ocean on Earth?", ("pacific",)),
    ("How many legs does a spider have?", ("eight", "8")),
    ("At what temperature in degrees Celsius does water freeze?", ("0", "zero")),
    ("What is the capital of Japan?", ("tokyo",)),
    ("Which gas do plants take in from the air for photosynthesis?", ("carbon dioxide", "co2", "co₂")),
    ("What is the largest planet in the solar system?", ("jupiter",)),
    ("On which continent is Egypt?", ("africa",)),
    ("What is the square root of 81?", ("nine", "9")),
    ("What colour is the sky on a clear day?", ("blue",)),
    ("Who painted the Mona Lisa?", ("leonardo", "da vinci")),
    ("At what temperature in degrees Celsius does water boil at sea level?", ("100", "one hundred")),
)
BATTERY_SUFFIX = " Answer in a few words."



def _chat_ids(tokenizer, text: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, Mapping) or hasattr(out, "keys") else out)
    return tokenizer(f"Question: {text}\nAnswer:", add_special_tokens=True)["input_ids"]


def _left_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, L]`` ids and attention mask, padded on the left (generation continues on the right)."""
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, length - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, length - len(r):] = 1
    return ids, mask


def _pad_id(model, tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, model.generation_config.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate[0] if isinstance(candidate, (list, tuple)) else candidate)
    return 0


def stock_repetition_penalty(model) -> float:
    """The repetition penalty of the model's own ``generation_config`` (1.0 when it sets none)."""
    value = getattr(model.generation_config, "repetition_penalty", None)
    return float(value) if value is not None else 1.0


def is_correct(answer: str, accepted: Iterable[str]) -> bool:
    text = answer.lower()
    return any(re.search(rf"(?<!\w){re.escape(a)}(?!\w)", text) for a in accepted)


@dataclass
class BatteryResult:
    repetition_penalty: float
    answers: list[str]
    correct: list[bool]
    tokens: list[list[int]] = field(default_factory=list)  # each answer's generated ids, as the batch produced them

    @property
    def score(self) -> int:
        return sum(self.correct)

    @property
    def n(self) -> int:
        return len(self.correct)


@torch.no_grad()
def battery(model, tokenizer, repetition_penalty: float | None = None) -> BatteryResult:
    """The 16 questions, greedy, one batch. ``repetition_penalty=None`` keeps the model's stock setting."""
    penalty = stock_repetition_penalty(model) if repetition_penalty is None else float(repetition_penalty)
    pad = _pad_id(model, tokenizer)
    ids, mask = _left_padded([_chat_ids(tokenizer, q + BATTERY_SUFFIX) for q, _ in BATTERY], pad)
    device = next(model.parameters()).device
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        repetition_penalty=penalty,
        max_new_tokens=ANSWER_TOKENS,
        pad_token_id=pad,
    )  # [B, L + new]
    answers = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
    return BatteryResult(penalty, answers, [is_correct(a, acc) for a, (_, acc) in zip(answers, BATTERY)], out[:, ids.shape[1]:].tolist())


def question_ids(tokenizer, index: int) -> list[int]:
    """Question ``index`` of the battery as the model is asked it (chat template and suffix), unpadded."""
    return _chat_ids(tokenizer, BATTERY[index][0] + BATTERY_SUFFIX)


def shortest_question(tokenizer) -> int:
    """The question with the fewest ids: the one the batch pads most."""
    return min(range(len(BATTERY)), key=lambda i: len(question_ids(tokenizer, i)))


def until_end(model, tokens: Sequence[int]) -> list[int]:
    """``tokens`` up to and including the first end-of-sequence id of the model's generation config (all of them if none)."""
    ends, out = hf.eos_ids(model), []
    for t in tokens:
        out.append(int(t))
        if out[-1] in ends:
            break
    return out
