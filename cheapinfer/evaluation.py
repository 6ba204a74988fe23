"""Section 5 of the chapter: does quantization hurt? Perplexity, a factual battery, agreement.

Three measurements of one model against its unquantized reference:

- **perplexity** on ``corpus.HELD_OUT`` = 2,048 held-out tokens of English prose: token-level,
  ``exp(mean negative log-likelihood)`` over the 2,048 predicted tokens, computed as ``WINDOWS`` = 4
  non-overlapping windows of ``WINDOW`` = 512 tokens (stride 512) in one batched forward pass. Each
  window restarts its context (its first prediction sees one token), so the number is a little
  higher than a sliding-window perplexity would be; it is comparable between schemes, which is all
  the table needs. No BOS token is added.
- **battery**: ``BATTERY``, 16 short factual questions with known answers written for this suite,
  asked through the tokenizer's chat template (when it has one) and answered under greedy decoding
  (``do_sample=False``) with the model's stock ``generation_config`` (repetition penalty included,
  1.1 for Qwen2.5-Instruct; none for SmolLM2) and again with the repetition penalty off. An answer
  is right when one of its accepted spellings occurs as a whole word in the first ``ANSWER_TOKENS``
  generated tokens (case-insensitive). The 16 questions run as one left-padded batch.
- **agreement**: the reference model's greedy continuation (``AGREEMENT_TOKENS`` = 48 tokens after
  each of the three ``AGREEMENT_PROMPTS``: 144 positions, no repetition penalty); for each scheme the
  fraction of those positions where its argmax, given the same reference prefix, is the reference's
  token. One teacher-forced forward pass per scheme over the three right-padded sequences (causal
  attention: padding at the end cannot reach earlier positions).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from scipy import stats

WINDOW = 512
WINDOWS = 4
ANSWER_TOKENS = 16
AGREEMENT_TOKENS = 48
CONFIDENCE = 0.95

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

#: Prose openings whose greedy continuations give the 3 x 48 = 144 agreement positions.
AGREEMENT_PROMPTS = (
    "The history of the printing press begins in the fifteenth century, when",
    "To make a simple loaf of bread, you need flour, water, salt and yeast. First,",
    "The river rises in the mountains to the north and flows south through",
)


# ------------------------------------------------------------------------------------------------
# perplexity
# ------------------------------------------------------------------------------------------------


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, window: int = WINDOW) -> float:
    """Token-level perplexity of ``ids`` (``[n + 1]``, n a multiple of ``window``) in one forward pass."""
    n = ids.numel() - 1
    if n % window:
        raise ValueError(f"{n} predicted tokens is not a multiple of the window {window}")
    device = next(model.parameters()).device
    inputs = ids[:-1].reshape(-1, window).to(device)  # [W, window]
    targets = ids[1:].reshape(-1, window).to(device)  # [W, window]: token t+1 of each window
    logits = model(input_ids=inputs, use_cache=False).logits  # [W, window, V]
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="mean")
    return math.exp(nll.item())


# ------------------------------------------------------------------------------------------------
# battery
# ------------------------------------------------------------------------------------------------


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
    return BatteryResult(penalty, answers, [is_correct(a, acc) for a, (_, acc) in zip(answers, BATTERY)])


def binomial_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval for a proportion k/n."""
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


# ------------------------------------------------------------------------------------------------
# agreement
# ------------------------------------------------------------------------------------------------


@dataclass
class Continuation:
    prompt: list[int]  # prompt token ids
    tokens: list[int]  # the reference's greedy continuation


@torch.no_grad()
def greedy(model, prompt: Sequence[int], new_tokens: int, **generate_kwargs) -> list[int]:
    """Plain greedy continuation (transformers' ``generate``, batch 1, no repetition penalty).

    ``generate_kwargs`` go to ``generate`` too (e.g. ``assistant_model=`` for assisted generation).
    """
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        **generate_kwargs,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        repetition_penalty=1.0,
        max_new_tokens=new_tokens,
        pad_token_id=model.generation_config.pad_token_id if model.generation_config.pad_token_id is not None else 0,
    )
    return out[0, ids.shape[1]:].tolist()


