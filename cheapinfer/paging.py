"""Section 2, the paged KV cache: fixed-size blocks, a block table per sequence, shared prefixes.

:class:`PagedKVCache` stores the keys and values of one attention layer (all its KV heads) in a
preallocated pool of fixed-size blocks, ``[num_blocks, 2, H_kv, block_size, D]``. Each sequence
owns a block table (its logical blocks -> physical blocks); blocks come from a free list and are
reference-counted, so a sequence forked from another shares the blocks of their common prefix.
A shared block that is not full is copied before the first write (copy-on-write), so sharing
never changes what either sequence reads. :meth:`PagedKVCache.attention` gathers a sequence's
blocks through its table and runs ordinary scaled-dot-product attention; it equals attention over
the contiguous cache exactly, because the gathered keys and values are the same numbers in the
same order. (Scope: one layer's cache and attention, checked against a contiguous reference;
the model's own forward pass keeps its own cache.)

:func:`reservation_waste` and :func:`prefix_sharing` account for a workload of many sequences:
reserved-but-unused memory under max-context reservation and under paging, and the blocks a
shared prefix saves.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F


class OutOfBlocks(RuntimeError):
    """The pool has no free block left."""


class PagedKVCache:
    def __init__(self, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.block_size = block_size
        self.pool = torch.zeros(num_blocks, 2, kv_heads, block_size, head_dim, dtype=dtype, device=device)  # [N, k/v, H, bs, D]
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.tables: dict[object, list[int]] = {}
        self.lengths: dict[object, int] = {}

    # -- allocation --------------------------------------------------------------------------

    def _take(self) -> int:
        if not self.free:
            raise OutOfBlocks(f"all {len(self.refs)} blocks are in use")
        b = self.free.popleft()
        self.refs[b] = 1
        return b

    def _release(self, b: int) -> None:
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.free.append(b)

    def add(self, seq: object) -> None:
        if seq in self.tables:
            raise KeyError(f"sequence {seq!r} already exists")
        self.tables[seq], self.lengths[seq] = [], 0

    def fork(self, parent: object, child: object) -> None:
        """``child`` starts as ``parent``'s tokens, sharing every block of them (reference counts + 1)."""
        self.add(child)
        self.tables[child] = list(self.tables[parent])
        self.lengths[child] = self.lengths[parent]
        for b in self.tables[child]:
            self.refs[b] += 1

    def remove(self, seq: object) -> None:
        for b in self.tables.pop(seq):
            self._release(b)
        del self.lengths[seq]

    def append(self, seq: object, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append ``T`` tokens of keys and values, each ``[H_kv, T, D]``, to ``seq``."""
        table, n, bs = self.tables[seq], self.lengths[seq], self.block_size
        T = k.shape[1]
        if n % bs and self.refs[table[-1]] > 1:  # copy-on-write: the partial last block is shared
            new = self._take()
            self.pool[new] = self.pool[table[-1]]
            self._release(table[-1])
            table[-1] = new
        while len(table) * bs < n + T:
            table.append(self._take())
        pos = torch.arange(n, n + T, device=self.pool.device)  # [T] logical positions
        blocks = torch.tensor(table, dtype=torch.long, device=self.pool.device)[pos // bs]  # [T] physical blocks
        offsets = pos % bs  # [T]
        self.pool[blocks, 0, :, offsets] = k.transpose(0, 1).to(self.pool.dtype)  # [T, H, D]
        self.pool[blocks, 1, :, offsets] = v.transpose(0, 1).to(self.pool.dtype)
        self.lengths[seq] = n + T

    # -- reading -----------------------------------------------------------------------------

    def gather(self, seq: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``seq`` in logical order, each ``[H_kv, S, D]``."""
        table = torch.tensor(self.tables[seq], dtype=torch.long, device=self.pool.device)
        blocks = self.pool[table]  # [nb, 2, H, bs, D]
        nb, _, h, bs, d = blocks.shape
        kv = blocks.permute(1, 2, 0, 3, 4).reshape(2, h, nb * bs, d)[:, :, : self.lengths[seq]]  # [2, H, S, D]
        return kv[0], kv[1]

    def attention(self, seq: object, q: torch.Tensor) -> torch.Tensor:
        """Attention of queries ``q`` [H_q, Tq, D] (the last Tq positions of ``seq``) over its cache."""
        k, v = self.gather(seq)
        return contiguous_attention(q, k, v)

    # -- accounting --------------------------------------------------------------------------

    @property
    def blocks_in_use(self) -> int:
        return len(self.refs) - len(self.free)

    def unused_slots(self, seq: object) -> int:
        """Token slots reserved in ``seq``'s blocks but not holding one of its tokens."""
        return len(self.tables[seq]) * self.block_size - self.lengths[seq]


def contiguous_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Reference: causal attention of ``q`` [H_q, Tq, D] over a contiguous cache ``k``, ``v`` [H_kv, S, D] (grouped-query)."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)  # [H_q, S, D]
    tq, s = q.shape[1], k.shape[1]
    mask = torch.ones(tq, s, dtype=torch.bool, device=q.device).tril(s - tq)  # query i sees keys <= s - tq + i
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)[0]  # [H_q, Tq, D]


