"""Section 3 of the chapter: weight quantization."""

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from cheapinfer import SEED
from cheapinfer.chapter.quantization import formats, lowbit, quant, quant_error
from cheapinfer.harness import registry
from cheapinfer.runtime import accel, evidence, provenance, roofline, timing
from cheapinfer.runtime.arch import QWEN25_05B
from cheapinfer.runtime.models import claim_dtype, llm_int8_unavailable
from cheapinfer.testing import nonzero_weights, on_profiles

BOOK_DOWN_PROJ = "model.layers.12.mlp.down_proj.weight"
STAND_IN_NOTE = (
    "The stand-in's weights are themselves dequantized Q4_1 (at most 16 values per block of 32, on an "
    "asymmetric grid: a scale and a minimum per block). The symmetric grids here do not line up with "
    "those values: INT4 with groups of 32, Q4_1's own block, still loses {g32:.4f} of the norm on "
    "average, so the stand-in's errors are those of 4-bit-like weights, not near zero."
)


@pytest.mark.claim("Q-SIZES")
def test_half_a_billion_parameters_are_198_099_049_gb(claim):
    """Q-SIZES: "4 bytes 1.98 GB, 2 bytes 0.99 GB, 1 byte 0.49 GB" (the book config's parameters)."""
    n = QWEN25_05B.parameter_count()
    claim.verify(
        "arithmetic",
        parameters=n,
        parameters_billion=n / 1e9,
        gb_fp32=round(quant_error.decimal_gb(n, 4), 2),
        gb_16bit=round(quant_error.decimal_gb(n, 2), 2),
        gb_8bit=round(quant_error.decimal_gb(n, 1), 2),
    )


#: Low-bit variants timed against the 16-bit twin, by device: the 8-bit and 4-bit kernels whose
#: verdict is asserted, then the libraries' own paths, reported. On a CPU bitsandbytes' layers are
#: left out: quantizing the twin with them took over a minute on 2 cores.
LOW_BIT = {"cpu": ("int8", "int4", "torchao-int8"), "cuda": ("int8", "bnb-nf4", "bnb-int8")}
FOUR_BIT = {"cpu": "int4", "cuda": "bnb-nf4"}


