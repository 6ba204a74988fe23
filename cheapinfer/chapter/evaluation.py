"""Section 5 of the chapter: does quantization hurt? Perplexity, a factual battery, agreement.

Three measurements of one model against its unquantized reference:

- **perplexity** on ``corpus.HELD_OUT`` = 2,048 held-out tokens of English prose: token-level,
  ``exp(mean negative log-likelihood)`` over the 2,048 predicted tokens, computed as ``WINDOWS`` = 4
  non-overlapping windows of ``WINDOW`` = 512 tokens (stride 512) in one batched forward pass. Each
  window restarts its context (its first prediction sees one token), so the number is a little
  higher than a sliding-window perplexity would be; it is comparable between schemes, which is all
  the table needs. No BOS token is added. ``library_perplexity`` computes the same number through
  transformers' own shifted loss (``labels=``), one window of ``WINDOW + 1`` tokens per row: a
  cross-check of the shift and of the windows (each held-out token scored exactly once).
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

Statistics: a battery change between two schemes is judged by McNemar's exact test (two-sided, on
the questions one scheme answers and the other misses; ``LEVEL`` = 0.05), lost and gained answers
reported separately; a single score gets an exact (Clopper-Pearson) interval at ``CONFIDENCE`` =
0.95. ``resolution(n)`` says what a battery of n questions can resolve at all.

The table's rows are built on first use (``Table.__getitem__``): a claim that reads two rows does
not pay for seven.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

WINDOW = 512
WINDOWS = 4
ANSWER_TOKENS = 16
AGREEMENT_TOKENS = 48
CONFIDENCE = 0.95  # of the exact binomial interval of one battery score
LEVEL = 0.05  # two-sided significance level of the paired exact (McNemar) test

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


def _windows(ids: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The suite's windows of ``ids`` (``[n + 1]``, n a multiple of ``window``): the inputs ``[W, window]`` and their
    targets ``[W, window]`` (token t+1 of each window)."""
    n = ids.numel() - 1
    if n % window:
        raise ValueError(f"{n} predicted tokens is not a multiple of the window {window}")
    return ids[:-1].reshape(-1, window), ids[1:].reshape(-1, window)


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, window: int = WINDOW) -> float:
    """Token-level perplexity of ``ids`` (``[n + 1]``, n a multiple of ``window``) in one forward pass."""
    device = next(model.parameters()).device
    inputs, targets = (x.to(device) for x in _windows(ids, window))
    logits = model(input_ids=inputs, use_cache=False).logits  # [W, window, V]
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="mean")
    return math.exp(nll.item())


@torch.no_grad()
def library_perplexity(model, ids: torch.Tensor, window: int = WINDOW) -> float:
    """The same perplexity through transformers' own loss: ``labels=`` shifts inside the model.

    Row w holds tokens ``[w * window, (w + 1) * window]`` (``window + 1`` tokens, consecutive rows
    share one): the model predicts the last ``window`` of them, so every held-out token is scored
    exactly once. The mean of equal-sized window means is the mean over all tokens.
    """
    n = ids.numel() - 1
    if n % window:
        raise ValueError(f"{n} predicted tokens is not a multiple of the window {window}")
    device = next(model.parameters()).device
    rows = torch.stack([ids[s : s + window + 1] for s in range(0, n, window)]).to(device)  # [W, window + 1]
    loss = model(input_ids=rows, labels=rows, use_cache=False).loss
    return math.exp(float(loss))


def ln_ppl_bound(model, ids: torch.Tensor, window: int = WINDOW) -> float:
    """How far two fp32 evaluations of the windows' mean log-likelihood may differ: 2 (B + L).

    B: the first-order probable bound of the model's rounding (:func:`cheapinfer.runtime.rounding.first_order_bound`
    at fp32) for the mean over the windows' predictions, evaluated in an fp32 copy
    (:func:`cheapinfer.runtime.rounding.bound_copy`). L: each path's loss in fp32, per token a log-sum-exp over V
    logits (max-subtraction, exp, V - 1 sums, log, the target's difference: V + 4 roundings of at most u of
    the token's NLL scale, 1 + |NLL|) and the mean's N - 1 sums, independent across tokens:
    LAMBDA u sqrt((V + 4) / N + N / N^2) (1 + mean NLL).

    The windows' roundings are disjoint independent sets, so the squares add: B = sqrt(sum_w B_w^2) / W; each
    window is bounded by itself (memory).
    """
    from ..runtime import rounding

    windows, targets = _windows(ids, window)  # the windows perplexity() evaluates
    n = targets.numel()
    copy32, fp32 = rounding.bound_copy(model), rounding.Precision.of(torch.float32)
    per_window = [rounding.first_order_bound(copy32, windows[w : w + 1], lambda z, w=w: F.cross_entropy(z[0], targets[w].to(z.device)), fp32)
                  for w in range(len(windows))]
    b = math.sqrt(sum(x.probable**2 for x in per_window)) / len(windows)
    nll = sum(x.value for x in per_window) / len(windows)
    v, u = model.config.vocab_size, rounding.unit_roundoff(torch.float32)
    loss = rounding.LAMBDA * u * math.sqrt((v + 4) / n + 1 / n) * (1 + nll)
    return 2 * (b + loss)


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


