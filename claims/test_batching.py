"""Section 2 of the chapter: batching, continuous batching and the paged KV cache."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, strategies as st  # noqa: E402

from cheapinfer import batching, paging, timing  # noqa: E402
from fixtures.plugin import on_profiles  # noqa: E402

CONTEXT = 64  # tokens each request holds in its cache (the book's setting)
SLOTS = 8
KNEE_GAIN = 1.25  # a doubling of the batch that buys less than this is past the knee
ROUNDS = 5  # median of 5 interleaved rounds: the batch-32 step dominates the run time on 2 CPU cores
# Lengths of the real static-vs-continuous run are divided by this on CPU (same skew, fewer steps).
CPU_LENGTH_SCALE = 16


def _threads(device: torch.device) -> int | None:
    """CPU steps run on the suite's timing threads (see timing.TIMING_THREADS)."""
    return timing.TIMING_THREADS if device.type == "cpu" else None


def _batch_sizes(device: torch.device) -> list[int]:
    """1..8 (the step costs of 1..8 occupied slots) and 16..128 (256 on CUDA, where it is cheap).

    On a 2-core CPU the gain per doubling fell 2.2, 1.7, 1.5, 1.4, 1.24 from 2 -> 4 to 32 -> 64: 128
    puts the knee's doubling well past the 1.25x threshold instead of on it.
    """
    return list(range(1, SLOTS + 1)) + [16, 32, 64, 128] + ([256] if device.type == "cuda" else [])


@pytest.fixture(scope="module")
def _curves() -> dict:
    return {}


@pytest.fixture
def step_times(_curves, timed, device):
    """``step_times(profile)``: batch size -> median seconds of one decode step, measured once per module."""

    def measure(profile) -> dict[int, float]:
        if profile.name not in _curves:
            sizes = _batch_sizes(device)
            steps = {f"batch={b}": batching.decode_step(profile.model, b, CONTEXT) for b in sizes}
            samples = timed(steps, rounds=ROUNDS, warmup=1)
            _curves[profile.name] = {b: samples[f"batch={b}"].median for b in sizes}
        return _curves[profile.name]

    return measure


def _powers(points):
    return [p for p in points if p.batch & (p.batch - 1) == 0]


