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

Statistics (:mod:`cheapinfer.chapter.stats`): a battery change between two schemes is judged by McNemar's exact test
(two-sided, on the questions one scheme answers and the other misses; ``PAIRED_LEVEL`` = 0.05), lost and gained
answers reported separately; a single score gets an exact (Clopper-Pearson) interval at ``CONFIDENCE`` = 0.95.
``resolution(n)`` says what a battery of n questions can resolve at all.

The table's rows are built on first use (``Table.__getitem__``): a claim that reads two rows does
not pay for seven.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from scipy import stats

from . import battery, perplexity

# ------------------------------------------------------------------------------------------------
# agreement
# ------------------------------------------------------------------------------------------------

AGREEMENT_TOKENS = 48

#: Prose openings whose greedy continuations give the 3 x 48 = 144 agreement positions.
AGREEMENT_PROMPTS = (
    "The history of the printing press begins in the fifteenth century, when",
    "To make a simple loaf of bread, you need flour, water, salt and yeast. First,",
    "The river rises in the mountains to the north and flows south through",
)



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
def teacher_forced_guesses(model, continuations: Sequence[Continuation], rows_per_pass: int | None = None) -> list[torch.Tensor]:
    """Per continuation, ``model``'s argmax at each of its tokens' positions, with the prompt and the tokens before it as
    context (teacher-forced, no cache): ``[len(tokens)]`` each. One forward pass over right-padded rows (causal attention
    never looks ahead at the padding); with ``rows_per_pass``, that many rows a pass, rows of similar length together."""
    order = list(range(len(continuations)))
    if rows_per_pass:
        order.sort(key=lambda i: len(continuations[i].prompt) + len(continuations[i].tokens))
    step = rows_per_pass or max(len(order), 1)
    device = next(model.parameters()).device
    out: list[torch.Tensor] = [torch.empty(0, dtype=torch.long)] * len(continuations)
    for start in range(0, len(order), step):
        chunk = order[start : start + step]
        rows = [continuations[i].prompt + continuations[i].tokens for i in chunk]
        ids = torch.zeros((len(rows), max(len(r) for r in rows)), dtype=torch.long)
        for j, r in enumerate(rows):
            ids[j, : len(r)] = torch.tensor(r)
        pred = model(input_ids=ids.to(device), use_cache=False).logits.argmax(-1).cpu()  # [rows, L]: guess for position t+1
        for j, i in enumerate(chunk):
            out[i] = aligned_guesses(pred[j], continuations[i])
    return out


def agreement_by_position(model, continuations: Sequence[Continuation]) -> list[list[bool]]:
    """Per continuation, per position: whether ``model``'s argmax at the reference's own context is the
    reference's token (identical context: one teacher-forced forward pass over every continuation)."""
    guesses = teacher_forced_guesses(model, continuations)
    return [(g == torch.tensor(c.tokens)).tolist() for g, c in zip(guesses, continuations)]


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
    battery: battery.BatteryResult
    battery_no_penalty: battery.BatteryResult
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
        self.stock_penalty = battery.stock_repetition_penalty(reference)
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
            ppl = perplexity.perplexity(model, self.corpus_ids)
            stock = battery.battery(model, self.tokenizer)
            off = battery.battery(model, self.tokenizer, repetition_penalty=1.0) if stock.repetition_penalty != 1.0 else stock
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
            self._cross_check = CrossCheck(perplexity.library_perplexity(self.reference, self.corpus_ids), perplexity.ln_ppl_bound(self.reference, self.corpus_ids))
            self.seconds["cross-check"] = time.perf_counter() - t0
        return self._cross_check

    def fill(self, device: torch.device | str, workers: int | None = None) -> "Table":
        """Build every missing row and the cross-check, ``workers`` at a time on a CPU
        (:func:`cheapinfer.runtime.device.map_untimed`), the cross-check (the longest) first; then let go of the
        reference model and the variants, which no number of the table needs any more.

        A row's numbers do not depend on what runs beside it; its ``seconds`` then do, and are only reported.
        """
        from ...runtime.device import map_untimed

        tasks = [s for s in self.schemes if s not in self._rows]
        if self._cross_check is None:
            tasks.insert(0, None)
        map_untimed(lambda s: self.cross_check if s is None else self[s], tasks, device, workers)
        self.reference = self.variant = None  # every number is built: a filled table holds no model (the run may free them)
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