@dataclass
class PairedChange:
    """Two schemes on the same questions: answers lost and gained by the second, and McNemar's exact p."""

    lost: int  # right under the first, wrong under the second
    gained: int  # wrong under the first, right under the second
    p_value: float  # two-sided exact McNemar: binomial(lost + gained, 1/2); 1.0 when nothing changed

    @property
    def significant(self) -> bool:
        return self.p_value < LEVEL


def mcnemar_exact(first: Sequence[bool], second: Sequence[bool]) -> PairedChange:
    """McNemar's exact test on paired right/wrong answers (two-sided)."""
    if len(first) != len(second):
        raise ValueError(f"paired answers of different lengths: {len(first)} and {len(second)}")
    lost = sum(a and not b for a, b in zip(first, second))
    gained = sum(b and not a for a, b in zip(first, second))
    if lost + gained == 0:
        return PairedChange(0, 0, 1.0)
    return PairedChange(lost, gained, float(stats.binomtest(lost, lost + gained, 0.5).pvalue))


@dataclass
class Resolution:
    """What a battery of ``n`` questions can resolve, by the interval and by the paired test."""

    n: int
    interval_coverage: float  # smallest exact coverage of the interval over true proportions 0.001..0.999
    one_question_intervals_disjoint: bool  # for some k, the intervals of k/n and (k+1)/n do not overlap
    one_question_p: float  # McNemar's exact p of one question lost and none gained
    smallest_disjoint_gap: int  # fewest questions between two scores whose intervals can be disjoint
    smallest_significant_change: int  # fewest one-way changes (m lost, 0 gained) that McNemar calls significant


def resolution(n: int, confidence: float = CONFIDENCE, level: float = LEVEL) -> Resolution:
    """What ``n`` questions can and cannot tell apart (exact intervals at ``confidence``, McNemar at ``level``)."""
    ci = [binomial_interval(k, n, confidence) for k in range(n + 1)]
    # exact coverage: P(true p inside the interval of the observed k), summed over the binomial law of k
    truth = np.linspace(0.001, 0.999, 999)  # [P]
    pmf = stats.binom.pmf(np.arange(n + 1)[:, None], n, truth[None, :])  # [n + 1, P]
    inside = np.array([[lo <= t <= hi for t in truth] for lo, hi in ci])  # [n + 1, P]
    coverage = float((pmf * inside).sum(axis=0).min())

    def disjoint(k: int, j: int) -> bool:
        return ci[k][1] < ci[j][0]

    gap = next((d for d in range(1, n + 1) if any(disjoint(k, k + d) for k in range(n + 1 - d))), n + 1)
    change = next((m for m in range(1, n + 1) if mcnemar_exact([True] * m, [False] * m).p_value < level), n + 1)
    return Resolution(
        n=n,
        interval_coverage=coverage,
        one_question_intervals_disjoint=any(disjoint(k, k + 1) for k in range(n)),
        one_question_p=mcnemar_exact([True], [False]).p_value,
        smallest_disjoint_gap=gap,
        smallest_significant_change=change,
    )


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


def aligned_guesses(pred_row: torch.Tensor, continuation: Continuation) -> torch.Tensor:
    """The argmax guesses for the continuation's tokens: the logits at position t predict token t + 1. ``[n]``"""
    start = len(continuation.prompt)  # logits at start - 1 predict the first continuation token
    return pred_row[start - 1 : start - 1 + len(continuation.tokens)]


@torch.no_grad()
def agreement_by_position(model, continuations: Sequence[Continuation]) -> list[list[bool]]:
    """Per continuation, per position: whether ``model``'s argmax at the reference's own context is the
    reference's token (identical context: one teacher-forced forward pass over every continuation)."""
    rows = [c.prompt + c.tokens for c in continuations]
    length = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), length), dtype=torch.long)  # right padding: causal attention never looks ahead
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    device = next(model.parameters()).device
    pred = model(input_ids=ids.to(device), use_cache=False).logits.argmax(-1).cpu()  # [B, L]: guess for position t+1
    return [(aligned_guesses(pred[i], c) == torch.tensor(c.tokens)).tolist() for i, c in enumerate(continuations)]


