"""Section 2, the paged cache: the continuous scheduler run on the paged KV cache
(:mod:`cheapinfer.chapter.batching.paging`), its reservation waste and its shared prefixes, read from a real run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ... import SEED
from . import batching, scheduler, workload


class PagedSlotBatch:
    """The scheduler's batch on the paged cache (:func:`cheapinfer.chapter.batching.paging.paged_cache`): the same interface as :class:`SlotBatch`.

    Each request is a sequence in one block pool, holding only its own tokens (no padding
    columns: rows are left-aligned, shorter rows masked). Admitting a request prefills its
    prompt but for the last token, which is the input of its first step; a finished request's
    blocks go back to the pool at once. With ``share_prefixes``, a request whose prompt starts
    with full blocks of a live request's prompt forks those blocks (reference-counted) and
    prefills only the rest, as a prefix cache does. ``snapshots`` records the pool after every step.
    """

    def __init__(self, model, pool, share_prefixes: bool = False):
        from .paging import paged_cache

        self.model, self.pool, self.share_prefixes = model, pool, share_prefixes
        self.device = next(model.parameters()).device
        self.cache = paged_cache(model.config, 0, pool=pool, rows=[])
        self.requests: list[int] = []
        self.left: list[int] = []
        self.tokens: list[int] = []  # next input token, per row
        self.prompts: dict[int, list[int]] = {}
        self.generated: dict[int, list[int]] = {}
        self.shared_tokens: dict[int, int] = {}  # request -> prompt tokens it took from another request's blocks
        self.snapshots: list[dict[str, object]] = []

    def __len__(self) -> int:
        return len(self.requests)

    def _shareable(self, prompt: list[int]) -> tuple[int | None, int]:
        """The live request whose cached prompt shares the most full blocks with ``prompt``, and those blocks' tokens."""
        best, best_n, bs = None, 0, self.pool.block_size
        for r in self.requests:
            other, common = self.prompts[r], 0
            limit = min(len(other), len(prompt) - 1, self.pool.lengths[r])  # cached tokens only; keep one prompt token to feed
            while common < limit and other[common] == prompt[common]:
                common += 1
            n = common // bs * bs
            if n > best_n:
                best, best_n = r, n
        return best, best_n

    def admit(self, request: int, length: int, prompt, row: int | None = None) -> None:
        """Put ``request`` (a prompt token or list of tokens, ``length`` tokens to generate) in ``row`` or a new row."""
        from .paging import paged_cache

        prompt = [int(prompt)] if isinstance(prompt, int) else [int(t) for t in prompt]
        if row is not None:
            self.pool.remove(self.requests[row])  # the finished request's blocks go back to the pool
        parent, n = self._shareable(prompt) if self.share_prefixes else (None, 0)
        if parent is not None:
            self.pool.fork(parent, request, n)
        else:
            self.pool.add(request)
        self.shared_tokens[request] = n
        if len(prompt) - 1 > n:  # prefill the prompt but its last token, on this request's own row
            view = paged_cache(self.model.config, 0, pool=self.pool, rows=[request])
            ids = torch.tensor([prompt[n:-1]], device=self.device)
            with torch.inference_mode():
                batching.step_forward(self.model, ids, view, torch.arange(n, len(prompt) - 1, device=self.device)[None])
        self.prompts[request], self.generated[request] = prompt, []
        if row is None:
            self.requests.append(request)
            self.left.append(length)
            self.tokens.append(prompt[-1])
        else:
            self.requests[row], self.left[row], self.tokens[row] = request, length, prompt[-1]
        self.cache.rows = list(self.requests)

    def drop(self, rows: list[int]) -> None:
        for i in rows:
            self.pool.remove(self.requests[i])
        keep = [i for i in range(len(self)) if i not in set(rows)]
        self.requests = [self.requests[i] for i in keep]
        self.left = [self.left[i] for i in keep]
        self.tokens = [self.tokens[i] for i in keep]
        self.cache.rows = list(self.requests)

    def step(self) -> list[int]:
        """One decode step for every row; returns the rows whose request just finished."""
        ids = torch.tensor(self.tokens, device=self.device)[:, None]  # [B, 1]
        mask, pos = self.cache.attention_mask(1), self.cache.position_ids(1)  # [B, S_max + 1], [B, 1]
        with torch.inference_mode():
            out = batching.step_forward(self.model, ids, self.cache, pos, mask)
        self.tokens = out.logits[:, -1].argmax(-1).tolist()  # greedy
        for r, t in zip(self.requests, self.tokens):
            self.generated[r].append(t)
        self.left = [n - 1 for n in self.left]
        self.snapshots.append(self.pool_state())
        return [i for i, n in enumerate(self.left) if n <= 0]

    def pool_state(self) -> dict[str, object]:
        """What the block tables hold now: per live request its tokens and unused slots, the blocks in use."""
        return {
            "tokens": [self.pool.lengths[r] for r in self.requests],
            "unused_slots": [self.pool.unused_slots(r) for r in self.requests],
            "blocks_in_use": self.pool.blocks_in_use,
            "blocks_needed": self.pool.blocks_needed,
            "shared_blocks": self.pool.shared_blocks,
            "consistent": self.pool.tables_consistent(),
        }