@pytest.mark.claim("Q-BYTES-SPEED")
def test_fewer_bytes_per_weight_make_a_decode_step_faster(claim, twin_factory, device, timed):
    """Q-BYTES-SPEED: "fewer bits per weight ... because decode is bandwidth-bound ... make each step faster, because there are fewer bytes to move"."""
    kind = "cuda" if device.type == "cuda" else "cpu"
    half = claim_dtype("two-byte", device)
    fp32, ref = twin_factory(claim_dtype("four-byte", device)), twin_factory(half)
    int8_gate = llm_int8_unavailable(device)  # LLM.int8() needs sm75: on an older card its row is not run, with the reason
    low = {name: lowbit.variant(ref.model, name, random_codes=True) for name in LOW_BIT[kind] if not (name == "bnb-int8" and int8_gate)}
    if int8_gate:
        claim.note(int8_gate)
    models = {"fp32": fp32.model, half: ref.model, **low}
    weight_bytes = {n: roofline.streamed_bytes(m) for n, m in models.items()}
    resident = {n: lowbit.resident_bytes(m) for n, m in models.items()}
    probe = accel.stream_bytes(device)  # the copy's and the read's bytes each: at least 4x the last-level cache
    cache, cache_reported = accel.last_level_cache(device)

    def speedups(t) -> dict[str, float]:  # one set of times -> the claim's clocked ratios, every path against the read, each kernel from a cache
        return {"speedup_16bit": t["fp32"] / t[half], "speedup_8bit": t[half] / t["int8"], "speedup_4bit": t[half] / t[FOUR_BIT[kind]],
                "over_read": lowbit.over_read(weight_bytes, t, probe), **{f"headroom_{n}": lowbit.headroom(resident[n], t, n, probe) for n in models}}

    steps, samples = lowbit.decode_steps(models, timed, probe, quantities=speedups)
    found = timing.estimates(samples, speedups)
    headrooms = {n: found[f"headroom_{n}"].value for n in models}
    premise_8bit, why_8bit = lowbit.bytes_bound(headrooms, (half, "int8"))
    premise_4bit, why_4bit = lowbit.bytes_bound(headrooms, (half, FOUR_BIT[kind]))
    base = steps[half]
    kernels = {"fp32": ("dense fp32 product", True), half: (f"dense {half} product", True), **lowbit.LOW_BIT}
    claim.table(
        f"Batch-1 decode step of the twin (32 cached tokens), {half} activations for the low-bit kernels",
        ["weights", "kernel", "reads stored codes", "bytes per step (MB)", f"bytes vs {half}", "step (ms)", f"speedup vs {half}", "GB/s", "roofline", "of the read",
         "from a cache, vs the read"],
        [
            [n, kernels[n][0], "yes" if kernels[n][1] else "no", f"{s.bytes / 1e6:.0f}", f"{s.bytes / base.bytes:.3f}", f"{s.step_s * 1e3:.1f}", f"{base.step_s / s.step_s:.2f}x",
             f"{s.bandwidth / 1e9:.2f}", f"{s.roofline:.2f}", f"{s.over_read:.2f}", f"{headrooms[n]:.2f}x"]
            for n, s in steps.items()
        ],
    )
    claim.note(
        f"'from a cache, vs the read': each kernel's premise probe, {lowbit.PROBE_CALLS} products of one token with {lowbit.PROBE_MATRIX} "
        "(its weights stay in a cache), in weight bytes per second over the read's. Above 1 the kernel outruns memory and its step is "
        "bound by the bytes it reads, the chapter's premise; the speedups are asserted only for pairs where both kernels are."
    )
    claim.note(
        f"Roofline = weight bytes per step / step time / the bandwidth of a plain memory copy measured in the same run "
        f"({base.copy_bandwidth / 1e9:.2f} GB/s, one thread on a CPU); 'of the read' = the same over a read-only stream "
        f"(a sum of {probe / 2**20:,.0f} MiB, {base.read_bandwidth / 1e9:.2f} GB/s), which no path may exceed. The probes stream {probe / 2**20:,.0f} MiB "
        f"each against a last-level cache of {cache / 2**20:,.1f} MiB ({'as the system reports it' if cache_reported else 'not reported by the system: assumed'}). The int4 row of torchao is not run: its Int4WeightOnlyConfig needs "
        "the mslk package (>= 1.0), which PyPI does not have. A kernel that does not read the stored codes (per-call dequantization: torchao's eager path, LLM.int8) is reported, not asserted."
    )
    eight, four = steps["int8"], steps[FOUR_BIT[kind]]
    dense_copies = {n: lowbit.dense_copy_per_call(m) for n, m in models.items()}  # measured once per path, asserted for the two kernels
    used = evidence.combine(*(s.evidence for s in steps.values()))
    claim.note(f"each timed step, traced once: {evidence.describe(used)}")
    claim.verify(
        "twin",
        **evidence.conditions(used),
        bytes_ratio_16bit=base.bytes / steps["fp32"].bytes,
        bytes_ratio_8bit=eight.bytes / base.bytes,
        bytes_ratio_4bit=four.bytes / base.bytes,
        **timing.measured(found),
        rounds=found["speedup_8bit"].rounds,
        premise_8bit=premise_8bit,
        premise_8bit_why=why_8bit,
        premise_4bit=premise_4bit,
        premise_4bit_why=why_4bit,
        dense_copy_per_call=max(dense_copies[n] for n in ("int8", FOUR_BIT[kind])),
        dense_copy_per_call_by_path={n: round(c, 4) for n, c in dense_copies.items()},
        kernel_4bit=FOUR_BIT[kind],
        dtype_16bit=half,
        bytes_per_step={n: s.bytes for n, s in steps.items()},
        step_ms={n: round(s.step_s * 1e3, 2) for n, s in steps.items()},
        roofline={n: round(s.roofline, 3) for n, s in steps.items()},
        over_read_by_path={n: round(s.over_read, 3) for n, s in steps.items()},
        copy_gb_per_s=base.copy_bandwidth / 1e9,
        read_gb_per_s=base.read_bandwidth / 1e9,
        probe_over_cache=probe / cache,
        last_level_cache_bytes=cache,
        last_level_cache_reported=cache_reported,
    )