def agreement(model, continuations: Sequence[Continuation]) -> tuple[int, int]:
    """(positions where ``model``'s argmax equals the reference token, positions) in one forward pass."""
    matches = agreement_by_position(model, continuations)
    return sum(map(sum, matches)), sum(map(len, matches))


# ------------------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------------------


@dataclass
class CrossCheck:
    """The reference's perplexity from transformers' shifted loss, and the bound of two fp32 evaluations (:func:`ln_ppl_bound`)."""

    library_ppl: float
    ln_bound: float


@dataclass
class Row:
    scheme: str
    ppl: float
    battery: BatteryResult
    battery_no_penalty: BatteryResult
    matches: tuple[tuple[bool, ...], ...]  # per continuation, per position (agreement_by_position)

    @property
    def agree(self) -> int:
        return sum(map(sum, self.matches))

    @property
    def positions(self) -> int:
        return sum(map(len, self.matches))

    @property
    def agreement(self) -> float:
        return self.agree / self.positions


class Table:
    """The seven-row table, each row built on first use (``table[scheme]``) and kept.

    ``variant(scheme)`` gives the quantized model; ``release(scheme)`` may free it after its row.
    """

    def __init__(
        self,
        reference,
        tokenizer,
        variant: Callable[[str], object],
        schemes: Sequence[str],
        corpus_ids: torch.Tensor,
        continuations: list[Continuation],
        release: Callable[[str], None] | None = None,
    ):
        self.reference = reference
        self.tokenizer = tokenizer
        self.variant = variant
        self.schemes = tuple(schemes)
        self.corpus_ids = corpus_ids
        self.continuations = continuations
        self.release = release
        self.stock_penalty = stock_repetition_penalty(reference)
        self.tokens = corpus_ids.numel() - 1  # predicted tokens behind each perplexity
        self.seconds: dict[str, float] = {}
        self._rows: dict[str, Row] = {}
        self._cross_check: CrossCheck | None = None

    def __getitem__(self, scheme: str) -> Row:
        if scheme not in self.schemes:
            raise KeyError(f"{scheme!r} is not a row of the table ({', '.join(self.schemes)})")
        if scheme not in self._rows:
            import time

            t0 = time.perf_counter()
            model = self.variant(scheme)
            ppl = perplexity(model, self.corpus_ids)
            stock = battery(model, self.tokenizer)
            off = battery(model, self.tokenizer, repetition_penalty=1.0) if stock.repetition_penalty != 1.0 else stock
            matches = tuple(tuple(m) for m in agreement_by_position(model, self.continuations))
            self._rows[scheme] = Row(scheme, ppl, stock, off, matches)
            self.seconds[scheme] = time.perf_counter() - t0
            if self.release is not None:
                self.release(scheme)
        return self._rows[scheme]

    @property
    def cross_check(self) -> "CrossCheck":
        """The reference's perplexity through transformers' own loss and the rounding bound of the two (built on first use)."""
        if self._cross_check is None:
            import time

            t0 = time.perf_counter()
            self._cross_check = CrossCheck(library_perplexity(self.reference, self.corpus_ids), ln_ppl_bound(self.reference, self.corpus_ids))
            self.seconds["cross-check"] = time.perf_counter() - t0
        return self._cross_check

    def fill(self, device: torch.device | str, workers: int | None = None) -> "Table":
        """Build every missing row and the cross-check, ``workers`` at a time on a CPU
        (:func:`cheapinfer.runtime.device.map_untimed`), the cross-check (the longest) first.

        A row's numbers do not depend on what runs beside it; its ``seconds`` then do, and are only reported.
        """
        from ..runtime.device import map_untimed

        tasks = [s for s in self.schemes if s not in self._rows]
        if self._cross_check is None:
            tasks.insert(0, None)
        map_untimed(lambda s: self.cross_check if s is None else self[s], tasks, device, workers)
        return self

    @property
    def rows(self) -> dict[str, Row]:
        """Every row, in the book's order (builds the missing ones)."""
        return {s: self[s] for s in self.schemes}

    def ppl(self, scheme: str) -> float:
        return self[scheme].ppl

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
    """The table over ``schemes`` (rows built on first use). ``variant(scheme)`` gives the quantized model."""
    continuations = continuations or reference_continuations(reference, tokenizer)
    return Table(reference, tokenizer, variant, schemes, corpus_ids, continuations, release)


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