@dataclass
class PagedRun:
    """A continuous-batching run on the paged cache: the schedule's result and the block tables, step by step."""

    result: workload.PolicyResult
    batch: PagedSlotBatch
    prompts: list[list[int]]

    @property
    def pool(self):
        return self.batch.pool


def run_paged(model, lengths: Sequence[int], slots: int, prompts: Sequence[Sequence[int]], num_blocks: int, block_size: int = 16, share_prefixes: bool = False) -> PagedRun:
    """Continuous batching of ``lengths`` on the paged cache: the suite's scheduler (:func:`policy_steps`), one pool of ``num_blocks`` blocks."""
    from .paging import PagedKVCache, _model_dims

    p = next(model.parameters())
    layers, kv_heads, head_dim = _model_dims(model.config)
    pool = PagedKVCache(num_blocks, block_size, kv_heads, head_dim, p.dtype, p.device, layers)
    batch = PagedSlotBatch(model, pool, share_prefixes)
    out = workload.PolicyResult("continuous", 0.0, sum(lengths), 0, [0.0] * len(lengths), [0.0] * len(lengths), sum(lengths))
    for _ in scheduler.policy_steps(model, "continuous", lengths, slots, [list(q) for q in prompts], out, new_batch=lambda: batch):
        pass
    return PagedRun(out, batch, [list(q) for q in prompts])


# ----------------------------------------------------------------------------------------------
# the scheduler on the paged cache: reservation waste and shared prefixes, read from a real run
# ----------------------------------------------------------------------------------------------