@pytest.mark.claim("Q-ABSMAX")
def test_the_books_absmax_listing_rounds_within_half_a_step(claim):
    """Q-ABSMAX: "qmax = 2 ** (bits - 1) - 1; scale = W.abs().max() / qmax; Wq = torch.round(W / scale).clamp(-qmax - 1, qmax)"."""
    seen = {"worst": 0.0, "idempotent": True, "symmetric": True, "matches": True, "top": {8: set(), 4: set()}}

    @given(w=nonzero_weights, bits=st.sampled_from((8, 4)))
    @example(w=np.array([[1.0, -0.5, 0.25]], np.float32), bits=8)  # the largest weight positive
    @example(w=np.array([[-1.0, 0.5, 0.3]], np.float32), bits=4)  # the largest weight negative
    @example(w=np.array([[7.0, 0.5, 2.5, -1.5]], np.float32), bits=4)  # scale exactly 1: ties at 0.5, 2.5, -1.5
    def properties(w, bits):
        w = torch.from_numpy(w)  # [out, in]
        Wq, scale, W_hat = quant.absmax_listing(w, bits)
        seen["top"][bits].add(int(Wq.abs().max()))
        seen["worst"] = max(seen["worst"], float(((w - W_hat).abs() / (scale / 2)).max()))
        seen["idempotent"] &= bool(torch.equal(quant.absmax_listing(W_hat, bits)[0], Wq))
        seen["symmetric"] &= bool(torch.equal(quant.absmax_listing(-w, bits)[0], -Wq))
        for scheme, kw in ((f"int{bits}-tensor", {}), (f"int{bits}-row", {"rows": True}), (f"int{bits}-g16", {"block": 16})):
            suite = quant.fake_quantize(w, scheme, scale_dtype=torch.float32)
            seen["matches"] &= bool(torch.equal(suite, quant.listing_blockwise(w, bits, **kw)))

    properties()
    top = {b: (min(v) if len(v) == 1 else sorted(v)) for b, v in seen["top"].items()}
    ramp = torch.linspace(-1, 1, 100_001)  # every code the listing can give: a dense ramp over the range its scale maps
    produced = {b: int(quant.absmax_listing(ramp, b)[0].unique().numel()) for b in (8, 4)}
    span = quant.listing_code_span_bf16(8)  # the listing's codes of every bf16 magnitude a, as W = [a, -a]
    claim.note(f"As printed, the listing's codes Wq have W's dtype: {quant.absmax_listing(ramp, 8)[0].dtype} for fp32 weights, "
               f"{quant.absmax_listing(ramp.bfloat16(), 8)[0].dtype} for bf16 ones. Codes it produces over a dense ramp: "
               f"{produced[8]} at 8 bits, {produced[4]} at 4 (the clamp's lower end, -qmax - 1, is never reached).")
    claim.verify(
        "arithmetic",
        qmax_int8=top[8],
        qmax_int4=top[4],
        rounding=quant.rounding_rule(quant.absmax_listing),
        max_err_over_half_scale=seen["worst"],
        codes_idempotent=seen["idempotent"],
        sign_symmetric=seen["symmetric"],
        codes_span_bf16_int8=[span["lowest"], span["highest"]],
        bf16_ties_int8=f"{span['ties']} of {span['magnitudes']}",
        wq_bytes_per_weight_int8=quant.absmax_listing(ramp, 8)[0].element_size(),
        codes_produced_int8=produced[8],
        codes_produced_int4=produced[4],
        suite_matches_listing=seen["matches"],
        suite_rounding=quant.rounding_rule(lambda w, bits: (quant.quantize(w, f"int{bits}-tensor").unpacked_codes().flatten(),)),
    )


@pytest.mark.claim("Q-COUNT")
@on_profiles("twin", "stand-in", "book")
def test_168_projection_matrices_hold_357_8_m_parameters(claim, profile):
    """Q-COUNT: "all 168 projection matrices, 357.8 million parameters"."""
    weights = quant.projection_weights(profile.model)
    layers = profile.config.num_hidden_layers
    claim.verify(
        profile.name,
        matrices=len(weights),
        parameters=sum(w.numel() for w in weights.values()),
        parameters_millions=sum(w.numel() for w in weights.values()) / 1e6,
        layers=layers,
        matrices_per_layer=len(weights) / layers,
    )


def _table(profile, error_tables):
    """The profile's error table as a path ``table(weights, schemes) -> rows`` (each scheme computed once per session)."""
    return lambda weights, schemes: error_tables(profile, schemes)[0]


def _read_off(measure, path, claim_id: str) -> bool:
    """Whether every cross-check of ``claim_id`` and every quantity it guards (the registry's ``reads`` and ``guards``)
    moves when the results of ``path`` are perturbed: all of them read off that path's result, none off another."""
    names = [n for c in registry.get(claim_id).checks if c.reads for n in (c.q, *c.guards)]
    return bool(names) and all(provenance.moved(measure, path, names).values())


def _error_rows(profile, error_tables, schemes=quant.SCHEMES):
    """The profile's error table for ``schemes`` (each computed once per session), by scheme, and its wall time."""
    rows, seconds = error_tables(profile, schemes)
    return {r.scheme: r for r in rows}, seconds


