"""Properties of the batching section's code that are not claims of the book, each on many drawn workloads instead of the
one seeded workload a claim measures: the workload's statistics, the simulation's ordering, the real scheduler, the paged
cache's reads and block tables.

The drawn-workload properties run derandomized (Hypothesis's draws are a fixed function of the test, so every CI run
tries the same examples and no example database is needed) with enough examples to reach the case that crashed the
scheduler: more rows finishing in one step than requests still queued (before the fix, ``policy_steps`` popped an empty
queue).
"""

from __future__ import annotations

import itertools

import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cheapinfer.chapter.batching import paging, scheduler, workload

PROPERTY = settings(derandomize=True, database=None, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

lengths_st = st.lists(st.integers(1, 12), min_size=1, max_size=24)
slots_st = st.integers(1, 8)


class _CountingBatch:
    """The scheduler's batch interface (admit, step, drop) over bookkeeping alone: one step decrements every row's
    remaining tokens and returns the rows that reached 0. Records the step at which each request finished."""

    def __init__(self, log: dict[int, list[int]], clock: list[int]):
        self.requests: list[int] = []
        self.left: list[int] = []
        self.log, self.clock = log, clock

    def __len__(self) -> int:
        return len(self.requests)

    def admit(self, request: int, length: int, prompt_token: int, row: int | None = None) -> None:
        if row is None:
            self.requests.append(request)
            self.left.append(length)
        else:
            assert self.left[row] <= 0, "a row was refilled before its request finished"
            self.requests[row], self.left[row] = request, length

    def drop(self, rows: list[int]) -> None:
        keep = [i for i in range(len(self)) if i not in set(rows)]
        self.requests = [self.requests[i] for i in keep]
        self.left = [self.left[i] for i in keep]

    def step(self) -> list[int]:
        self.clock[0] += 1
        self.left = [n - 1 for n in self.left]
        done = [i for i, n in enumerate(self.left) if n == 0]  # finished at this step (padding rows go below 0)
        for i in done:
            self.log.setdefault(self.requests[i], []).append(self.clock[0])
        return [i for i, n in enumerate(self.left) if n <= 0]


def _run(policy: str, lengths: list[int], slots: int) -> tuple[dict[int, list[int]], workload.PolicyResult]:
    """The real scheduler (:func:`scheduler.policy_steps`) over a counting batch: each request's finishing steps."""
    log: dict[int, list[int]] = {}
    clock = [0]
    out = workload.PolicyResult(policy, 0.0, sum(lengths), 0, [0.0] * len(lengths), [0.0] * len(lengths), sum(lengths))
    holder = torch.nn.Linear(1, 1)  # the scheduler reads the device from a model's parameters
    for _ in scheduler.policy_steps(holder, policy, lengths, slots, [0] * len(lengths), out, new_batch=lambda: _CountingBatch(log, clock)):
        pass
    return log, out


@st.composite
def _pool_ops(draw):
    ops = draw(st.lists(st.tuples(st.sampled_from(["add", "reserve", "fork", "truncate", "remove"]), st.integers(0, 5), st.integers(1, 20)), max_size=40))
    return ops


@given(seed=st.integers(0, 2**32 - 1), sigma=st.floats(0.3, 1.5))
def test_skewed_lengths_have_exactly_the_books_statistics(seed, sigma):
    """The workload generator: median 18, one longest request of 231, total 1,874, for any seed and skew."""
    lengths = workload.skewed_lengths(seed=seed, sigma=sigma)
    assert workload.length_stats(lengths) == {"median_len": 18, "max_len": 231, "total_len": 1_874, "requests": 64}
    assert lengths.count(231) == 1 and min(lengths) >= 1


@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=80), slots=st.integers(1, 8))
def test_simulated_continuous_batching_returns_every_request_no_later_than_static(lengths, slots):
    """Counted in steps (unit step cost), continuous batching admits each request no later than static does, so returns it no later."""
    cost = dict.fromkeys(range(1, slots + 1), 1.0)
    s, c = workload.simulate("static", lengths, slots, cost), workload.simulate("continuous", lengths, slots, cost)
    assert all(lc <= ls for lc, ls in zip(c.latency_s, s.latency_s))
    assert max(max(lengths), -(-sum(lengths) // slots)) <= c.steps <= s.steps


@given(chunks=st.lists(st.integers(1, 40), min_size=1, max_size=6), fork_at=st.integers(0, 5), block=st.sampled_from([1, 4, 16]))
def test_paged_cache_reads_back_what_was_written(chunks, fork_at, block):
    """Any sequence of appends, with a fork part-way, reads back exactly the contiguous keys and values, and frees every block."""
    g = torch.Generator().manual_seed(len(chunks) * 100 + fork_at)
    cache = paging.PagedKVCache(2 * sum(chunks) + 2, block, 2, 8)  # enough for two sequences at one token per block
    ref = {0: [torch.zeros(2, 0, 8), torch.zeros(2, 0, 8)]}
    cache.add(0)
    for i, t in enumerate(chunks):
        if i == fork_at:
            cache.fork(0, 1)
            ref[1] = list(ref[0])
        for seq in ref:
            k, v = torch.randn(2, t, 8, generator=g), torch.randn(2, t, 8, generator=g)
            cache.append(seq, k, v)
            ref[seq] = [torch.cat([ref[seq][0], k], 1), torch.cat([ref[seq][1], v], 1)]
    for seq, (k, v) in ref.items():
        pk, pv = cache.gather(seq)
        assert torch.equal(pk, k) and torch.equal(pv, v)
        assert 0 <= cache.unused_slots(seq) < block
    for seq in list(ref):
        cache.remove(seq)
    assert cache.blocks_in_use == 0


@PROPERTY
@given(lengths_st, slots_st)
@example([1, 1, 1, 5], 3)  # three rows finish at step 1 with one request queued: the draw that crashed the scheduler
def test_real_scheduler_returns_every_request_once(lengths, slots):
    """No crash on any draw; every request finishes exactly once, after exactly its length of steps in its row
    (continuous) or by its group's longest (static); the step counts are the simulation's."""
    for policy in ("static", "continuous"):
        log, out = _run(policy, lengths, slots)
        assert sorted(log) == list(range(len(lengths))), policy
        assert all(len(v) == 1 for v in log.values()), policy
        assert out.steps == workload.simulate(policy, lengths, slots, dict.fromkeys(range(1, slots + 1), 1.0)).steps, policy


@PROPERTY
@given(lengths_st, slots_st)
def test_continuous_never_finishes_a_request_later_than_static(lengths, slots):
    """By induction over the static groups: every earlier request is done by the time static starts a group, so
    continuous has admitted the whole group by then, and each member then runs exactly its own length. Checked on the
    real scheduler's step counts and on the simulation's latencies (unit step cost)."""
    static, _ = _run("static", lengths, slots)
    continuous, _ = _run("continuous", lengths, slots)
    assert all(continuous[r][0] <= static[r][0] for r in range(len(lengths)))
    unit = dict.fromkeys(range(1, slots + 1), 1.0)
    s, c = workload.simulate("static", lengths, slots, unit), workload.simulate("continuous", lengths, slots, unit)
    assert all(lc <= ls for lc, ls in zip(c.latency_s, s.latency_s))
    assert c.steps <= s.steps


@PROPERTY
@given(st.integers(0, 10_000))
def test_skewed_lengths_have_the_printed_statistics_on_every_seed(seed):
    lengths = workload.skewed_lengths(seed=seed)
    assert workload.length_stats(lengths) == {"median_len": 18, "max_len": 231, "total_len": 1_874, "requests": 64}


@PROPERTY
@given(_pool_ops())
def test_paged_block_tables_stay_consistent_and_free_every_block(ops):
    """Any sequence of adds, reservations, forks, truncations and removals keeps every block's reference count equal to
    the tables holding it; each table holds exactly the blocks its tokens need; removing every sequence frees every block."""
    bs = 4
    pool = paging.PagedKVCache(num_blocks=64, block_size=bs, kv_heads=1, head_dim=2)
    names = itertools.count()
    for op, who, n in ops:
        live = list(pool.tables)
        seq = live[who % len(live)] if live else None
        try:
            if op == "add" or seq is None:
                pool.add(next(names))
            elif op == "reserve":
                pool.reserve(seq, n)
            elif op == "fork":
                pool.fork(seq, next(names), min(n, pool.lengths[seq]))
            elif op == "truncate":
                pool.truncate(seq, min(n, pool.lengths[seq]))
            else:
                pool.remove(seq)
        except paging.OutOfBlocks:
            pass
        assert pool.tables_consistent()
        assert all(len(t) == -(-pool.lengths[s] // bs) for s, t in pool.tables.items())
    for seq in list(pool.tables):
        pool.remove(seq)
    assert pool.blocks_in_use == 0 and pool.tables_consistent()