def tokens_alone(model, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """Greedy tokens of one request run alone, on the model's own ``DynamicCache``: the reference a batched run must equal."""
    from ..kv_cache.kv import greedy_cached

    ids = torch.tensor([list(prompt)], device=next(model.parameters()).device)
    return greedy_cached(model, ids, new_tokens)[0].tolist()


def teacher_forced(model, prompts: Sequence[Sequence[int]], generated: Sequence[Sequence[int]], judge, rows_per_pass: int = 8) -> list:
    """Each request's generated tokens against the model's own choice after each prefix of them: one cache-less forward
    over its prompt and tokens (:func:`cheapinfer.chapter.evaluation.evaluation.teacher_forced_guesses`, the agreement column's
    pass), the argmax at every generated position. Where the first one differs, ``judge``
    (:class:`cheapinfer.runtime.rounding.GreedyJudge`) weighs the two tokens' float64 logit gap on that common prefix
    against the bound of the paths' rounding: a near-tie, or a real difference. Every request is checked, not a sample: a
    gather of the wrong block corrupts only the steps whose block table it misreads. One
    :class:`cheapinfer.runtime.rounding.GreedyComparison` per request."""
    from ..evaluation.evaluation import Continuation, teacher_forced_guesses

    requests = [Continuation(list(p), list(g)) for p, g in zip(prompts, generated)]
    out = []
    for c, guesses in zip(requests, teacher_forced_guesses(model, requests, rows_per_pass)):
        own = guesses.tolist()
        t = next((k for k, (a, b) in enumerate(zip(own, c.tokens)) if a != b), None)
        out.append(judge(c.prompt, c.tokens if t is None else c.tokens[:t] + [own[t]], c.tokens))
    return out


def held_over_needed(snapshots: Sequence[dict]) -> list[float]:
    """``[smallest, largest]`` over the steps of the blocks the pool held (off its free list) over the blocks the live
    sequences' tokens need (``PagedKVCache.blocks_needed``); a step that needs none and holds none counts as 1."""
    ratios = [s["blocks_in_use"] / s["blocks_needed"] if s["blocks_needed"] else (1.0 if not s["blocks_in_use"] else math.inf) for s in snapshots]
    return [min(ratios), max(ratios)]


def paged_waste(model, lengths: Sequence[int], slots: int, prompt_tokens: int, max_new_tokens: int, block_size: int = 16, compare: Sequence[int] = (), seed: int = SEED) -> dict[str, object]:
    """Continuous batching of ``lengths`` on the paged cache; the reservation waste read from its block tables.

    Every request has ``prompt_tokens`` seeded random prompt tokens. The pool holds the memory
    max-context reservation would hold for ``slots`` slots (``prompt_tokens + max_new_tokens``
    each), so the run only fits if finished requests' blocks are freed and reused. Requests
    ``compare`` are run alone as well: their tokens must be the same, up to a near-tie of the
    two paths' rounding (:func:`cheapinfer.runtime.rounding.compare_greedy`).
    """
    if max(lengths) > max_new_tokens:
        raise ValueError(f"a request of {max(lengths)} tokens does not fit a max-context reservation of {max_new_tokens} new tokens")
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, model.config.vocab_size, (len(lengths), prompt_tokens), generator=g).tolist()
    reserved = prompt_tokens + max_new_tokens
    from ...runtime.evidence import traced

    run, evidence = traced(model, lambda: run_paged(model, lengths, slots, prompts, slots * math.ceil(reserved / block_size), block_size))
    snaps = run.batch.snapshots
    from ...runtime.rounding import GreedyJudge
    from .paging import run_waste

    judge = GreedyJudge(model)
    alone = {r: judge(prompts[r], tokens_alone(model, prompts[r], lengths[r]), run.batch.generated[r]) for r in compare}
    forced = teacher_forced(model, prompts, [run.batch.generated[r] for r in range(len(lengths))], judge)

    return {
        "waste": run_waste(snaps, reserved, block_size),
        "steps": run.result.steps,
        "num_blocks": len(run.pool.refs),
        "blocks_handed_out": run.pool.handed_out,
        "blocks_reused": run.pool.reused,
        "blocks_in_use_after": run.pool.blocks_in_use,
        "peak_blocks_in_use": max(s["blocks_in_use"] for s in snaps),
        "blocks_held_over_needed": held_over_needed(snaps),
        "tables_consistent": all(s["consistent"] for s in snaps),
        "tokens_equal_alone": all(c.agree for c in alone.values()),
        "alone": alone,
        "compared": list(compare),
        "tokens_the_models_own": all(c.agree for c in forced),
        "forced": forced,
        "evidence": evidence,
    }


class PoolBatch:
    """:class:`PagedSlotBatch`'s bookkeeping without a model: the same scheduler fills it, and the same pool
    (:class:`cheapinfer.chapter.batching.paging.PagedKVCache`) holds each request's tokens; admitting a request takes its prompt
    but the last token, as the prefill does, and every step one token per row, as the decode step's forward does. Its
    snapshots are a real run's, for the same lengths and prompt size (``draws_simulate_the_run`` checks it), at the cost
    of the bookkeeping alone: many seeded workloads in seconds."""

    def __init__(self, pool):
        self.pool, self.requests, self.left, self.snapshots = pool, [], [], []

    def __len__(self) -> int:
        return len(self.requests)

    def admit(self, request: int, length: int, prompt, row: int | None = None) -> None:
        if row is not None:
            self.pool.remove(self.requests[row])
        self.pool.add(request)
        if len(prompt) > 1:
            self.pool.reserve(request, len(prompt) - 1)
        if row is None:
            self.requests.append(request)
            self.left.append(length)
        else:
            self.requests[row], self.left[row] = request, length

    def drop(self, rows: list[int]) -> None:
        for i in rows:
            self.pool.remove(self.requests[i])
        keep = [i for i in range(len(self)) if i not in set(rows)]
        self.requests, self.left = [self.requests[i] for i in keep], [self.left[i] for i in keep]

    def step(self) -> list[int]:
        for r in self.requests:
            self.pool.reserve(r, 1)
        self.left = [n - 1 for n in self.left]
        self.snapshots.append(PagedSlotBatch.pool_state(self))
        return [i for i, n in enumerate(self.left) if n <= 0]


