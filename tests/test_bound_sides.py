"""The audit of one-sided bounds (issue 43): every inequality the registry asserts on one side only says why.

A bound is two-sided wherever physics or arithmetic gives a second side (a rounding floor, a doubling's 2x, a byte
floor, a copy bandwidth, at least one level). Each check below bounds its quantity from one side, and this file
holds the reason there is no second one to assert, in one of a few kinds. A new one-sided check fails here until
its reason is written, and a reason left for a check that has gained its other side (or is gone) fails too. A
``covered`` reason names the check of the same claim that bounds the quantity from the other side under another
name, and the test holds that this check exists and faces the other way.
"""

from cheapinfer.harness import registry

LOWER, UPPER = {">", ">="}, {"<", "<="}

REASONS = {
    "zero": "a discrepancy or error whose ideal is 0, reached by a correct system (two evaluations giving the same "
            "bits, a rule met exactly): nothing below it to bound",
    "p-value": "a p-value: under its null hypothesis it lies anywhere in [0, 1], and the test's level is its one "
               "deciding side",
    "evidence": "evidence of use: a cached context moves the logits by O(1); no ceiling lies short of the logits' "
                "own range",
    "fraction": "a fraction or share of a count: at most 1 by its definition, so a check of that side could not fail",
    "device": "a speed ratio whose other limit is set by the device's balance of arithmetic and bandwidth (the cost "
              "model's D/p), not by physics the suite can state for every machine",
    "claim": "the book's statement is one-sided, and the other side has no limit within reach (a heavy tail, a "
             "collapse, a count, a ratio of two errors may be as large or as small as the data make it)",
    "premise": "a premise of the measurement, where more margin is only better (a probe larger than the cache, "
               "fewer bytes copied per call)",
}

#: Quantities that are one-sided in every claim that measures them.
BY_QUANTITY = {"logit_change_vs_no_context": "evidence", "layer_capture_mismatch": "zero"}

