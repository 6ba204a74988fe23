"""Section 2, the paged KV cache: fixed-size blocks, a block table per sequence, shared prefixes.

:class:`PagedKVCache` is a preallocated pool of fixed-size blocks, ``[num_blocks, layers, 2, H_kv,
block_size, D]``. Each sequence owns a block table (its logical blocks -> physical blocks), shared
by all layers; blocks come from a free list and are reference-counted, so a sequence forked from
another shares the blocks of their common prefix. A shared block that is not full is copied
before the first write (copy-on-write), so sharing never changes what either sequence reads.

:func:`paged_cache` puts the pool inside the model: a transformers ``Cache`` whose ``update`` writes
each layer's new keys and values through the block table and hands back every cached one, so
``model.generate(..., past_key_values=paged_cache(...))`` and the suite's own loops run on it.
Batch rows are sequences of the pool, left-aligned, the shorter ones masked
(:meth:`attention_mask`): a row holds only its own tokens, no padding.

:func:`run_waste` reads the reservation waste of a real run (the continuous-batching scheduler on
the paged cache, :func:`cheapinfer.chapter.batching.paged_scheduler.run_paged`) from the block tables it recorded.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import torch

from ...runtime import hf


class OutOfBlocks(RuntimeError):
    """The pool has no free block left."""


class PagedKVCache:
    """A pool of fixed-size blocks holding the keys and values of ``layers`` attention layers.

    A sequence's block table is shared by all layers (as in vLLM): block ``b`` holds the same
    token positions in every layer. :meth:`reserve` hands out (and copies on write) the blocks
    for new positions once; :meth:`write` stores one layer's keys and values there.
    """

    def __init__(self, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", layers: int = 1):
        self.block_size = block_size
        self.pool = torch.zeros(num_blocks, layers, 2, kv_heads, block_size, head_dim, dtype=dtype, device=device)  # [N, L, k/v, H, bs, D]
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.tables: dict[object, list[int]] = {}
        self.lengths: dict[object, int] = {}
        self.handed_out = 0  # blocks taken from the free list so far (a block reused after a free counts again)
        self.reused = 0  # of those, blocks that had been freed by an earlier sequence
        self._ever: set[int] = set()

    # -- allocation --------------------------------------------------------------------------

    def _take(self) -> int:
        if not self.free:
            raise OutOfBlocks(f"all {len(self.refs)} blocks are in use")
        b = self.free.popleft()
        self.refs[b] = 1
        self.handed_out += 1
        self.reused += b in self._ever
        self._ever.add(b)
        return b

    def _release(self, b: int) -> None:
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.free.appendleft(b)  # last freed, first handed out again: a finished sequence's blocks are reused at once

    def add(self, seq: object) -> None:
        if seq in self.tables:
            raise KeyError(f"sequence {seq!r} already exists")
        self.tables[seq], self.lengths[seq] = [], 0

    def fork(self, parent: object, child: object, tokens: int | None = None) -> None:
        """``child`` starts as the first ``tokens`` (default: all) of ``parent``'s tokens, sharing their blocks (reference counts + 1)."""
        n = self.lengths[parent] if tokens is None else tokens
        if not 0 <= n <= self.lengths[parent]:
            raise ValueError(f"cannot fork {n} tokens of a sequence holding {self.lengths[parent]}")
        self.add(child)
        self.tables[child] = list(self.tables[parent][: math.ceil(n / self.block_size)])
        self.lengths[child] = n
        for b in self.tables[child]:
            self.refs[b] += 1

    def remove(self, seq: object) -> None:
        for b in self.tables.pop(seq):
            self._release(b)
        del self.lengths[seq]

    def truncate(self, seq: object, tokens: int) -> None:
        """Keep only the first ``tokens`` tokens of ``seq``; blocks past them are released."""
        table = self.tables[seq]
        keep = math.ceil(tokens / self.block_size)
        for b in table[keep:]:
            self._release(b)
        del table[keep:]
        self.lengths[seq] = min(tokens, self.lengths[seq])

    def reserve(self, seq: object, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Make room for ``tokens`` new positions of ``seq``: (physical block, offset in it) of each, ``[T]`` each.

        A shared, partly filled last block is copied first (copy-on-write, all layers), so a
        write never changes what another sequence reads.
        """
        table, n, bs = self.tables[seq], self.lengths[seq], self.block_size
        if n % bs and self.refs[table[-1]] > 1:
            new = self._take()
            self.pool[new] = self.pool[table[-1]]
            self._release(table[-1])
            table[-1] = new
        while len(table) * bs < n + tokens:
            table.append(self._take())
        pos = torch.arange(n, n + tokens, device=self.pool.device)  # [T] logical positions
        blocks = torch.tensor(table, dtype=torch.long, device=self.pool.device)[pos // bs]  # [T] physical blocks
        self.lengths[seq] = n + tokens
        return blocks, pos % bs

    def write(self, blocks: torch.Tensor, offsets: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int = 0) -> None:
        """Store keys and values ``[M, H_kv, D]`` of one layer at the positions ``reserve`` returned (``[M]`` each)."""
        self.pool[blocks, layer, 0, :, offsets] = k.to(self.pool.dtype)
        self.pool[blocks, layer, 1, :, offsets] = v.to(self.pool.dtype)

    def append(self, seq: object, k: torch.Tensor, v: torch.Tensor, layer: int = 0) -> None:
        """Append ``T`` tokens of keys and values, each ``[H_kv, T, D]``, to ``seq`` (a one-layer pool)."""
        blocks, offsets = self.reserve(seq, k.shape[1])
        self.write(blocks, offsets, k.transpose(0, 1), v.transpose(0, 1), layer)

    # -- reading -----------------------------------------------------------------------------

    def gather(self, seq: object, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``seq`` in logical order, each ``[H_kv, S, D]``."""
        table = torch.tensor(self.tables[seq], dtype=torch.long, device=self.pool.device)
        blocks = self.pool[table, layer]  # [nb, 2, H, bs, D]
        nb, _, h, bs, d = blocks.shape
        kv = blocks.permute(1, 2, 0, 3, 4).reshape(2, h, nb * bs, d)[:, :, : self.lengths[seq]]  # [2, H, S, D]
        return kv[0], kv[1]

    def gather_batch(self, seqs: Sequence[object], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of several sequences, left-aligned and padded to the longest, each ``[B, H_kv, S_max, D]``.

        Columns past a sequence's length hold whatever its table's padding block holds: the
        caller masks them (:meth:`PagedCache.attention_mask`).
        """
        longest = max(self.lengths[s] for s in seqs)
        nb = math.ceil(longest / self.block_size)
        idx = torch.tensor([self.tables[s] + [self.tables[s][0]] * (nb - len(self.tables[s])) for s in seqs], dtype=torch.long, device=self.pool.device)  # [B, nb]
        blocks = self.pool[idx, layer]  # [B, nb, 2, H, bs, D]
        b, _, _, h, bs, d = blocks.shape
        kv = blocks.permute(2, 0, 3, 1, 4, 5).reshape(2, b, h, nb * bs, d)[..., :longest, :]  # [2, B, H, S_max, D]
        return kv[0], kv[1]

    # -- accounting --------------------------------------------------------------------------

    @property
    def blocks_in_use(self) -> int:
        return len(self.refs) - len(self.free)

    @property
    def blocks_needed(self) -> int:
        """The fewest blocks the live sequences' tokens fit in if none shares a block: ceil(tokens / block size) each,
        counted from the lengths alone (not from the tables, whose blocks are what is checked against it)."""
        return sum(math.ceil(n / self.block_size) for n in self.lengths.values())

    def unused_slots(self, seq: object) -> int:
        """Token slots reserved in ``seq``'s blocks but not holding one of its tokens."""
        return len(self.tables[seq]) * self.block_size - self.lengths[seq]

    def tables_consistent(self) -> bool:
        """Every block's reference count equals the number of tables holding it, and no free block is held."""
        held = [0] * len(self.refs)
        for table in self.tables.values():
            for b in table:
                held[b] += 1
        return held == self.refs and not any(held[b] for b in self.free) and len(set(self.free)) == len(self.free)

    @property
    def shared_blocks(self) -> int:
        """Blocks held by more than one sequence."""
        return sum(r > 1 for r in self.refs)


# ----------------------------------------------------------------------------------------------
# reservation waste of a run, from its block tables
# ----------------------------------------------------------------------------------------------


@dataclass
class Waste:
    """Token slots x steps, summed over a run's decode steps."""

    used_tokens: int  # tokens the live sequences actually held
    reserved_max_context: int  # slots max-context reservation would have held for them
    reserved_longest: int  # slots if every live sequence had reserved the run's longest sequence
    reserved_paged: int  # slots in the blocks the paged cache had handed out
    max_unused_per_sequence_paged: int  # worst sequence: slots in its blocks it does not use
    block_size: int

    @property
    def unused_fraction_max_context(self) -> float:
        return _unused(self.used_tokens, self.reserved_max_context)

    @property
    def unused_fraction_longest(self) -> float:
        return _unused(self.used_tokens, self.reserved_longest)

    @property
    def unused_fraction_paged(self) -> float:
        return _unused(self.used_tokens, self.reserved_paged)


def _unused(used: int, reserved: int) -> float:
    """1 - used / reserved; NaN where nothing was reserved (a run whose cache held nothing has no waste to read)."""
    return 1 - used / reserved if reserved else math.nan


def run_waste(snapshots: Sequence[dict], reserved_per_slot: int, block_size: int) -> Waste:
    """Reservation waste of a real run, summed over its steps from the block tables it recorded.

    Each snapshot (one per decode step) holds every live sequence's tokens and unused slots and
    the blocks in use. Max-context reservation would have held ``reserved_per_slot`` slots for
    every live sequence at that step; the paged cache held the blocks in use. Units: token slots
    x steps.
    """
    used = sum(sum(s["tokens"]) for s in snapshots)
    longest = max(max(s["tokens"]) for s in snapshots)
    return Waste(
        used_tokens=used,
        reserved_max_context=sum(len(s["tokens"]) * reserved_per_slot for s in snapshots),
        reserved_longest=sum(len(s["tokens"]) * longest for s in snapshots),
        reserved_paged=sum(s["blocks_in_use"] * block_size for s in snapshots),
        max_unused_per_sequence_paged=max(max(s["unused_slots"]) for s in snapshots),
        block_size=block_size,
    )


# ----------------------------------------------------------------------------------------------
# the paged cache inside the model: a transformers ``Cache`` over the block table
# ----------------------------------------------------------------------------------------------


def _model_dims(config) -> tuple[int, int, int]:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim


def paged_cache(config, num_blocks: int, block_size: int = 16, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", rows: Sequence[object] | None = None, pool: PagedKVCache | None = None):
    """A transformers ``Cache`` whose keys and values live in a :class:`PagedKVCache` (one block table per sequence, all layers).

    Batch row ``b`` of the model's inputs is sequence ``rows[b]`` of the pool (default: one new
    sequence, ``0``). Pass ``pool`` to give several caches (views on different rows) one pool.
    """
    Cache, Layer = hf.cache_bases()
    layers, kv_heads, head_dim = _model_dims(config)

    class PagedLayer(Layer):
        """One decoder layer's view of the pool. Row lengths come from the pool's shared tables."""

        is_sliding = False
        is_croppable = True

        def __init__(self, owner, index: int):
            super().__init__()
            self.owner, self.index = owner, index
            self.is_initialized = True

        def lazy_initialization(self, key_states, value_states) -> None:  # the pool is allocated up front
            return None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            """Write ``[B, H, T, D]`` new keys and values, return every cached one ``[B, H, S_max, D]`` (rows left-aligned)."""
            return self.owner._update(key_states, value_states, self.index)

        def get_seq_length(self) -> int:
            return self.owner.get_seq_length()

        def mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.owner.get_seq_length() + query_length, 0

        def crop(self, tokens_to_remove: int) -> None:
            if self.index == 0:
                self.owner.crop(tokens_to_remove)

        def reset(self) -> None:
            return None

    class PagedCache(Cache):
        """See :func:`paged_cache`. ``pool`` holds the blocks; ``rows`` maps batch rows to sequences."""

        def __init__(self):
            self.pool = pool if pool is not None else PagedKVCache(num_blocks, block_size, kv_heads, head_dim, dtype, device, layers)
            self.rows: list[object] = list(rows) if rows is not None else [0]
            for seq in self.rows:
                if seq not in self.pool.tables:
                    self.pool.add(seq)
            self._slots: tuple[torch.Tensor, torch.Tensor] | None = None  # where layer 0 put this forward's tokens
            super().__init__(layers=[PagedLayer(self, i) for i in range(layers)])

        def _update(self, k: torch.Tensor, v: torch.Tensor, layer: int):
            B, H, T, D = k.shape
            if B != len(self.rows):
                raise ValueError(f"the batch has {B} rows but the paged cache maps {len(self.rows)}")
            if layer == 0 and T > 1 and B > 1 and len(set(self.lengths())) > 1:
                raise ValueError("rows of different lengths take one token per forward (left-aligned rows would see each other's future)")
            if layer == 0:  # layer 0 comes first in every forward: hand out the blocks once for all layers
                where = [self.pool.reserve(seq, T) for seq in self.rows]
                self._slots = (torch.cat([b for b, _ in where]), torch.cat([o for _, o in where]))  # [B * T] each
            blocks, offsets = self._slots
            self.pool.write(blocks, offsets, k.permute(0, 2, 1, 3).reshape(B * T, H, D), v.permute(0, 2, 1, 3).reshape(B * T, H, D), layer)
            return self.pool.gather_batch(self.rows, layer)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return max((self.pool.lengths[s] for s in self.rows), default=0)

        def lengths(self) -> list[int]:
            return [self.pool.lengths[s] for s in self.rows]

        def attention_mask(self, new_tokens: int = 1) -> torch.Tensor:
            """``[B, S_max + new_tokens]`` for the next forward: 1 where a row's own tokens (cached, then new) will sit, 0 on the padding of shorter rows."""
            lengths = torch.tensor(self.lengths(), device=self.pool.pool.device)
            cols = torch.arange(self.get_seq_length() + new_tokens, device=lengths.device)
            return (cols[None, :] < lengths[:, None] + new_tokens).long()

        def position_ids(self, new_tokens: int = 1) -> torch.Tensor:
            """``[B, new_tokens]``: each row's next positions (its own length onwards)."""
            lengths = torch.tensor(self.lengths(), device=self.pool.pool.device)
            return lengths[:, None] + torch.arange(new_tokens, device=lengths.device)

        def crop(self, tokens_to_remove: int) -> None:
            """``crop(-n)`` drops each row's last ``n`` tokens; ``crop(m)`` with m >= 0 keeps the first ``m``."""
            for seq in self.rows:
                n = self.pool.lengths[seq]
                self.pool.truncate(seq, n + tokens_to_remove if tokens_to_remove < 0 else tokens_to_remove)

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.rows = [self.rows[i] for i in indices.tolist()]

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            if len(set(beam_idx.tolist())) != len(beam_idx):
                raise NotImplementedError("beam search would fork rows: fork them in the pool first")
            self.batch_select_indices(beam_idx)

        def batch_repeat_interleave(self, repeats: int) -> None:
            raise NotImplementedError("fork sequences in the pool (PagedKVCache.fork) instead of repeating rows")

        def reset(self) -> None:
            for seq in self.rows:
                self.pool.truncate(seq, 0)

        @property
        def is_compileable(self) -> bool:
            return False

    return PagedCache()
