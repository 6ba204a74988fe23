"""Section 1 of the chapter: the KV cache.

Measurements live in ``cheapinfer.chapter.kv_cache.kv``; these tests pick sizes, hand the numbers to the registry
and regenerate the chapter's lost tables in its shape. Timing sizes are chosen so the whole module
runs in a few minutes on a 2-core CPU with the fp32 twin.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cheapinfer.chapter.kv_cache import kv, kv_evidence, kv_listing, kv_macs, kv_memory
from cheapinfer.harness import registry
from cheapinfer.runtime import accel, models, plots, roofline, rounding, timing
from cheapinfer.runtime.arch import QWEN25_05B, qwen2_config
from cheapinfer.runtime.evidence import describe_timed, timed_forwards
from cheapinfer.testing import on_profiles

MIB = 2**20



# ------------------------------------------------------------------------------------------------
# correctness and the API
# ------------------------------------------------------------------------------------------------


@on_profiles("twin", "stand-in", "book")
@pytest.mark.claim("KV-IDENTITY")
def test_cached_greedy_generation_equals_full_recomputation(claim, profile):
    """KV-IDENTITY: "greedy generation with the KV cache ... yields exactly the tokens of full recomputation" ("Dit is geen benadering")."""
    cases = kv_evidence.prompts(profile)
    rows, all_agree = [], True
    judge = rounding.GreedyJudge(profile.model)
    for name, ids, new in cases:
        cached = kv.greedy_cached(profile.model, ids, new)
        full = kv.greedy_uncached(profile.model, ids, new)
        same = judge(ids[0], full[0], cached[0])
        rows.append([name, ids.shape[1], new, same.equal, same.describe()])
        all_agree &= same.agree
    claim.table("Cached vs recomputed greedy tokens (a difference only at a near-tie of the two paths' rounding)",
                ["prompt", "P", "new tokens", "identical", "comparison"], rows)
    name, ids, _ = cases[0]
    evidence = kv_evidence.generation_evidence(profile.model, ids, 4)
    claim.note(f"cache use traced on {name} over {evidence['decode_steps_traced']} decode steps: {kv_evidence.describe(evidence)}")
    claim.verify(profile.name, identical=all_agree, **kv_evidence.cache_use(evidence))


@on_profiles("stand-in", "twin")
@pytest.mark.claim("KV-API")
def test_chapter_listing_runs_on_installed_transformers(claim, profile):
    """KV-API: the listing calls "model(prompt_ids, use_cache=True)", reads "out.past_key_values", feeds it back with "past_key_values=past"."""
    ids = kv_evidence.prompts(profile)[0][1]
    api = kv_listing.listing_api(profile.model, ids, 8)
    for key in ("error", "replacement_error"):
        if key in api:
            claim.note(f"{key.replace('_', ' ')}: {api[key]}")
    for line in api["messages"]:
        claim.note(f"deprecation met: {line}")
    claim.table("The listing's cache API on this transformers", ["spelling in the listing", "name without a deprecation here"],
                [["model(nxt, past_key_values=past, ...)", api["cache_argument"]], ["out.past_key_values", api["cache_attribute"]]])
    claim.verify(profile.name, runs=api["runs"], cache_argument=api["cache_argument"], cache_attribute=api["cache_attribute"],
                 replacement_runs=api["replacement_runs"])


# ------------------------------------------------------------------------------------------------
# arithmetic, checked against real tensors
# ------------------------------------------------------------------------------------------------


@pytest.mark.claim("KV-BYTES-FORMULA")
def test_kv_cache_is_12288_bytes_per_token(claim):
    """KV-BYTES-FORMULA: "bytes/token = 2 x layers x kv_heads x head_dim x bytes = 2x24x2x64x2"."""
    claim.verify("arithmetic", bytes_per_token=kv.arch_kv_bytes_per_token(QWEN25_05B, 2))


@pytest.mark.claim("KV-BYTES-MEASURED")
def test_cache_tensors_hold_12288_bytes_per_token_over_every_shape(claim, twin_factory, device):
    """KV-BYTES-MEASURED: "(1, 2, 295, 64) float16; 3,624,960 bytes for 295 tokens = 12,288 B/token", exact over every tested shape."""
    dtype = models.claim_dtype("printed", device)
    if device.type == "cuda":
        model, where = twin_factory(dtype).model, f"the {dtype} twin on {device}"
    else:  # fp16 matmuls on a CPU take ~30 s for this prompt; shapes and dtypes do not need the arithmetic
        model, where = kv_macs.twin_on_meta(models.DTYPES[dtype]), f"the {dtype} twin's architecture on the meta device (shapes and dtypes only)"
    ids = torch.zeros((1, 295), dtype=torch.long, device=next(model.parameters()).device)
    with torch.inference_mode():
        cache = kv.returned_cache(model(ids, use_cache=True))
    tensors = kv.dynamic_cache_tensors(cache)
    total = kv.dynamic_cache_bytes(cache)
    claim.note(f"295-token cache measured on {where}; {len(tensors)} tensors of {tuple(tensors[0].shape)} {tensors[0].dtype}")

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    rows, mismatches = [], []

    @settings(max_examples=settings().max_examples, deadline=None, database=None)
    @given(
        batch=st.integers(1, 3), length=st.integers(1, 40), dtype=st.sampled_from(sorted(dtypes)),
        layers=st.integers(1, 3), kv_heads=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 2, 7]),
        head_dim=st.sampled_from([8, 16, 32]),
    )
    def formula_matches_cache(batch, length, dtype, layers, kv_heads, group, head_dim):
        arch = kv_macs.tiny_arch(layers, kv_heads * group, kv_heads, head_dim)
        torch.manual_seed(0)
        small = kv_macs.tiny_model(arch, dtypes[dtype])
        with torch.inference_mode():
            c = kv.returned_cache(small(torch.randint(0, arch.vocab, (batch, length)), use_cache=True))
        element = torch.empty((), dtype=dtypes[dtype]).element_size()
        formula = batch * length * kv.kv_bytes_per_token(layers, kv_heads, head_dim, element)
        measured = kv.dynamic_cache_bytes(c)
        row = [batch, length, dtype, layers, kv_heads * group, kv_heads, head_dim, formula, measured]
        rows.append(row)
        if formula != measured:
            mismatches.append(row)

    formula_matches_cache()
    header = ["batch", "length", "dtype", "layers", "heads", "kv_heads", "head_dim", "formula B", "cache tensors B"]
    claim.table(f"Bytes over shapes: formula vs real DynamicCache tensors ({len(rows)} examples, first 12)", header, rows[:12])
    if mismatches:
        claim.table("Shapes where the formula misses", header, mismatches[:12])
    claim.verify(
        "twin",
        key_shape=str(tuple(tensors[0].shape)),
        total_bytes=total,
        bytes_per_token=total // 295 if total % 295 == 0 else total / 295,
        formula_exact_over_shapes=not mismatches and len(rows) > 0,
    )


@pytest.mark.claim("KV-RESIDENT-ONLY")
def test_cache_depends_only_on_resident_tokens(claim):
    """KV-RESIDENT-ONLY: "32x2.048, 64x1.024, 128x512 tokens: de cache is telkens 768 MB, omdat alle drie 65.536 tokens bevatten"."""
    model = kv_macs.twin_on_meta(torch.float16)
    rows, sizes, tokens = [], set(), set()
    for batch, each in ((32, 2048), (64, 1024), (128, 512)):
        formula = kv.cache_bytes(batch, each, QWEN25_05B, 2)
        with torch.inference_mode():
            cache = kv.returned_cache(model(torch.zeros((batch, each), dtype=torch.long, device="meta"), use_cache=True))
        measured = kv.dynamic_cache_bytes(cache)
        key = kv.dynamic_cache_tensors(cache)[0]  # [B, H, S, D]
        resident = key.shape[0] * key.shape[2]
        rows.append([batch, each, resident, formula, measured, f"{measured / MIB:.0f}", f"{measured / 1e6:.0f}"])
        sizes |= {formula, measured}
        tokens.add(resident)
    claim.table("Resident tokens split three ways (fp16; cache measured on the twin's architecture, meta device)",
                ["batch", "tokens each", "resident tokens (tensor shapes)", "formula B", "cache tensors B", "MiB", "decimal MB"], rows)
    measured = rows[0][4]
    claim.verify("arithmetic", cache_mb=measured // MIB if measured % MIB == 0 else measured / MIB, bytes=measured,
                 resident_tokens=tokens.pop() if len(tokens) == 1 else sorted(tokens), same_for_all_splits=len(sizes) == 1)


@pytest.mark.claim("KV-MHA-7X")
def test_full_multi_head_cache_would_be_7x(claim):
    """KV-MHA-7X: "met volledige multi-head attention zou zijn cache 86,016 bytes per token zijn — 84 KB in plaats van 12 KB, exact zeven keer meer"."""
    measured, matches = {}, True
    for kv_heads in (QWEN25_05B.kv_heads, QWEN25_05B.heads):
        model = kv_macs.twin_on_meta(torch.float16, num_key_value_heads=kv_heads)
        with torch.inference_mode():
            cache = kv.returned_cache(model(torch.zeros((1, 1), dtype=torch.long, device="meta"), use_cache=True))
        measured[kv_heads] = kv.dynamic_cache_bytes(cache)
        formula = kv.arch_kv_bytes_per_token(QWEN25_05B, 2, kv_heads=kv_heads)
        matches &= measured[kv_heads] == formula
        claim.note(f"{kv_heads} KV heads: cache tensors hold {measured[kv_heads]:,} B/token, the formula says {formula:,}")
    mha, gqa = measured[QWEN25_05B.heads], measured[QWEN25_05B.kv_heads]
    claim.note(f"query heads / KV heads = {QWEN25_05B.heads}/{QWEN25_05B.kv_heads} = {QWEN25_05B.heads / QWEN25_05B.kv_heads:g}")
    claim.verify("arithmetic", mha_bytes_per_token=mha, mha_kb=_exact(mha, 1024), gqa_kb=_exact(gqa, 1024),
                 ratio=_exact(mha, gqa), formula_matches_tensors=matches)


@pytest.mark.claim("KV-7B-CACHE")
def test_7b_cache_at_128k_tokens_exceeds_the_weights(claim):
    """KV-7B-CACHE: "32 layers, 8 key-value heads, dimension 128: 128 KB per token in fp16; weights 13,0 GB; at 128.000 tokens one user's cache is larger than the model"."""
    config = qwen2_config(QWEN25_05B, num_hidden_layers=32, num_key_value_heads=8, num_attention_heads=32, hidden_size=4096,
                          head_dim=128, intermediate_size=11_008)
    model = kv_macs.meta_model(config).to(torch.float16)
    with torch.inference_mode():
        cache = kv.returned_cache(model(torch.zeros((1, 1), dtype=torch.long, device="meta"), use_cache=True))
    per_token, formula = kv.dynamic_cache_bytes(cache), kv.kv_bytes_per_token(32, 8, 128, 2)
    claim.note(f"formula: 2 x 32 x 8 x 128 x 2 = {formula:,} B/token; cache tensors of the 7B-class architecture (meta device, fp16): {per_token:,} B/token")
    weights = kv.weight_bytes(7_000_000_000, 2)
    cache_128k = 128_000 * formula
    claim.table("7B class at a context of 128,000 tokens, fp16", ["quantity", "B", "GiB", "decimal GB"],
                [["weights (7e9 x 2 B)", f"{weights:,}", f"{weights / kv.GIB:.2f}", f"{weights / 1e9:.2f}"],
                 ["one user's cache", f"{cache_128k:,}", f"{cache_128k / kv.GIB:.2f}", f"{cache_128k / 1e9:.2f}"]])
    claim.verify("arithmetic", bytes_per_token=per_token, weights_gb=weights / 1e9, weights_gib=weights / kv.GIB, kb_per_token=per_token / 1e3,
                 kib_per_token=per_token / 1024, cache_gib_128k=cache_128k / kv.GIB,
                 cache_exceeds_weights=cache_128k > weights, formula_matches_tensors=formula == per_token)


def _exact(a: int, b: int):
    """a / b, as an int when it divides exactly."""
    return a // b if a % b == 0 else a / b


@pytest.mark.claim("KV-SCORES-BYTES")
def test_recompute_builds_67mb_of_scores_cache_16kb(claim, device):
    """KV-SCORES-BYTES: "bij 4.096 tokens, 67 MB aan scores tegenover 16 KB": recompute builds n x n fp32 scores, the cache a 1 x n row."""
    n = 4096
    head = kv.Head(n, device=device)
    with torch.inference_mode():
        (out_re, s_re), (out_c, s_c) = head.recompute(), head.cached()
    re_bytes, c_bytes = s_re.numel() * s_re.element_size(), s_c.numel() * s_c.element_size()
    claim.note(f"score tensors built: {tuple(s_re.shape)} {s_re.dtype} ({re_bytes:,} B = {re_bytes / MIB:g} MiB) and {tuple(s_c.shape)} {s_c.dtype} ({c_bytes:,} B)")
    diff = (out_re - out_c).abs().double()  # [1, d]
    bound = 2 * kv.head_row_bound(head)
    claim.note(f"cached step's output against the recompute step's last row: max |difference| {diff.max().item():.3g}, "
               f"{(diff / bound).max().item():.3g} of its a-priori bound (largest bound {bound.max().item():.3g})")
    claim.verify("arithmetic", recompute_mb=re_bytes / 1e6, cached_kb=c_bytes / 1e3, recompute_bytes=re_bytes,
                 cached_score_rows=s_c.shape[0], cached_minus_recompute_row=diff.max().item(),
                 cached_minus_recompute_over_bound=(diff / bound).max().item())


@pytest.mark.claim("KV-MACS")
def test_generation_macs_cubic_uncached_quadratic_cached(claim):
    """KV-MACS: "per stap lineair ... kwadratisch; opgeteld $O(T^2)$ tegenover $O(T^3)$, waarbij de verhouding onbeperkt groeit"."""
    tiny = kv_macs.tiny_arch()
    counted = kv_macs.counted_degrees(kv_macs.twin_on_meta(torch.float32), QWEN25_05B, kv_macs.tiny_model(tiny), tiny)
    claim.table(f"MACs counted op by op vs the closed form: one step at t tokens (Qwen2.5-0.5B architecture, meta device); whole "
                f"generations of T tokens (small Qwen2: {tiny.layers} layers, {tiny.heads} heads, {tiny.kv_heads} KV heads)",
                ["path", "unit", "t or T", "counted", "closed form"], [[*r[:3], f"{r[3]:,}", f"{r[4]:,}"] for r in counted["rows"]])
    rows = []
    for T in (16, 64, 256, 1024, 4096):
        c, u = kv_macs.macs_generate(QWEN25_05B, T, True), kv_macs.macs_generate(QWEN25_05B, T, False)
        rows.append([T, f"{c:.4g}", f"{u:.4g}", f"{u / c:,.1f}"])
    claim.note(f"W = {kv_macs.weight_macs_per_token():,} weight MACs per token; A = {kv_macs.attention_macs_per_pair():,} attention MACs per query-key pair")
    claim.table("MACs to generate T tokens from a cold start (Qwen2.5-0.5B, closed form)", ["T", "cached", "uncached", "uncached / cached"], rows)
    claim.verify("arithmetic", **{k: counted[k] for k in ("cached_total_degree", "uncached_total_degree", "cached_step_degree",
                                                          "uncached_step_degree", "closed_form_matches_count")})


# ------------------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------------------


@pytest.mark.claim("KV-MEMORY-8.3X")
def test_uncached_generation_needs_8x_the_memory(claim, twin_factory, device):
    """KV-MEMORY-8.3X: "Op een laptop-GPU van 8 GB die 256 tokens in fp16 genereert ... 8,3 keer meer memory" (allocator peak minus resident weights)."""
    total, prompt = 256, 16
    dtype = models.claim_dtype("gpu-half", device)
    model = twin_factory(dtype).model
    # what each peak holds, on every device: the tensors live at each generation's largest step (kv_memory.PeakParts)
    peaks = kv_memory.generation_peaks(model, total, prompt)
    if device.type == "cuda":
        ids = kv_evidence.random_ids(prompt, device)
        uncached = kv.peak_above_resident(lambda: kv.greedy_uncached(model, ids, total - prompt), device)
        cached = kv.peak_above_resident(lambda: kv.greedy_cached(model, ids, total - prompt), device)
        evidence = kv_evidence.generation_evidence(model, ids, 3)
        how = f"{dtype} twin on {device}: whole generations ({prompt}-token prompt to {total} tokens), torch.cuda.max_memory_allocated minus memory_allocated before"
    else:
        # fp16 matmuls on a CPU are ~15x slower than fp32; bytes scale alike, so the ratio is taken in fp32 (the rule "gpu-half").
        uncached, cached = peaks["uncached_bytes"], peaks["cached_bytes"]
        with torch.inference_mode():
            cache = kv.random_cache(model.config, total - 1, next(model.parameters()).dtype, device)
            evidence = kv_evidence.decode_step_evidence(model, cache, total - 1)
        how = (f"{dtype} twin on {device}: live tensor bytes (LivePeak) at each generation's largest step: uncached = the step that yields "
               f"token {total}; cached = max(prefill of {prompt}, one step against a {total - 1}-token cache counted as live)")
    claim.table("Peak memory above resident weights, 256 tokens", ["generation", "peak MiB"],
                [["uncached", f"{uncached / MIB:.2f}"], ["cached", f"{cached / MIB:.2f}"], ["uncached / cached", f"{uncached / cached:.2f}"]])
    claim.table(*kv_memory.parts_table(peaks))
    parts, said = kv_memory.reported(peaks, registry.get("KV-MEMORY-8.3X").book["ratio"])
    for line in (how, f"cached side: {kv_evidence.describe(evidence)}", said):
        claim.note(line)
    claim.verify("twin", ratio=uncached / cached, uncached_bytes=uncached, cached_bytes=cached, cache_grows_by_one=evidence["cache_grows_by_one"], **parts)


# ------------------------------------------------------------------------------------------------
# timing (ratios asserted, absolute times reported)
# ------------------------------------------------------------------------------------------------


@on_profiles("twin", "book")
@pytest.mark.claim("KV-SPEEDUP-48")
def test_cached_generation_of_48_tokens_is_faster(claim, profile, timed):
    """KV-SPEEDUP-48: "uncached vs cached generation of 48 tokens: 9x faster cached"."""
    # 4 tokens on a CPU keep the uncached run (48 forwards over 4..51 tokens) near half a minute on 2 cores, and arithmetic per token
    # counts there. A GPU runs short forwards at its launch floor, where recomputation costs what a cached step does: there the prompt is sized from it.
    new, marks, rounds = 48, (1, 6, 12, 24, 48), 3
    prompt = kv.sized_prompt(profile.model, profile.device, cpu=4, start=256, reserve=new)  # its why is noted below
    ids = kv_evidence.random_ids(prompt.length, profile.device)
    warm = ((kv.greedy_cached, 2),) if profile.device.type == "cpu" else ((kv.greedy_cached, new), (kv.greedy_uncached, new))  # CUDA: every shape
    [generate(profile.model, ids, tokens) for generate, tokens in warm]  # warm-up, once, outside the clock
    # Each round times one whole generation of each kind; the time to token k of it is the series "<kind>@k".
    variants = {name: kv.marked_generation(generate, profile.model, ids, new, marks, profile.device)
                for name, generate in (("uncached", kv.greedy_uncached), ("cached", kv.greedy_cached))}
    # a generation waits on the device at every token: its premise (runtime.premise) is probed on one cached decode step
    premise = {"cached decode step": kv.step_after_prefill(profile.model, ids)} if profile.device.type == "cuda" else None
    samples = timed(variants, rounds=rounds, warmup=0, quantities=kv.speedup_quantities, forwards_of=profile.model, premise=premise)
    at = {k: {name: samples[timing.mark_name(name, k)].median for name in variants} for k in marks}
    claim.table(f"Generating T tokens from a {ids.shape[1]}-token prompt ({profile.name}, median of "
                f"{len(samples['cached'].seconds)} interleaved rounds)", ["T", "uncached s", "cached s", "speedup"],
                [[k, f"{at[k]['uncached']:.3f}", f"{at[k]['cached']:.3f}", f"{at[k]['uncached'] / at[k]['cached']:.2f}"] for k in marks])
    evidence = kv_evidence.generation_evidence(profile.model, ids, 4)
    claim.note(f"prompt: {prompt.why}; the cached generation, traced over 4 tokens: {kv_evidence.describe(evidence)}")
    claim.note(describe_timed(samples, f"generation of {new} tokens"))
    claim.verify(profile.name, **timing.measured(timing.estimates(samples, kv.speedup_quantities)), rounds=len(samples["cached"].seconds),
                 **timed_forwards(samples), **kv_evidence.cache_use(evidence), **prompt.measured("prompt_tokens"))


@pytest.mark.claim("KV-HEAD-TIMING")
def test_head_recompute_over_cached_grows_with_n(claim, timed, device):
    """KV-HEAD-TIMING: "same head: time of one step recompute vs cached across n" (the book's table was lost)."""
    ns, reps = (256, 512, 1024, 2048, 4096), 10
    heads = {n: kv.Head(n, device=device) for n in ns}

    def repeat(fn, k):
        def go():
            for _ in range(k):
                fn()

        return go

    variants = {}
    for n in ns:
        variants[f"recompute n={n}"] = heads[n].recompute
        variants[f"cached n={n}"] = repeat(heads[n].cached, reps)  # microseconds: repeat to rise above clock noise
    def ratio(t, n):  # one step recomputed over one cached step at n
        return t[f"recompute n={n}"] / (t[f"cached n={n}"] / reps)

    def quantities(t):  # one set of times -> the claim's clocked quantities
        return {"ratio_growth": ratio(t, ns[-1]) / ratio(t, ns[0]), "ratio_at_4096": ratio(t, 4096)}

    samples = timed(variants, rounds=5, warmup=1, quantities=quantities)
    medians = {name: s.median for name, s in samples.items()}
    rows = []
    for n in ns:
        re_s, c_s = medians[f"recompute n={n}"], medians[f"cached n={n}"] / reps
        rows.append([n, f"{re_s * 1e3:.3f}", f"{c_s * 1e3:.4f}", f"{ratio(medians, n):,.0f}", kv.scores_bytes(n, n), kv.scores_bytes(1, n)])
    claim.table(f"One head (d = 64, width {QWEN25_05B.hidden}), one step at n, fp32 on {device}, median of "
                f"{len(samples[f'cached n={ns[0]}'].seconds)} interleaved rounds",
                ["n", "recompute ms", "cached ms", "ratio", "recompute score B", "cached score B"], rows)
    claim.figure("kv-head-timing", plots.loglog(ns, {"recompute": [float(r[1]) for r in rows], "cached": [float(r[2]) for r in rows]},
                                           "n (tokens)", "ms per step", "One head: recompute vs cached step"))
    with torch.inference_mode():
        rows_built = heads[ns[-1]].cached()[1].shape[0]
    claim.verify("twin", **timing.measured(timing.estimates(samples, quantities)), rounds=len(samples[f"cached n={ns[0]}"].seconds),
                 cached_score_rows=rows_built)


@on_profiles("twin", "book")
@pytest.mark.claim("KV-PREFILL-DECODE")
def test_decode_costs_more_per_token_than_prefill(claim, profile, timed):
    """KV-PREFILL-DECODE: "prefill 40 prompt tokens 25.6 ms/token; decode 166.5 ms/step; decode the expensive side"."""
    P = 40
    ids = kv_evidence.random_ids(P, profile.device)
    with torch.inference_mode():
        cache = kv.returned_cache(profile.model(ids, use_cache=True))

    def quantities(t):  # one set of times -> the claim's clocked quantities (the absolute times are reported, never asserted)
        per_token = t["prefill"] / P
        return {"prefill_ms_per_token": per_token * 1e3, "decode_ms_per_step": t["decode"] * 1e3, "decode_over_prefill": t["decode"] / per_token}

    samples = timed({"prefill": kv.prefill(profile.model, ids), "decode": kv.decode_step(profile.model, cache, P)}, rounds=5, warmup=1,
                    quantities=quantities, forwards_of=profile.model)
    evidence = kv_evidence.decode_step_evidence(profile.model, cache, P)  # after the timed steps: their cache is back at P
    claim.note(f"the timed decode step, traced once after its timed rounds: {kv_evidence.describe(evidence)}")
    prefill_per_token = samples["prefill"].median / P
    decode = samples["decode"].median
    claim.table(f"Prefill vs decode ({profile.name}, {P}-token prompt, median of {len(samples['decode'].seconds)} interleaved rounds)",
                ["phase", "ms", "ms per token"],
                [["prefill 40 tokens", f"{samples['prefill'].median * 1e3:.1f}", f"{prefill_per_token * 1e3:.2f}"],
                 ["one decode step", f"{decode * 1e3:.1f}", f"{decode * 1e3:.1f}"]])
    claim.note(describe_timed(samples, "prefill and decode step"))
    claim.verify(profile.name, **timing.measured(timing.estimates(samples, quantities)), rounds=len(samples["decode"].seconds),
                 **timed_forwards(samples), **kv_evidence.cache_use(evidence))


@pytest.mark.claim("KV-DECODE-FLAT")
def test_decode_step_is_flat_in_context(claim, twin, timed):
    """KV-DECODE-FLAT: "one decode step at context 16 vs 1,024 (64x history) costs nothing measurable more"."""
    contexts = (16, 128, 512, 1024)
    caches = {C: kv.random_cache(twin.config, C, twin.dtype, twin.device) for C in contexts}
    steps = {C: kv.decode_step(twin.model, caches[C], C) for C in contexts}
    ratio = lambda t: kv.flat_ratio(t, contexts)  # noqa: E731  one set of times -> the claim's quantity
    samples = timed({f"C={C}": steps[C] for C in contexts}, rounds=7, warmup=1, quantities=ratio, forwards_of=twin.model)
    traced = [kv_evidence.decode_step_evidence(twin.model, caches[C], C) for C in (contexts[0], contexts[-1])]  # after the timed steps
    evidence = {"cache_grows_by_one": all(e["cache_grows_by_one"] for e in traced),
                "logit_change_vs_no_context": min(e["logit_change_vs_no_context"] for e in traced)}
    claim.note(f"the timed steps at C = {contexts[0]} and {contexts[-1]}, traced once after their timed rounds: {kv_evidence.describe(evidence)}")
    ms = [samples[f"C={C}"].median * 1e3 for C in contexts]
    claim.table(f"One decode step vs context C (twin {twin.dtype}, {twin.device}, median of 7 rounds)",
                ["C", "ms per step", "vs C=16"], [[C, f"{m:.1f}", f"{m / ms[0]:.3f}"] for C, m in zip(contexts, ms)])
    claim.figure("kv-decode-vs-context", plots.lines(contexts, {"decode step": ms}, "context C (tokens)", "ms per step",
                                               "Decode step vs context (twin)", logx=True, zero=True))
    claim.note(describe_timed(samples, "decode step"))
    claim.verify("twin", **timing.measured(timing.estimates(samples, ratio)), rounds=len(samples[f"C={contexts[0]}"].seconds),
                 **timed_forwards(samples), **kv_evidence.cache_use(evidence))


@pytest.mark.claim("KV-DECODE-MEMBOUND")
def test_decode_step_streams_weights_near_copy_bandwidth(claim, twin, timed):
    """KV-DECODE-MEMBOUND: a decode step is dominated by "dragging half a billion weights through the memory bus"."""
    C = 16
    kv_cache = kv.random_cache(twin.config, C, twin.dtype, twin.device)
    step = kv.decode_step(twin.model, kv_cache, C)
    probe = accel.stream_bytes(twin.device)
    (copy, copy_bytes), (read, read_bytes) = accel.stream_probes(probe, twin.device)  # two buffers: the read sums the copy's destination
    cache, cache_reported = accel.last_level_cache(twin.device)
    weights, step_bytes = roofline.streamed_bytes(twin.model), kv.decode_bytes(twin.model, 1, C)

    def quantities(t):  # one set of times -> the claim's clocked quantities: bytes per second over the copy's and the read's, side by side
        achieved, bandwidth, reading = weights / t["decode"], copy_bytes / t["copy"], read_bytes / t["read"]
        return {"bandwidth_fraction": achieved / bandwidth, "over_read": achieved / reading, "achieved_gb_s": achieved / 1e9,
                "copy_gb_s": bandwidth / 1e9, "read_gb_s": reading / 1e9, "decode_efficiency": roofline.decode_efficiency(step_bytes, t["decode"], bandwidth)}

    samples = timed({"decode": step, "copy": copy, "read": read}, rounds=7, warmup=1, quantities=quantities, forwards_of=twin.model,
                    uncounted=("copy", "read"))
    evidence = kv_evidence.decode_step_evidence(twin.model, kv_cache, C)  # after the timed steps: their cache is back at C
    claim.note(f"the timed step, traced once after its timed rounds: {kv_evidence.describe(evidence)}")
    found = timing.estimates(samples, quantities)
    claim.table(f"Decode step as memory traffic (twin {twin.dtype}, {twin.device}, median of {len(samples['decode'].seconds)} interleaved rounds)",
                ["quantity", "value"], [
        ["weight bytes", f"{weights:,}"],
        ["decode step ms", f"{samples['decode'].median * 1e3:.1f}"],
        ["achieved GB/s (weights / step)", f"{found['achieved_gb_s'].value:.1f}"],
        [f"copy GB/s ({read_bytes / 2**20:,.0f} MiB, read + write)", f"{found['copy_gb_s'].value:.1f}"],
        [f"read GB/s ({read_bytes / 2**20:,.0f} MiB summed)", f"{found['read_gb_s'].value:.1f}"],
        ["fraction of the copy", f"{found['bandwidth_fraction'].value:.2f} ± {found['bandwidth_fraction'].se:.2f}"],
        ["fraction of the read (at most 1)", f"{found['over_read'].value:.2f} ± {found['over_read'].se:.2f}"],
        [f"decode efficiency ((weights + {C}-token cache) / step / copy bandwidth)", f"{found['decode_efficiency'].value:.2f}"],
    ])
    claim.note(describe_timed(samples, "decode step"))
    claim.note(f"the probes stream {read_bytes / 2**20:,.0f} MiB against a last-level cache of {cache / 2**20:,.1f} MiB "
               + ("(as the system reports it)" if cache_reported else "(not reported by the system: assumed)"))
    claim.verify("twin", **timing.measured(found), rounds=len(samples["decode"].seconds), **timed_forwards(samples), **kv_evidence.cache_use(evidence),
                 probe_over_cache=min(read_bytes, copy_bytes // 2) / cache, last_level_cache_bytes=cache, last_level_cache_reported=cache_reported)


@pytest.mark.claim("KV-PREFILL-GROWS")
def test_prefill_time_grows_with_prompt_length(claim, twin, timed):
    """KV-PREFILL-GROWS: "prefill time grows with prompt length P (time-to-first-token)"."""
    # A GPU runs short prompts at its kernel-launch floor: there the shortest length is sized from the measured floor
    # (kv.sized_prompt: its prefill takes premise.FLOOR_FACTOR floors of device time), and each next length doubles it.
    shortest = kv.sized_prompt(twin.model, twin.device, cpu=8, start=128, span=8)
    lengths = (8, 32, 128, 256) if twin.device.type == "cpu" else tuple(shortest.length * k for k in (1, 2, 4, 8))
    claim.note(f"shortest prompt: {shortest.why}")
    ids = kv_evidence.random_ids(max(lengths), twin.device)
    [kv.prefill(twin.model, ids[:, :P])() for P in (lengths if twin.device.type == "cuda" else lengths[:1])]  # warm-up (CUDA: every shape)
    quantities = lambda t: kv.prefill_growth([t[f"P={P}"] for P in lengths])  # noqa: E731  one set of times -> growth, worst_drop
    samples = timed({f"P={P}": kv.prefill(twin.model, ids[:, :P]) for P in lengths}, rounds=3, warmup=0, quantities=quantities,
                    forwards_of=twin.model)
    ms = [samples[f"P={P}"].median * 1e3 for P in lengths]
    claim.table(f"Prefill (time to first token) vs prompt length P (twin {twin.dtype}, {twin.device}, median of "
                f"{len(samples[f'P={lengths[0]}'].seconds)} interleaved rounds)",
                ["P", "ms", "ms per token"], [[P, f"{m:.1f}", f"{m / P:.2f}"] for P, m in zip(lengths, ms)])
    claim.figure("kv-prefill-vs-prompt", plots.lines(lengths, {"prefill": ms}, "prompt length P (tokens)", "ms", "Prefill vs prompt length (twin)", zero=True))
    claim.note(describe_timed(samples, "prefill"))
    claim.verify("twin", **timing.measured(timing.estimates(samples, quantities)), rounds=len(samples[f"P={lengths[0]}"].seconds),
                 **timed_forwards(samples), **shortest.measured("shortest_prompt_tokens"))