@pytest.mark.claim("Q-ERROR-TABLE")
@on_profiles("stand-in", "book")
def test_int4_per_tensor_collapses_to_099_on_the_worst_matrix(claim, profile, error_tables):
    """Q-ERROR-TABLE: "a relative error of 0.99 on the worst matrix": INT4 per tensor collapses."""
    rows, seconds = _error_rows(profile, error_tables)
    claim.table(
        f"Relative error ||W - W_hat|| / ||W|| over {len(rows['reference'].errors)} projection matrices ({profile.name})",
        ["scheme", "mean", "worst", "worst matrix"],
        [[r.scheme, f"{r.mean:.4f}", f"{r.worst:.4f}", r.worst_matrix] for r in rows.values()],
    )
    claim.figure("q-error-by-scheme" if profile.name == "stand-in" else f"q-error-by-scheme-{profile.name}", quant_error.error_figure(list(rows.values()), f"Quantization error per scheme ({profile.name})"))
    weights, table = quant.projection_weights(profile.model), _table(profile, error_tables)
    measured = quant_error.table_values(weights, table)
    measured["cross_checks_read_path"] = _read_off(lambda t: quant_error.table_values(weights, t), table, "Q-ERROR-TABLE")
    measured["weights_per_scheme"] = sum(w.numel() for w in weights.values())
    # what the collapsed reconstruction consists of ("noise of about the right size"), and the bound nearest rounding keeps
    made = quant_error.reconstruction(weights[rows["int4-tensor"].worst_matrix], "int4-tensor")
    measured.update({f"int4_tensor_worst_{k}": v for k, v in made.items()})
    if profile.name == "stand-in":
        measured["int4_g32_mean"] = sum(quant_error.relative_error(w, "int4-g32") for w in weights.values()) / len(weights)
        claim.note(STAND_IN_NOTE.format(g32=measured["int4_g32_mean"]))
    claim.verify(profile.name, **measured, matrices=len(rows["reference"].errors), quantize_all_schemes_s=seconds)


@pytest.mark.claim("Q-ROW-3.4")
@on_profiles("stand-in", "book")
def test_per_row_scales_divide_int4_error_by_3_4(claim, profile, error_tables):
    """Q-ROW-3.4: "per output row divides the error by 3.4; per group of 128 divides it again"."""
    weights, table = quant.projection_weights(profile.model), _table(profile, error_tables)
    measured = quant_error.scale_ratios(weights, table)
    claim.verify(profile.name, **measured, cross_checks_read_path=_read_off(lambda t: quant_error.scale_ratios(weights, t), table, "Q-ROW-3.4"))


@pytest.mark.claim("Q-TWO-THREE-LEVELS")
@on_profiles("stand-in", "book")
def test_int4_per_tensor_leaves_ordinary_weights_two_or_three_levels(claim, profile, error_tables):
    """Q-TWO-THREE-LEVELS: "the ordinary weights -- so all of them -- round to two or three different levels"."""
    rows, _ = _error_rows(profile, error_tables, ("int4-tensor",))
    weights = quant.projection_weights(profile.model)
    example = BOOK_DOWN_PROJ  # the book's example matrix (also on the stand-in, as Q-DOWNPROJ-STATS)
    worst = rows["int4-tensor"].worst_matrix
    claim.verify(
        profile.name,
        levels=quant_error.central_levels(weights[example]),
        levels_worst=quant_error.central_levels(weights[worst]),
        example_matrix=example,
        worst_matrix=worst,
    )


