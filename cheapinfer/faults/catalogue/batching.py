"""Batching and the paged cache (section 2): the batch step, the schedulers, the blocks."""

from __future__ import annotations

import dataclasses
import math

from ...chapter.batching import batching, knee, paged_scheduler, paging, scheduler, workload
from ..base import CONSTANT, DISABLED, RULE, STATISTIC, fault, patched
from .patches import misspelled_while, replaying_steps

# ------------------------------------------------------------------------------------------------
# 2. Batching, paged cache
# ------------------------------------------------------------------------------------------------


@fault(
    "batch-step-replays-first",
    section="batching",
    kind=RULE,
    targets=("BAT-1-TO-16", "BAT-KNEE", "BAT-TRADEOFF", "BAT-STATIC-CONT"),
    what="the batch curve's repeatable decode step runs its forward once and replays that result on every later call (a step function cached by its arguments), so the clock times no step at any batch size",
)
def _batch_step_replays():
    with replaying_steps(batching, "decode_step"):
        yield


@fault(
    "batch-step-cache-keyword-dropped",
    section="batching",
    kind=DISABLED,
    targets=("BAT-1-TO-16", "BAT-KNEE", "BAT-TRADEOFF", "Q-BYTES-SPEED"),
    what="the batch decode step (the batch curve's, and the low-bit formats' at batch 1) hands its cache over under a keyword the installed transformers does not take, which swallows it: every step decodes its token without the 64-token history",
)
def _batch_step_cache_dropped():
    with patched(batching, "decode_step", misspelled_while(batching, batching.decode_step, returns_callable=True)):
        yield


@fault(
    "scheduler-cache-keyword-dropped",
    section="batching",
    kind=DISABLED,
    targets=("BAT-STATIC-CONT",),
    what="the slot scheduler's step (static and continuous alike) hands the batch's cache over under a keyword the model swallows: each step decodes without the requests' histories",
)
def _scheduler_cache_dropped():
    with patched(scheduler.SlotBatch, "step", misspelled_while(batching, scheduler.SlotBatch.step)):
        yield


@fault(
    "paged-scheduler-cache-keyword-dropped",
    section="batching",
    kind=DISABLED,
    targets=("PAGE-WASTE", "PAGE-PREFIX"),
    what="the scheduler on the paged cache hands the paged cache over under a keyword the model swallows, in its prefills and its decode steps: the block tables fill as scheduled, the model never reads them",
)
def _paged_scheduler_cache_dropped():
    with patched(paged_scheduler.PagedSlotBatch, "step", misspelled_while(batching, paged_scheduler.PagedSlotBatch.step)), \
            patched(paged_scheduler.PagedSlotBatch, "admit", misspelled_while(batching, paged_scheduler.PagedSlotBatch.admit)):
        yield


@fault(
    "batch-cache-capped-at-16",
    section="batching",
    kind=CONSTANT,
    targets=("BAT-1-TO-16",),
    what="the batch curve's synthetic caches stop at 16 tokens (a default window that overrides the 64 asked for): every step still grows its cache and attends, to a quarter of the history the claim names",
)
def _batch_cache_capped_at_16():
    real = batching.random_cache

    def capped(config, context, dtype, device, seed=0, batch=1):
        return real(config, min(context, 16), dtype, device, seed, batch)

    with patched(batching, "random_cache", capped):
        yield


@fault(
    "paging-gather-in-physical-order",
    section="batching",
    kind=RULE,
    targets=("PAGE-WASTE",),
    what="the batch gather reads each sequence's blocks in physical order (sorted block ids) instead of its table's order: right wherever the allocator happened to hand out ascending blocks, wrong once freed blocks come back in another order",
)
def _paging_gather_in_physical_order():
    real = paging.PagedKVCache.gather_batch

    def gather_batch(self, seqs, layer):
        tables = {s: self.tables[s] for s in seqs}
        try:
            for s in seqs:
                self.tables[s] = sorted(tables[s])
            return real(self, seqs, layer)
        finally:
            self.tables.update(tables)

    with patched(paging.PagedKVCache, "gather_batch", gather_batch):
        yield