def _plot(points, name: str):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    b = [p.batch for p in points]
    ax.plot(b, [p.throughput for p in points], "o-", color="tab:blue", label="throughput")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (requests, 64-token cache each)")
    ax.set_ylabel("tokens / s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(b, [p.latency_s * 1e3 for p in points], "s--", color="tab:red", label="latency per request")
    ax2.set_ylabel("latency per request (ms)", color="tab:red")
    ax.set_title(f"One decode step, {name}")
    return fig


@pytest.mark.claim("BAT-1-TO-16")
@on_profiles("twin", "book")
def test_batch_1_to_16_raises_throughput_and_latency(claim, profile, step_times):
    """BAT-1-TO-16: "From one request to sixteen multiplies throughput by 6.0 and the wait of every individual request by 2.67"."""
    points = batching.curve(step_times(profile))
    throughput_gain, latency_gain = batching.gains(points, 1, 16)
    base = points[0]
    claim.table("Batch size vs latency and throughput (64-token cache per request, one decode step)", batching.CURVE_HEADER, [p.row(base) for p in _powers(points)])
    claim.figure(f"bat-batch-curve-{profile.name}" if profile.name != "twin" else "bat-batch-curve", _plot(_powers(points), profile.name))
    claim.verify(
        profile.name,
        throughput_gain=throughput_gain,
        latency_gain=latency_gain,
        step_ms={p.batch: round(p.latency_s * 1e3, 2) for p in points},
        tokens_per_s={p.batch: round(p.throughput, 3) for p in points},
    )


@pytest.mark.claim("BAT-KNEE")
def test_batch_curve_has_a_knee(claim, twin, step_times, device):
    """BAT-KNEE: "From 16 to 32 throughput rises 9% while latency nearly doubles ... Every deployment has such a knee"."""
    points = _powers(batching.curve(step_times(twin)))
    at, doublings = batching.knee(points, KNEE_GAIN)
    tg, lg = batching.gains(points, 16, 32)
    claim.table("Throughput gain per doubling of the batch", ["from", "to", "throughput gain"], [[a, b, f"{g:.2f}x"] for a, b, g in doublings])
    claim.note(
        f"Knee (first doubling after the steepest one gaining < {KNEE_GAIN}x): from batch {at} on this device."
        if at
        else f"No doubling after the steepest one gained less than {KNEE_GAIN}x up to batch {points[-1].batch}."
    )
    claim.verify(
        "twin",
        min_doubling_gain=batching.gain_past_steepest(doublings),
        knee_batch=at,
        throughput_gain_16_32=tg,
        latency_gain_16_32=lg,
    )


@pytest.mark.claim("BAT-TRADEOFF")
def test_no_batch_size_improves_both_throughput_and_latency(claim, twin, step_times):
    """BAT-TRADEOFF: "The batch made the server better and every user worse ... No setting improves both"."""
    points = batching.curve(step_times(twin))
    base = points[0]
    vs_one = [p.batch for p in points[1:] if p.throughput > base.throughput and p.latency_s < base.latency_s]
    pairs = batching.both_improve(points)
    if pairs:
        claim.note(
            f"Between batch sizes > 1 the larger sometimes improved both: {pairs}. The step time is not monotone in the batch "
            "where the matrix-product kernel changes with the number of rows (on CPU, one row takes a matrix-vector path)."
        )
    claim.verify("twin", settings_improving_both_vs_batch_1=len(vs_one), pairs_improving_both=len(pairs), pairs_compared=len(points) * (len(points) - 1) // 2)


@pytest.mark.claim("BAT-STATIC-CONT")
def test_continuous_batching_beats_static_on_skewed_lengths(claim, twin, stand_in, step_times, device):
    """BAT-STATIC-CONT: "64 requests ... median 18 tokens, longest 231, 1,874 in total ... throughput improves 1.6x. Mean latency improves more than tenfold"."""
    lengths = batching.skewed_lengths()
    twin_cost = {k: s for k, s in step_times(twin).items() if k <= SLOTS}
    sim = batching.compare(lengths, SLOTS, twin_cost)
    alt = batching.alternatives(lengths, SLOTS, twin_cost)

    # Validation: both policies for real on the stand-in, and the simulation fed with its step costs.
    scale = 1 if device.type == "cuda" else CPU_LENGTH_SCALE
    short = batching.scaled(lengths, scale)
    with timing.cpu_threads(_threads(device)):
        v = batching.validate(stand_in.model, short, SLOTS)
    stand_cost = v.step_cost

    s, c = batching.simulate("static", lengths, SLOTS, twin_cost), batching.simulate("continuous", lengths, SLOTS, twin_cost)
    rs, rc = v.results["static"], v.results["continuous"]
    claim.table(
        "Static vs continuous batching (64 requests, 8 slots)",
        ["run", "policy", "steps", "time (s)", "throughput (tokens/s)", "mean latency (s)", "mean latency from admission (s)"],
        [
            ["simulated, twin step costs", r.policy, r.steps, f"{r.makespan_s:.2f}", f"{r.throughput:.2f}", f"{r.mean_latency_s:.2f}", f"{r.mean_service_s:.2f}"]
            for r in (s, c)
        ]
        + [
            [f"real, stand-in, lengths / {scale}", r.policy, r.steps, f"{r.makespan_s:.2f}", f"{r.throughput:.2f}", f"{r.mean_latency_s:.2f}", f"{r.mean_service_s:.2f}"]
            for r in (rs, rc)
        ],
    )
    claim.note(
        "Model: all 64 requests arrive at t = 0 in a seeded order; a request occupies its slot for exactly its output length; "
        "static groups of 8 run until their longest member is done, finished members padding at the cost of a full batch; "
        "continuous refills a freed slot at the next step; a step costs what was measured for its number of occupied slots; "
        "latency = arrival (t = 0) to return."
    )
    claim.note(
        f"Book 1.6x throughput: this workload gives {sim['throughput_ratio']:.2f}x; 200 other seeded workloads with the same median, maximum "
        f"and total give {alt['throughput_ratio_p05']:.2f}-{alt['throughput_ratio_p95']:.2f}x (5th-95th percentile), and queuing the requests "
        f"shortest first gives {alt['throughput_ratio_sorted']:.2f}x. The book's 1.6x needs static groups whose longest members are shorter "
        "than a random arrival order gives: an order partly sorted by length, or a lighter tail below the one 231-token request."
    )
    claim.note(
        f"Book >10x mean latency: with latency counted from arrival for both policies it is {sim['latency_ratio']:.2f}x; "
        f"it is {alt['mixed_latency_ratio']:.1f}x if static latency counts from arrival but continuous latency from admission "
        "(its wait in the queue left out): that is the assumption the book's >10x needs."
    )
    claim.verify(
        "twin",
        **batching.length_stats(lengths),
        throughput_ratio=sim["throughput_ratio"],
        latency_ratio=sim["latency_ratio"],
        service_latency_ratio=sim["service_latency_ratio"],
        static_padding_fraction=sim["static_padding_fraction"],
        **alt,
        twin_step_ms={k: round(t * 1e3, 2) for k, t in twin_cost.items()},
        stand_in_step_ms={k: round(t * 1e3, 2) for k, t in stand_cost.items()},
        length_scale=scale,
        simulated_throughput_ratio_stand_in=v.simulated["throughput_ratio"],
        real_throughput_ratio=v.real["throughput_ratio"],
        real_latency_ratio=v.real["latency_ratio"],
        real_static_s=v.real["static_s"],
        real_continuous_s=v.real["continuous_s"],
        prediction_error=v.throughput_error,
    )


# The paged runs: 16-token blocks; each request of the 64-request workload has an 8-token prompt,
# and on a CPU its output length is divided by CPU_LENGTH_SCALE (as in the real run of
# BAT-STATIC-CONT), as is the max-context reservation's 512 new tokens. Requests run alone too, to
# compare their tokens: one every 16 in queue order (the first joins at once, the others as
# earlier ones leave).
PAGE_BLOCK = 16
PAGE_PROMPT = 8
PAGE_MAX_NEW = 512
PAGE_COMPARE = (0, 16, 32, 48)
PAGE_SHARED_PROMPT = (
    "You are a helpful assistant for a public library. Answer every question briefly and precisely, in plain English, "
    "cite no sources, keep to the facts you are sure of, and say so when you do not know the answer to a question."
)


@pytest.mark.claim("PAGE-WASTE")
def test_paging_wastes_less_than_a_block_where_max_context_wastes_most(claim, stand_in, device):
    """PAGE-WASTE: "reserving its maximum possible context for every slot wastes most of the reservation" — fixed-size blocks with a block table do not."""
    scale = 1 if device.type == "cuda" else CPU_LENGTH_SCALE
    lengths, max_new = batching.scaled(batching.skewed_lengths(), scale), PAGE_MAX_NEW // scale
    with timing.cpu_threads(_threads(device)):
        r = batching.paged_waste(stand_in.model, lengths, SLOTS, PAGE_PROMPT, max_new, PAGE_BLOCK, compare=PAGE_COMPARE)
    w = r["waste"]
    kv_bytes = 2 * stand_in.config.num_hidden_layers * stand_in.config.num_key_value_heads * stand_in.config.head_dim * 4  # fp32, all layers
    claim.table(
        f"Reserved vs used cache over a real continuous-batching run on the paged cache (64 requests, {SLOTS} slots, {PAGE_PROMPT}-token prompts, "
        f"lengths / {scale}, {r['steps']} steps; token slots x steps)",
        ["scheme", "reserved", "used", "unused", "mean reserved per step (MiB, fp32 cache)"],
        [
            [f"max context ({PAGE_PROMPT} + {max_new}) per live request", w.reserved_max_context, w.used_tokens, f"{w.unused_fraction_max_context:.1%}", f"{w.reserved_max_context / r['steps'] * kv_bytes / 2**20:.2f}"],
            ["the run's longest request, known in hindsight", w.reserved_longest, w.used_tokens, f"{w.unused_fraction_longest:.1%}", f"{w.reserved_longest / r['steps'] * kv_bytes / 2**20:.2f}"],
            [f"paged, {PAGE_BLOCK}-token blocks (the run's block tables)", w.reserved_paged, w.used_tokens, f"{w.unused_fraction_paged:.1%}", f"{w.reserved_paged / r['steps'] * kv_bytes / 2**20:.2f}"],
        ],
    )
    claim.note(
        f"The pool held {r['num_blocks']} blocks, the memory max-context reservation holds for {SLOTS} slots; the run handed out "
        f"{r['blocks_handed_out']} blocks, {r['blocks_reused']} of them freed by a finished request and reused, at most {r['peak_blocks_in_use']} in use at once. "
        f"Requests {', '.join(map(str, r['compared']))} gave the same tokens as when run alone."
        if r["tokens_equal_alone"]
        else "Some compared requests gave other tokens than when run alone."
    )
    claim.verify(
        "stand-in",
        unused_fraction_max_context=w.unused_fraction_max_context,
        unused_fraction_longest=w.unused_fraction_longest,
        unused_fraction_paged=w.unused_fraction_paged,
        max_unused_slots_per_sequence_paged=w.max_unused_per_sequence_paged,
        used_tokens=w.used_tokens,
        reserved_paged=w.reserved_paged,
        length_scale=scale,
        blocks_reused=r["blocks_reused"],
        blocks_in_use_after=r["blocks_in_use_after"],
        tables_consistent=r["tables_consistent"],
        tokens_equal_alone=r["tokens_equal_alone"],
    )


@pytest.mark.claim("PAGE-PREFIX")
def test_shared_prefix_shares_its_full_blocks(claim, stand_in, device):
    """PAGE-PREFIX: "two sequences with a shared prefix can also share the blocks that hold that prefix"."""
    tok = stand_in.tokenizer
    prefix = tok(PAGE_SHARED_PROMPT)["input_ids"][:40]  # two full 16-token blocks and 8 tokens of a third
    assert len(prefix) == 40, f"the shared prompt has only {len(prefix)} tokens under this tokenizer"
    questions = [tok(q)["input_ids"] for q in (" What is the capital of France?", " Name three prime numbers larger than ten, please.")]
    with timing.cpu_threads(_threads(device)):
        r = batching.paged_prefix(stand_in.model, prefix, questions, new_tokens=8, block_size=PAGE_BLOCK)
    claim.table(
        f"Blocks after the first step of two requests behind a {len(prefix)}-token shared prompt ({PAGE_BLOCK}-token blocks, real run on the stand-in)",
        ["scheme", "blocks in use"],
        [["each request its own blocks", r["blocks_without"]], ["full prefix blocks shared (reference-counted)", r["blocks_with"]], ["blocks forked from the other request", r["shared_full_blocks"]]],
    )
    claim.verify(
        "stand-in",
        identity_gap=r["blocks_with"] - (r["blocks_without"] - r["shared_full_blocks"]),
        blocks_saved=r["blocks_without"] - r["blocks_with"],
        blocks_with=r["blocks_with"],
        blocks_without=r["blocks_without"],
        shared_blocks=r["shared_blocks"],
        shared_prefix_tokens=r["shared_prefix_tokens"],
        tables_consistent=r["tables_consistent"],
        tokens_equal_alone=r["tokens_equal_alone"],
        tokens_equal_unshared=r["tokens_equal_unshared"],
    )


@given(seed=st.integers(0, 2**32 - 1), sigma=st.floats(0.3, 1.5))
def test_skewed_lengths_have_exactly_the_books_statistics(seed, sigma):
    """The workload generator: median 18, one longest request of 231, total 1,874, for any seed and skew."""
    lengths = batching.skewed_lengths(seed=seed, sigma=sigma)
    assert batching.length_stats(lengths) == {"median_len": 18, "max_len": 231, "total_len": 1_874, "requests": 64}
    assert lengths.count(231) == 1 and min(lengths) >= 1


@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=80), slots=st.integers(1, 8))
def test_simulated_continuous_batching_returns_every_request_no_later_than_static(lengths, slots):
    """Counted in steps (unit step cost), continuous batching admits each request no later than static does, so returns it no later."""
    cost = dict.fromkeys(range(1, slots + 1), 1.0)
    s, c = batching.simulate("static", lengths, slots, cost), batching.simulate("continuous", lengths, slots, cost)
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