@pytest.mark.claim("Q-DOWNPROJ-STATS")
@on_profiles("arithmetic", "stand-in", "book")
def test_one_down_proj_has_a_24_sigma_weight(claim, profile, request):
    """Q-DOWNPROJ-STATS: "mean |w| 0.01386 std 0.01822 max |w| 0.43945 max/std 24.1; 692 of 4,358,144 beyond 6 sigma"."""
    if profile is None:  # the book against itself: each printed number recomputed from the others it follows from
        b = registry.get("Q-DOWNPROJ-STATS").book
        tail = quant_error.tail_summary(b["max_abs"], b["std"], b["beyond_6sigma"], b["numel"])  # the measurement's own arithmetic
        claim.verify(request.node.callspec.params["profile"], numel=b["shape"][0] * b["shape"][1], numel_millions=b["numel"] / 1e6, **tail,
                     sigmas_largest=tail["max_over_std"], sigmas_largest_beyond_six=tail["max_over_std"])
        return
    w = quant.projection_weights(profile.model)[BOOK_DOWN_PROJ]
    values = quant_error.tail_values(w, seed=SEED)  # the matrix's statistics, and the tail measurement calibrated on a normal tail it can count
    claim.table(
        f"{BOOK_DOWN_PROJ} ({' x '.join(map(str, w.shape))}, {profile.name})",
        ["mean |w|", "std", "max |w|", "max/std", "beyond 6 sigma"],
        [[f"{values['mean_abs']:.5f}", f"{values['std']:.5f}", f"{values['max_abs']:.5f}", f"{values['max_over_std']:.1f}", f"{values['beyond_6sigma']:,} of {values['numel']:,} ({values['beyond_percent']:.3f} %)"]],
    )
    claim.verify(
        profile.name,
        **values,
        cross_checks_read_path=_read_off(lambda path: quant_error.tail_values(w, SEED, path), quant_error.matrix_stats, "Q-DOWNPROJ-STATS"),
        shape=list(w.shape),
        sigmas_largest=values["max_over_std"],
        sigmas_largest_beyond_six=values["max_over_std"],
        numel_millions=values["numel"] / 1e6,
        matrix=BOOK_DOWN_PROJ,
    )


@pytest.mark.claim("Q-BITS-G128")
def test_group_128_costs_4_125_bits_per_weight(claim):
    """Q-BITS-G128: "a 16-bit scale per group of 128 is 4 + 16/128 = 4.125 bits per weight"."""
    nbytes, weights = quant_error.stored_bits(QWEN25_05B.projection_shapes(), "int4-g128", count=QWEN25_05B.layers)
    claim.verify("arithmetic", bits_per_weight=8 * nbytes / weights, stored_bytes=nbytes, weights=weights)


@pytest.mark.claim("Q-NF4")
@on_profiles("arithmetic", "stand-in", "book")
def test_nf4_costs_4_25_bits_and_lowers_the_error_28_percent(claim, profile, request):
    """Q-NF4: "kies de zestien niveaus als de kwantielen van een normale verdeling ... 4,25 bits per weight
    tegenover 4,125 bij group-128 -- en de gemeten fout daalt van 0,1323 naar 0,0952, 28 % lager"."""
    if profile is None:  # the bits as the chapter counts them and as the libraries store them, on the book's matrices
        shapes, layers = QWEN25_05B.projection_shapes(), QWEN25_05B.layers
        (nf4_bytes, weights), (g128_bytes, _) = quant_error.stored_bits(shapes, "nf4", layers), quant_error.stored_bits(shapes, "int4-g128", layers)
        stored = formats.survey(shapes, layers)
        claim.table(f"Bits per weight as the libraries store them, over the {len(shapes) * layers} projection matrices of the book's architecture",
                    formats.TABLE_HEADER, formats.table_rows(stored))
        bnb = [stored["bnb-nf4"], stored["bnb-nf4-double-quant"]]
        claim.verify(
            request.node.callspec.params["profile"],
            bits_per_weight=8 * nf4_bytes / weights,
            bits_g128=8 * g128_bytes / weights,
            **({"bnb_bits_per_weight": bnb[0].serialized_bits_per_weight, "bnb_double_quant_bits_per_weight": bnb[1].serialized_bits_per_weight,
                "bnb_unaccounted_bytes_per_matrix": max(abs(s.serialized - s.nbytes) for s in bnb) / (len(shapes) * layers),
                "bnb_double_quant_over_single": bnb[1].serialized_bits_per_weight / bnb[0].serialized_bits_per_weight}
               if all(isinstance(s, formats.Stored) for s in bnb) else {}),
        )
        return
    weights, table = quant.projection_weights(profile.model), _table(profile, request.getfixturevalue("error_tables"))
    shapes = {n: tuple(w.shape) for n, w in weights.items()}
    (nf4_bytes, count), (g128_bytes, _) = quant_error.stored_bits(shapes, "nf4"), quant_error.stored_bits(shapes, "int4-g128")
    claim.verify(
        profile.name,
        **quant_error.nf4_values(weights, table),
        bits_per_weight=8 * nf4_bytes / count,
        bits_g128=8 * g128_bytes / count,
        cross_checks_read_path=_read_off(lambda t: quant_error.nf4_values(weights, t), table, "Q-NF4"),
    )


# ----------------------------------------------------------------------------------------------
# independent cross-checks of the quantizers (a disagreement is a failing test)
# ----------------------------------------------------------------------------------------------