@fault(
    "batch-decoded-serially",
    section="batching",
    kind=DISABLED,
    targets=("BAT-1-TO-16",),
    what="the batched decode step loops over its rows, decoding one request after another with its own one-row cache, so a batch of B costs B single steps",
)
def _batch_decoded_serially():
    import torch

    real = batching.decode_step

    def serial(model, batch: int, context: int = 64, seed: int = batching.SEED):
        rows = [real(model, 1, context, seed + i) for i in range(batch)]

        def step() -> torch.Tensor:
            return torch.cat([row() for row in rows])  # [B]

        return step

    with patched(batching, "decode_step", serial):
        yield


@fault(
    "latency-per-token",
    section="batching",
    kind=STATISTIC,
    targets=("BAT-1-TO-16", "BAT-KNEE", "BAT-TRADEOFF"),
    what="per-request latency is computed as the step time divided by the batch size (the time per generated token), not the step every request of the batch waits for",
)
def _latency_per_token():
    with patched(batching, "request_latency", lambda step_s, batch: step_s / batch):
        yield


@fault(
    "knee-search-stops-at-first-doubling",
    section="batching",
    kind=RULE,
    targets=("BAT-KNEE",),
    what="the knee rule returns after the first doubling of the batch (a return indented into the loop) instead of searching past the steepest doubling",
)
def _knee_first_doubling():
    def first_only(found, threshold: float = 1.25, sigmas: float = 3.0):
        for d in found:
            if d.side(threshold, sigmas) == "below":
                return d.small
            return None
        return None

    with patched(knee, "knee", first_only):
        yield


@fault(
    "knee-search-stops-at-fixed-size",
    section="batching",
    kind=RULE,
    targets=("BAT-KNEE",),
    what="the knee search looks no further than a fixed batch size, 16 (the book's own table), and stops there, although the device's memory and the search's time budget allow more",
)
def _knee_search_fixed_size():
    real = knee.search_knee
    fixed = 16

    def stop_at_fixed(steps, spent_s, budget, memory, rounds, warmup=1, setup_s=0.0):
        if max(steps) >= fixed:
            return knee.Plan(None, f"the search stops at batch {fixed}")
        return knee.plan_next(steps, spent_s, budget, memory, rounds, warmup=warmup, setup_s=setup_s)

    def fixed_range(curve, measure, budget, memory, rounds, threshold=1.25, sigmas=3.0, warmup=1, plan=None, clock=None):
        kept = {b: v for b, v in curve.items() if b <= fixed}
        return real(kept, measure, budget, memory, rounds, threshold, sigmas, warmup, plan=stop_at_fixed, **({"clock": clock} if clock else {}))

    with patched(knee, "search_knee", fixed_range):
        yield


@fault(
    "workload-draws-share-one-seed",
    section="batching",
    kind=STATISTIC,
    targets=("BAT-STATIC-CONT",),
    what="the sensitivity loop seeds every other workload with seed + 1 (the loop index left out), so the 'spread over 200 workloads' is 200 copies of one",
)
def _workload_draws_share_one_seed():
    real = workload.skewed_lengths
    with patched(workload, "skewed_lengths", lambda n=64, seed=workload.SEED, **kw: real(n, seed=min(seed, workload.SEED + 1), **kw)):
        yield


@fault(
    "static-refills-slots",
    section="batching",
    kind=RULE,
    targets=("BAT-STATIC-CONT",),
    what="the static scheduler admits the next queued request into a freed slot at the next step, like a continuous one, instead of holding the slot as padding until the group's longest member is done",
)
def _static_refills_slots():
    real = workload.simulate

    def refilling(policy, lengths, slots, step_cost):
        result = real("continuous" if policy == "static" else policy, lengths, slots, step_cost)
        return dataclasses.replace(result, policy=policy)

    with patched(workload, "simulate", refilling):
        yield


@fault(
    "scheduler-reused-row-keeps-mask",
    section="batching",
    kind=RULE,
    targets=("BAT-STATIC-CONT",),
    what="the slot scheduler admits a request into a freed row without resetting that row's attention mask, so the new request reads the previous occupant's cache columns: the same schedule, steps and cache use, another request's context",
)
def _reused_row_keeps_mask():
    real = scheduler.SlotBatch.admit

    def admit(self, request, length, prompt_token, row=None):
        if row is None:
            return real(self, request, length, prompt_token, row)
        kept = self.mask[row].clone()
        real(self, request, length, prompt_token, row)
        self.mask[row] = kept

    with patched(scheduler.SlotBatch, "admit", admit):
        yield