def pool_run(lengths: Sequence[int], slots: int, prompt_tokens: int, max_new_tokens: int, block_size: int = 16) -> dict[str, object]:
    """The run of :func:`paged_waste` for ``lengths``, its pool's bookkeeping only (:class:`PoolBatch`): the suite's scheduler
    (continuous policy) over a pool of the same size; the waste and the pool's own counts, as :func:`paged_waste` reads them."""
    from .paging import PagedKVCache, run_waste

    reserved = prompt_tokens + max_new_tokens
    pool = PagedKVCache(slots * math.ceil(reserved / block_size), block_size, 1, 1)
    batch = PoolBatch(pool)
    out = workload.PolicyResult("continuous", 0.0, sum(lengths), 0, [0.0] * len(lengths), [0.0] * len(lengths), sum(lengths))
    prompts = [[0] * prompt_tokens for _ in lengths]
    for _ in scheduler.policy_steps(torch.nn.Linear(1, 1), "continuous", lengths, slots, prompts, out, new_batch=lambda: batch):
        pass
    snaps = batch.snapshots
    return {"waste": run_waste(snaps, reserved, block_size), "steps": out.steps, "blocks_held_over_needed": held_over_needed(snaps),
            "blocks_reused": pool.reused, "blocks_in_use_after": pool.blocks_in_use, "tables_consistent": all(s["consistent"] for s in snaps)}


def waste_draws(draws: int, slots: int, prompt_tokens: int, max_new_tokens: int, block_size: int = 16, scale: int = 1, seed: int = SEED) -> list[dict[str, object]]:
    """:func:`pool_run` on ``draws`` other seeded workloads with the printed statistics (:func:`workload.skewed_lengths`,
    seeds ``seed + 1`` to ``seed + draws``), lengths divided by ``scale`` as the real run's."""
    return [pool_run(workload.scaled(workload.skewed_lengths(seed=seed + 1 + i), scale), slots, prompt_tokens, max_new_tokens, block_size)
            for i in range(draws)]


def paged_prefix(model, prefix: Sequence[int], suffixes: Sequence[Sequence[int]], new_tokens: int, block_size: int = 16) -> dict[str, object]:
    """Requests ``prefix + suffixes[i]`` through the scheduler on the paged cache, with and without prefix sharing.

    All requests are admitted at once (one slot each). With sharing, a request forks the full
    blocks of the prompt it shares with an earlier one (reference-counted) and prefills only the
    rest. Blocks are counted after the first step of both runs; every request's tokens are
    compared with the same request run alone, up to a near-tie of the two paths' rounding
    (:func:`cheapinfer.runtime.rounding.compare_greedy`).
    """
    prompts = [list(prefix) + list(s) for s in suffixes]
    lengths = [new_tokens] * len(prompts)
    size = sum(math.ceil((len(p) + new_tokens) / block_size) for p in prompts)
    from ...runtime.evidence import combine, traced
    from ...runtime.rounding import GreedyJudge

    shared, used_shared = traced(model, lambda: run_paged(model, lengths, len(prompts), prompts, size, block_size, share_prefixes=True))
    own, used_own = traced(model, lambda: run_paged(model, lengths, len(prompts), prompts, size, block_size, share_prefixes=False))
    judge = GreedyJudge(model)
    alone = [judge(p, tokens_alone(model, p, new_tokens), shared.batch.generated[i]) for i, p in enumerate(prompts)]
    unshared = [judge(p, own.batch.generated[i], shared.batch.generated[i]) for i, p in enumerate(prompts)]
    with_, without = shared.batch.snapshots[0], own.batch.snapshots[0]
    return {
        "blocks_with": with_["blocks_in_use"],
        "blocks_without": without["blocks_in_use"],
        "shared_full_blocks": sum(n // block_size for n in shared.batch.shared_tokens.values()),
        "shared_blocks": with_["shared_blocks"],
        "shared_prefix_tokens": len(prefix),
        "tables_consistent": all(s["consistent"] for s in shared.batch.snapshots + own.batch.snapshots),
        "tokens_equal_alone": all(c.agree for c in alone),
        "tokens_equal_unshared": all(c.agree for c in unshared),
        "alone": dict(enumerate(alone)),
        "blocks_in_use_after": shared.pool.blocks_in_use,
        "evidence": combine(used_shared, used_own),
    }