def reference_continuations(model, tokenizer, prompts: Sequence[str] = AGREEMENT_PROMPTS, new_tokens: int = AGREEMENT_TOKENS) -> list[Continuation]:
    conts = []
    for text in prompts:
        prompt = tokenizer(text, add_special_tokens=True)["input_ids"]
        tokens = greedy(model, prompt, new_tokens)
        if len(tokens) != new_tokens:
            raise ValueError(f"the reference stopped after {len(tokens)} of {new_tokens} tokens on {text!r}: choose a prompt that does not end in EOS")
        conts.append(Continuation(list(prompt), tokens))
    return conts


@torch.no_grad()
def agreement(model, continuations: Sequence[Continuation]) -> tuple[int, int]:
    """(positions where ``model``'s argmax equals the reference token, positions) in one forward pass."""
    rows = [c.prompt + c.tokens for c in continuations]
    length = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), length), dtype=torch.long)  # right padding: causal attention never looks ahead
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    device = next(model.parameters()).device
    pred = model(input_ids=ids.to(device), use_cache=False).logits.argmax(-1).cpu()  # [B, L]: guess for position t+1
    hits = total = 0
    for i, c in enumerate(continuations):
        start = len(c.prompt)  # logits at start-1 predict the first continuation token
        guess = pred[i, start - 1: start - 1 + len(c.tokens)]
        hits += int((guess == torch.tensor(c.tokens)).sum())
        total += len(c.tokens)
    return hits, total


# ------------------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------------------


@dataclass
class Row:
    scheme: str
    ppl: float
    battery: BatteryResult
    battery_no_penalty: BatteryResult
    agree: int
    positions: int

    @property
    def agreement(self) -> float:
        return self.agree / self.positions


@dataclass
class Table:
    rows: dict[str, Row]
    continuations: list[Continuation]
    stock_penalty: float
    tokens: int  # predicted tokens behind each perplexity
    seconds: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, scheme: str) -> Row:
        return self.rows[scheme]

    def ppl(self, scheme: str) -> float:
        return self.rows[scheme].ppl

    def header(self) -> list[str]:
        return ["scheme", "perplexity", f"battery (stock, penalty {self.stock_penalty:g})", "battery (penalty off)", "agreement"]

    def table_rows(self) -> list[list[str]]:
        out = []
        for r in self.rows.values():
            out.append([
                r.scheme,
                f"{r.ppl:,.2f}",
                f"{r.battery.score}/{r.battery.n}",
                f"{r.battery_no_penalty.score}/{r.battery_no_penalty.n}",
                f"{r.agree}/{r.positions}",
            ])
        return out


def evaluate(
    reference,
    tokenizer,
    variant: Callable[[str], object],
    schemes: Sequence[str],
    corpus_ids: torch.Tensor,
    release: Callable[[str], None] | None = None,
    continuations: list[Continuation] | None = None,
) -> Table:
    """The seven-row table. ``variant(scheme)`` gives the quantized model; ``release(scheme)`` may free it."""
    import time

    continuations = continuations or reference_continuations(reference, tokenizer)
    rows, seconds = {}, {}
    for scheme in schemes:
        t0 = time.perf_counter()
        model = variant(scheme)
        ppl = perplexity(model, corpus_ids)
        stock = battery(model, tokenizer)
        off = battery(model, tokenizer, repetition_penalty=1.0) if stock.repetition_penalty != 1.0 else stock
        hits, total = agreement(model, continuations)
        rows[scheme] = Row(scheme, ppl, stock, off, hits, total)
        seconds[scheme] = time.perf_counter() - t0
        if release is not None:
            release(scheme)
    return Table(rows, continuations, stock_repetition_penalty(reference), corpus_ids.numel() - 1, seconds)


def discordant_pairs(table: Table, schemes: Sequence[str], min_ppl_gap: float) -> int:
    """Pairs of schemes that perplexity separates by more than ``min_ppl_gap`` (relative) but agreement orders the other way."""
    bad = 0
    for i, a in enumerate(schemes):
        for b in schemes[i + 1:]:
            pa, pb = table.ppl(a), table.ppl(b)
            if max(pa, pb) / min(pa, pb) - 1 <= min_ppl_gap:
                continue
            better, worse = (a, b) if pa < pb else (b, a)
            if table[better].agreement < table[worse].agreement:
                bad += 1
    return bad


def kendall_tau(table: Table, schemes: Sequence[str]) -> float:
    """Kendall's tau-b between agreement and minus perplexity over ``schemes`` (1 = same order)."""
    tau = stats.kendalltau([table[s].agreement for s in schemes], [-table.ppl(s) for s in schemes]).statistic
    return float(tau)