# ----------------------------------------------------------------------------------------------
# the workload: reservation waste and prefix sharing
# ----------------------------------------------------------------------------------------------


@dataclass
class Waste:
    used_tokens: int  # tokens the sequences actually hold
    reserved_max_context: int  # token slots reserved by max-context reservation
    reserved_longest: int  # slots reserved if every slot reserved the workload's longest sequence
    reserved_paged: int  # slots in the blocks the paged cache handed out
    max_unused_per_sequence_paged: int  # worst sequence: slots in its blocks it does not use
    block_size: int

    @property
    def unused_fraction_max_context(self) -> float:
        return 1 - self.used_tokens / self.reserved_max_context

    @property
    def unused_fraction_longest(self) -> float:
        return 1 - self.used_tokens / self.reserved_longest

    @property
    def unused_fraction_paged(self) -> float:
        return 1 - self.used_tokens / self.reserved_paged


def fill(cache: PagedKVCache, seq: object, tokens: int, generator: torch.Generator, chunk: int | None = None) -> None:
    """Append ``tokens`` tokens of seeded random keys/values to ``seq`` (one append, or ``chunk`` at a time)."""
    _, _, h, _, d = cache.pool.shape
    step = chunk or tokens
    for start in range(0, tokens, step):
        t = min(step, tokens - start)
        cache.append(seq, torch.randn(h, t, d, generator=generator), torch.randn(h, t, d, generator=generator))


def reservation_waste(
    prompt: int,
    outputs: Sequence[int],
    max_new_tokens: int,
    block_size: int = 16,
    kv_heads: int = 2,
    head_dim: int = 64,
    seed: int = 0,
) -> Waste:
    """Max-context reservation vs paging for sequences of ``prompt`` + ``outputs[i]`` tokens.

    Max-context reservation gives every sequence ``prompt + max_new_tokens`` slots up front.
    The paged cache is run for real: the prompt is appended at once, then each output token one
    at a time (as decode does), and the blocks it handed out are counted.
    """
    lengths = [prompt + n for n in outputs]
    need = sum(math.ceil(n / block_size) for n in lengths)
    cache = PagedKVCache(need, block_size, kv_heads, head_dim)
    g = torch.Generator().manual_seed(seed)
    for i, n in enumerate(outputs):
        cache.add(i)
        fill(cache, i, prompt, g)
        fill(cache, i, n, g, chunk=1)
    return Waste(
        used_tokens=sum(lengths),
        reserved_max_context=len(lengths) * (prompt + max_new_tokens),
        reserved_longest=len(lengths) * max(lengths),
        reserved_paged=cache.blocks_in_use * block_size,
        max_unused_per_sequence_paged=max(cache.unused_slots(i) for i in range(len(lengths))),
        block_size=block_size,
    )


@dataclass
class Sharing:
    blocks_without: int  # every sequence stores its own copy of the prefix
    blocks_with: int  # sequences forked from one holder of the prefix
    shared_full_blocks: int  # full prefix blocks held once instead of once per sequence

    @property
    def saved(self) -> int:
        return self.blocks_without - self.blocks_with