@fault(
    "continuous-waits-for-its-batch",
    section="batching",
    kind=DISABLED,
    targets=("BAT-STATIC-CONT",),
    what="the real continuous scheduler holds a freed slot until its whole batch is done, as the static one does (a refill that never fires): the real run no longer measures continuous batching, while the simulation still does",
)
def _continuous_waits():
    real = scheduler.policy_steps

    def steps(model, policy, *args, **kwargs):
        return real(model, "static", *args, **kwargs)

    with patched(scheduler, "policy_steps", steps):
        yield


@fault(
    "paging-block-handed-out-twice",
    section="batching",
    kind=RULE,
    targets=("PAGE-WASTE", "PAGE-PREFIX"),
    what="the allocator hands out a block but leaves it on the free list, so a later sequence is mapped onto the same physical block",
)
def _paging_block_twice():
    real = paging.PagedKVCache._take

    def take(self) -> int:
        b = real(self)
        self.free.appendleft(b)  # the bug: handed out, yet left at the head of the free list (peeked, never popped)
        return b

    with patched(paging.PagedKVCache, "_take", take):
        yield


@fault(
    "paging-fork-not-refcounted",
    section="batching",
    kind=RULE,
    targets=("PAGE-PREFIX",),
    what="a sequence that shares a prefix's blocks does not take a reference on them, so the first owner to finish frees blocks still in use",
)
def _paging_fork_no_ref():
    real = paging.PagedKVCache.fork

    def fork(self, parent, child, tokens=None) -> None:
        real(self, parent, child, tokens)
        for b in self.tables[child]:
            self.refs[b] -= 1  # the bug: the fork's reference is never taken

    with patched(paging.PagedKVCache, "fork", fork):
        yield


@fault(
    "paging-block-reserved-ahead",
    section="batching",
    kind=RULE,
    targets=("PAGE-WASTE",),
    what="the pool takes a sequence's next block as soon as its last one is full, ahead of the token that needs it (lookahead allocation): every sequence whose length is a whole number of blocks holds one block it does not use",
)
def _paging_block_reserved_ahead():
    real_reserve, real_gather = paging.PagedKVCache.reserve, paging.PagedKVCache.gather_batch

    def reserve(self, seq, tokens):
        placed = real_reserve(self, seq, tokens)
        if self.lengths[seq] == len(self.tables[seq]) * self.block_size:
            self.tables[seq].append(self._take())  # the bug: taken ahead of its first token
        return placed

    def gather_batch(self, seqs, layer):  # reads the blocks that hold tokens, as such an allocator's gather does
        full = {s: self.tables[s] for s in seqs}
        nb = math.ceil(max(self.lengths[s] for s in seqs) / self.block_size)
        try:
            self.tables.update({s: t[:nb] for s, t in full.items()})
            return real_gather(self, seqs, layer)
        finally:
            self.tables.update(full)

    with patched(paging.PagedKVCache, "reserve", reserve), patched(paging.PagedKVCache, "gather_batch", gather_batch):
        yield


# ------------------------------------------------------------------------------------------------
# the other side of a bound (issue #43): a fault a one-sided check passes that lies beyond the limit on its
# other side; red on the check that bounds its claim from there, and on nothing the one-sided check saw
# ------------------------------------------------------------------------------------------------


@fault(
    "knee-gain-before-over-two-doublings",
    section="batching",
    kind=RULE,
    targets=("BAT-KNEE",),
    what="the steepest doubling before the knee is read from its batch to the size two doublings on (an index one too far), so the gain reported is two doublings' product, above 2",
)
def _knee_gain_before_over_two_doublings():
    real = knee.knee_summary

    def summary(found, threshold=1.25, sigmas=3.0):
        found = list(found)
        k = real(found, threshold, sigmas)
        at = next((i for i, d in enumerate(found) if k.batch is not None and d.small < k.batch and d.gain == k.gain_before), None)
        if at is None or at + 1 >= len(found):
            return k
        nxt = found[at + 1]
        return dataclasses.replace(k, gain_before=k.gain_before * nxt.gain,
                       gain_before_se=math.hypot(k.gain_before_se * nxt.gain, nxt.gain_se * k.gain_before))

    with patched(knee, "knee_summary", summary):
        yield