#: Each other one-sided check: its kind, or ("covered", the check of its claim that bounds the other side[, "reciprocal"
#: where that check's quantity is a reciprocal of this one's, so that it faces the same way]).
AUDIT = {
    ("KV-SPEEDUP-48", "speedup"): "device",
    ("KV-SPEEDUP-48", "speedup_growth"): "device",
    ("KV-SCORES-BYTES", "cached_minus_recompute_over_bound"): "zero",
    ("KV-HEAD-TIMING", "ratio_growth"): "device",
    ("KV-HEAD-TIMING", "ratio_at_4096"): "device",
    ("KV-MEMORY-8.3X", "ratio"): "claim",
    ("KV-MEMORY-8.3X", "uncached_logits_share"): "fraction",
    ("KV-MEMORY-8.3X", "cached_logits_share"): "fraction",
    ("KV-PREFILL-DECODE", "decode_over_prefill"): "device",
    ("KV-DECODE-MEMBOUND", "bandwidth_fraction"): ("covered", "over_read"),
    ("KV-DECODE-MEMBOUND", "over_read"): ("covered", "bandwidth_fraction"),
    ("KV-DECODE-MEMBOUND", "probe_over_cache"): "premise",
    ("KV-PREFILL-GROWS", "growth"): "device",
    ("KV-PREFILL-GROWS", "worst_drop"): "zero",
    ("BAT-1-TO-16", "throughput_gain"): ("covered", "latency_gain", "reciprocal"),  # latency t(16)/t(1) >= 1 is throughput 16 t(1)/t(16) <= 16
    ("BAT-1-TO-16", "latency_gain"): ("covered", "throughput_gain", "reciprocal"),
    ("BAT-KNEE", "knee_latency_gain"): "device",
    ("BAT-STATIC-CONT", "seeded_throughput_ratio"): "claim",
    ("BAT-STATIC-CONT", "seeded_latency_ratio"): "claim",
    ("BAT-STATIC-CONT", "real_throughput_ratio"): "claim",
    ("BAT-STATIC-CONT", "prediction_error"): "zero",
    ("BAT-STATIC-CONT", "fresh_row_change_vs_no_context"): "zero",
    ("PAGE-WASTE", "max_unused_slots_per_sequence_paged"): "zero",
    ("PAGE-WASTE", "blocks_reused"): "claim",
    ("PAGE-PREFIX", "blocks_saved"): "claim",
    ("Q-BYTES-SPEED", "speedup_16bit"): ("covered", "over_read"),
    ("Q-BYTES-SPEED", "speedup_8bit"): ("covered", "over_read"),
    ("Q-BYTES-SPEED", "speedup_4bit"): ("covered", "over_read"),
    ("Q-BYTES-SPEED", "dense_copy_per_call"): "premise",
    ("Q-BYTES-SPEED", "over_read"): ("covered", "speedup_8bit"),
    ("Q-BYTES-SPEED", "probe_over_cache"): "premise",
    ("Q-ABSMAX", "max_err_over_half_scale"): "zero",
    ("Q-ERROR-TABLE", "int4_tensor_worst"): ("covered", "error_max"),
    ("Q-ERROR-TABLE", "error_max"): ("covered", "int4_tensor_worst"),
    ("Q-DOWNPROJ-STATS", "max_over_std"): "claim",
    ("Q-DOWNPROJ-STATS", "tail_excess"): "claim",
    ("Q-DOWNPROJ-STATS", "normal_tail_z"): "zero",
    ("Q-ROW-3.4", "tensor_over_row"): "claim",
    ("Q-ROW-3.4", "row_over_g128"): "claim",
    ("Q-ROW-3.4", "row_absmax_kept"): "fraction",
    ("Q-ROW-3.4", "g128_absmax_kept"): "fraction",
    ("Q-NF4", "levels_vs_normal_quantiles"): "zero",
    ("Q-NF4", "nf4_over_g128"): "claim",
    ("Q-NF4", "bnb_unaccounted_bytes_per_matrix"): "zero",
    ("Q-NF4", "bnb_double_quant_over_single"): "claim",
    ("OUT-DIM62", "top_over_median"): "claim",
    ("OUT-HISTOGRAM", "empty_octaves"): "claim",
    ("OUT-INT8-LEVELS", "levels"): "claim",  # the book's 14 +- 3 is asserted where its digits are (the book profile)
    ("OUT-EXCLUDE-4", "shrink"): "claim",
    ("OUT-EXCLUDE-4", "median_dim_levels_excl"): "claim",
    ("EVAL-TABLE", "ppl_vs_library_over_bound"): "zero",
    ("EVAL-INT8-FREE", "ppl_gap_rel"): "zero",
    ("EVAL-INT8-FREE", "agreement_frac"): "fraction",
    ("EVAL-INT8-TENSOR", "ppl_ratio"): "claim",
    ("EVAL-INT8-TENSOR", "battery_change_p"): "p-value",
    ("EVAL-INT4-COLLAPSE", "ppl_ratio"): "claim",
    ("EVAL-NOISE", "battery_change_p"): "p-value",
    ("EVAL-AGREEMENT", "adjacent_disagreements_p"): "p-value",
    ("EVAL-AGREEMENT", "levels_agreement_minus_battery"): "claim",
    ("SPEC-EXACT-SAMPLING", "closed_form_max_err"): "zero",
    ("SPEC-EXACT-SAMPLING", "chi2_pvalue"): "p-value",
    ("SPEC-EXACT-SAMPLING", "tv"): "zero",
    ("SPEC-EXPECTED", "series_err_over_bound"): "zero",
    ("SPEC-EXPECTED", "max_abs_z"): "zero",
    ("SPEC-SPEEDUP", "max_rel_err"): "zero",
    ("SPEC-SLOWDOWN", "kept_tokens_minus_rule"): "zero",
    ("SPEC-GAMMA8", "speedup_a09"): "claim",
    ("SPEC-GAMMA8", "speedup_a03"): "claim",
    ("SPEC-ALPHA", "alpha_int8_row"): "fraction",
    ("SPEC-ALPHA", "max_alpha_gap"): "zero",
    ("SPEC-REAL-SLOWDOWN", "slowdown"): "device",
    ("SPEC-REAL-SLOWDOWN", "timed_forwards"): "premise",
    ("DIST-MILK", "top1_prob"): "fraction",
    ("DIST-TEMPERATURE", "sqrt_identity_err_over_bound"): "zero",
    ("DIST-TEMPERATURE", "mass_err_over_bound"): "zero",
    ("FLASH-NO-SCORES", "max_diff_over_bound"): "zero",
}


def _sides() -> dict[tuple[str, str], set[str]]:
    """Each (claim, quantity) bounded by an ordering on a number: the sides it is bounded from."""
    out: dict[tuple[str, str], set[str]] = {}
    for cid, claim in registry.load().items():
        for c in claim.checks:
            if c.kind == "shape" and c.op in LOWER | UPPER and not isinstance(c.bound, bool):
                out.setdefault((cid, c.q), set()).add("lower" if c.op in LOWER else "upper")
    return out


def test_every_one_sided_bound_says_why_it_has_no_other_side():
    one_sided = {key for key, sides in _sides().items() if len(sides) == 1}
    unexplained = sorted(k for k in one_sided if k not in AUDIT and k[1] not in BY_QUANTITY)
    assert not unexplained, f"one-sided bounds without a reason in AUDIT: {unexplained}"
    stale = sorted(k for k in AUDIT if k not in one_sided)
    assert not stale, f"AUDIT gives reasons for checks that are not one-sided bounds (gone, or two-sided now): {stale}"


def test_every_reason_is_one_of_the_written_kinds():
    kinds = [v[0] if isinstance(v, tuple) else v for v in [*AUDIT.values(), *BY_QUANTITY.values()]]
    assert set(kinds) <= {*REASONS, "covered"}


def test_a_covered_bound_is_faced_by_its_covering_check_from_the_other_side():
    sides = _sides()
    for (cid, q), reason in AUDIT.items():
        if isinstance(reason, tuple):
            other, reciprocal = sides.get((cid, reason[1])), reason[2:] == ("reciprocal",)
            assert other and (other == sides[(cid, q)]) == reciprocal, f"{cid}: {q} is covered by {reason[1]}, which does not bound it from the other side"