def prefix_sharing(prefix: int, suffixes: Sequence[int], block_size: int = 16, kv_heads: int = 2, head_dim: int = 64, seed: int = 0) -> Sharing:
    """Blocks used by sequences of ``prefix`` shared tokens + ``suffixes[i]`` own tokens, with and without sharing.

    Both caches are run for real on the same keys and values. With sharing, the prefix is written
    once and every sequence is forked from it; a partial last prefix block is copied on the first
    write of each fork.
    """
    n = len(suffixes)
    full = prefix // block_size
    size = sum(math.ceil((prefix + s) / block_size) for s in suffixes) + 1
    g = torch.Generator().manual_seed(seed)
    pk, pv = torch.randn(kv_heads, prefix, head_dim, generator=g), torch.randn(kv_heads, prefix, head_dim, generator=g)
    own = [(torch.randn(kv_heads, s, head_dim, generator=g), torch.randn(kv_heads, s, head_dim, generator=g)) for s in suffixes]

    alone = PagedKVCache(size, block_size, kv_heads, head_dim)
    for i, (k, v) in enumerate(own):
        alone.add(i)
        alone.append(i, pk, pv)
        alone.append(i, k, v)

    shared = PagedKVCache(size, block_size, kv_heads, head_dim)
    shared.add("prefix")
    shared.append("prefix", pk, pv)
    for i, (k, v) in enumerate(own):
        shared.fork("prefix", i)
        shared.append(i, k, v)
    shared.remove("prefix")  # the prefix lives on in the sequences that share it
    for i in range(n):  # sharing must not change what any sequence reads
        a, b = alone.gather(i), shared.gather(i)
        if not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])):
            raise AssertionError(f"sequence {i}: the shared cache reads different keys or values")
    return Sharing(alone.blocks_in_use, shared.blocks_in_use, (n - 1) * full)


def model_kv(model, input_ids: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values a transformers model caches at ``layer`` for ``input_ids`` [1, S]: each [H_kv, S, D]."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=input_ids.to(next(model.parameters()).device), cache=cache, use_cache=True)
    return cache.layers[layer].keys[0].clone(), cache.layers[layer].values[0].clone()


def paged_equals_contiguous(model, prompt_ids: torch.Tensor, continuations: Sequence[torch.Tensor], layer: int, block_size: int = 16, seed: int = 0) -> dict[str, object]:
    """Real keys and values of ``model`` in a paged cache with a shared prefix, against contiguous caches.

    Sequence i is ``prompt_ids`` [P] followed by ``continuations[i]`` [T_i]; the prompt's keys and
    values (from the model) are written once and shared by forking; each continuation's keys and
    values (from the model run on the whole sequence) are appended one token at a time, as decode
    does. For every sequence, attention of seeded queries over the paged cache must equal attention
    over the contiguous cache exactly.
    """
    pk, pv = model_kv(model, prompt_ids[None], layer)  # [H, P, D]
    heads = model.config.num_attention_heads
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for cont in continuations:
        k, v = model_kv(model, torch.cat([prompt_ids, cont])[None], layer)
        seqs.append((torch.cat([pk, k[:, len(prompt_ids):]], 1), torch.cat([pv, v[:, len(prompt_ids):]], 1)))  # [H, P + T, D]
    h, _, d = pk.shape
    need = sum(math.ceil(k.shape[1] / block_size) for k, _ in seqs) + math.ceil(len(prompt_ids) / block_size)
    cache = PagedKVCache(need, block_size, h, d, dtype=pk.dtype, device=pk.device)
    cache.add("prompt")
    cache.append("prompt", pk, pv)
    equal, max_diff = True, 0.0
    for i, (k, v) in enumerate(seqs):
        cache.fork("prompt", i)
        for t in range(len(prompt_ids), k.shape[1]):
            cache.append(i, k[:, t : t + 1], v[:, t : t + 1])
    for i, (k, v) in enumerate(seqs):
        q = torch.randn(heads, 4, d, generator=g).to(pk.device, pk.dtype)  # [H_q, 4, D]: the last 4 positions
        paged, ref = cache.attention(i, q), contiguous_attention(q, k, v)
        equal &= torch.equal(paged, ref)
        max_diff = max(max_diff, float((paged - ref).abs().max()))
    return {"equal": bool(equal), "max_abs_diff": max_diff, "blocks_in_use": cache.blocks_in_use, "sequences": len(seqs), "shared_prompt_tokens": len(prompt_ids)}
