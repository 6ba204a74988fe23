"""The arithmetic the registry states is recomputed: a ``why`` (or note, erratum, source reading) whose numbers are
wrong fails here, not in a reader's head.

- every ``arithmetic = number`` in the registry's text (cheapinfer.harness.whys), to the stated number's precision;
- every floating-point unit roundoff the text names for bf16, fp16 or fp32, against torch.finfo;
- the numbers the text states about the suite's own constants and functions (a length divisor, an implied c).
"""

import re
from pathlib import Path

import pytest
import torch

from cheapinfer.harness import registry, whys

REGISTRY = Path(registry.__file__).resolve().parent.parent / "registry.toml"
TEXT = REGISTRY.read_text(encoding="utf-8")


def test_every_stated_equation_recomputes():
    stated = whys.registry_equations(REGISTRY)
    assert len(stated) >= 40, "the parser found too few equations: it no longer reads the registry's text"
    wrong = [s.describe() for s in stated if not s.holds]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("text, holds", [
    ("0.01 is 2.6 units of bf16 rounding (0.01 / 2^-8 = 2.56)", True),
    ("0.01 is 5 units of bf16 rounding (0.01 / 2^-8 = 5)", False),  # the old why's count of units against bf16's roundoff
    ("4 + 32/64 = 4.50 bits", True),
    ("4 + 32/64 = 4.25 bits", False),
    ("65,378 / 3,136 = 20.85", True),
    ("(48 D + 51 p) = 12", None),  # symbols: not arithmetic, not read
    ("2 x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B", True),
    ("142 / 144 = 98.6%", True),
    ("a = 85/64 = 1.328125", True),  # a stated number is never cut short to a prefix of the next expression ("a = 8")
])
def test_the_parser_reads_and_judges(text, holds):
    found = list(whys.equations(text))
    assert (found[0].holds if found else None) == holds


FORMATS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def test_every_unit_roundoff_named_is_the_formats():
    """u = eps / 2 (round to nearest): bf16 2^-8, fp16 2^-11, fp32 2^-24. Each 'bf16's u = 2^-k', 'fp16's 2^-k' or
    'u = 2^-k' after a format's name within the same clause must give that format's k."""
    seen = 0
    for m in re.finditer(r"\b(bf16|fp16|fp32)\b(?:'s)?[^.;:]{0,40}?\b(?:u = |unit roundoff,? |)2\^-(\d+)", TEXT):
        want = -int(torch.log2(torch.tensor(torch.finfo(FORMATS[m[1]]).eps / 2)).item())
        assert int(m[2]) == want, f"{m[0]!r}: {m[1]}'s unit roundoff is 2^-{want}"
        seen += 1
    assert seen >= 10
    assert "2^-9" not in TEXT, "2^-9 is no format's unit roundoff (bf16 2^-8, fp16 2^-11)"


def test_units_of_rounding_are_the_bound_over_the_roundoff():
    """'B is N units of bf16 rounding': N = B / 2^-8, to the digits stated."""
    found = re.findall(r"([\d.]+) is ([\d.]+) units of (bf16|fp16) rounding", TEXT)
    assert found
    for bound, units, fmt in found:
        u = torch.finfo(FORMATS[fmt]).eps / 2
        assert abs(float(bound) / u - float(units)) <= whys.precision(units), (bound, units, fmt)


def test_the_cpu_length_divisor_stated_is_the_codes():
    from cheapinfer.chapter.batching import batch_curve

    for claim_id in ("PAGE-WASTE", "BAT-STATIC-CONT"):
        note = registry.get(claim_id).note
        divisors = {int(d) for d in re.findall(r"(?:divided by|lengths /) (\d+)", note)}
        assert divisors == {batch_curve.CPU_LENGTH_SCALE}, (claim_id, divisors)


def test_the_implied_draft_cost_stated_is_the_formulas():
    """SPEC-GAMMA8's note states the c each printed speedup implies; recomputed from the printed speedups."""
    from cheapinfer.chapter.speculative import speculative

    claim = registry.get("SPEC-GAMMA8")
    b = claim.book
    implied = {a: round(speculative.implied_c(v, a, b["gamma"]), 3) for a, v in ((b["alpha_high"], b["speedup_a09"]), (b["alpha_low"], b["speedup_a03"]))}
    stated = {float(a) / 100: float(c) for c, a in re.findall(r"c = (0\.\d{3}) at (\d+)%", claim.note)}
    assert stated == implied


def test_the_fp16_score_bytes_stated():
    n = registry.get("KV-SCORES-BYTES").book["n"]
    assert f"{n * n * 2:,} B" in TEXT and f"{n * n * 2 / 1e6:.2f} MB" in TEXT


def test_the_kept_tokens_band_separates_the_printed_gamma_from_its_neighbours():
    """SPEC-SLOWDOWN's kept_tokens_exact: the formula at the printed 30 % and gamma = vijf - 1, to the digits the registry
    gives it; its tolerance half the gap to the nearest other draft length, so no other gamma lies inside it."""
    from cheapinfer.chapter.speculative import speculative

    claim = registry.get("SPEC-SLOWDOWN")
    b = claim.book
    gamma = b["passes"] - 1
    check = next(c for c in claim.checks if c.q == "kept_tokens_exact")
    assert b["gamma"] == gamma
    assert abs(b["kept_tokens_exact"] - speculative.expected_tokens(b["alpha"], gamma)) <= whys.precision(str(b["kept_tokens_exact"]))
    nearest = min(abs(speculative.expected_tokens(b["alpha"], g) - speculative.expected_tokens(b["alpha"], gamma)) for g in range(1, 64) if g != gamma)
    assert check.tol == pytest.approx(nearest / 2)
    exact = speculative.expected_tokens(b["alpha"], gamma)
    for g in range(1, 64):
        inside = abs(speculative.expected_tokens(b["alpha"], g) - b["kept_tokens_exact"]) <= check.tol
        assert inside == (g == gamma), g
    assert abs(exact - b["kept_tokens_exact"]) + whys.precision(str(b["kept_tokens_exact"])) < check.tol


def _bound(claim_id: str, q: str, op: str):
    return next(c.bound for c in registry.get(claim_id).checks if c.q == q and c.op == op)


def test_the_int8_rounding_floor_is_its_derivation_and_holds_on_real_rounding():
    """Q-ERROR-TABLE's int8_row_worst > 1 / (127 sqrt 12): the bound is the derivation (rounded down to its digits), a
    per-row INT8 quantizer stays above it on seeded weights of every spread, and the floor's one exception, a row whose
    every weight is its largest, sits on the grid (the why's 'reached only by')."""
    import math

    from cheapinfer.chapter.quantization import quant_error

    floor = 1 / (127 * math.sqrt(12))
    bound = _bound("Q-ERROR-TABLE", "int8_row_worst", ">")
    assert floor - whys.precision(f"{bound}") * 2 <= bound <= floor
    g = torch.Generator().manual_seed(0)
    for w in (torch.randn(64, 896, generator=g), torch.randn(64, 896, generator=g) ** 3, torch.rand(64, 896, generator=g) - 0.5):
        assert quant_error.relative_error(w, "int8-row") > floor
    edge = torch.full((4, 896), 1e-5)
    edge[:, 0] = 1.0  # the assumption's edge: each row's norm one weight, the rest far below a step, erring by themselves
    assert quant_error.relative_error(edge, "int8-row") < floor
    assert quant_error.relative_error(torch.ones(4, 128).mul_(torch.tensor([[1.0], [-2.0], [0.5], [3.0]])), "int8-row") < floor / 10  # the fp16 scale's rounding alone


def test_the_byte_floors_are_the_codes_and_the_least_scale():
    """Q-BYTES-SPEED's floors: 8-bit codes over 16-bit weights; 4-bit codes plus the least scale of the suite's 4-bit
    layouts (a 16-bit scale per group of 128; an 8-bit absmax per NF4 block of 64) over 16 bits."""
    from cheapinfer.chapter.quantization import quant

    assert _bound("Q-BYTES-SPEED", "bytes_ratio_8bit", ">=") == 8 / 16
    g128 = 4 + torch.finfo(quant.SCALE_DTYPE).bits / 128
    nf4_double = 4 + 8 / quant.NF4_BLOCK
    assert _bound("Q-BYTES-SPEED", "bytes_ratio_4bit", ">=") == min(g128, nf4_double) / 16
    assert _bound("Q-BYTES-SPEED", "bytes_ratio_4bit", ">=") < _bound("Q-BYTES-SPEED", "bytes_ratio_4bit", "<=")


def test_a_doubling_cannot_more_than_double_the_throughput():
    """BAT-KNEE's gain_before_knee <= 2: the cost model's 2 (w + b c) / (w + 2 b c) over any w, b, c >= 0 stays at or
    below 2 and reaches it only at c = 0."""
    gains = [2 * (w + b * c) / (w + 2 * b * c) for w in (0.01, 1.0, 100.0) for b in (1, 16, 256) for c in (0.0, 1e-3, 1.0, 1e3)]
    assert max(gains) == 2.0 == _bound("BAT-KNEE", "gain_before_knee", "<=")
    check = next(c for c in registry.get("BAT-KNEE").checks if c.q == "gain_before_knee" and c.op == "<=")
    assert check.limit and check.noise == "rounds"


def test_at_least_one_level_and_a_group_scheme_short_of_exact():
    """Q-TWO-THREE-LEVELS' and OUT-ONE-LEVEL's floor of 1 level (a non-empty set of weights takes a code), and
    Q-ROW-3.4's gap_recovered < 1 - 1 / (7 sqrt 12) (group-128's rounding floor, the per-tensor error at most 1)."""
    import math

    from cheapinfer.chapter.outliers import outliers
    from cheapinfer.chapter.quantization import quant_error

    assert _bound("Q-TWO-THREE-LEVELS", "levels_worst", ">=") == 1 == _bound("OUT-ONE-LEVEL", "median_dim_levels", ">=")
    g = torch.Generator().manual_seed(1)
    w = torch.randn(32, 256, generator=g)
    w[0, 0] = 1e4  # a collapse: every ordinary weight rounds to 0, one level
    assert quant_error.central_levels(w) == 1
    h = torch.randn(84, 64, generator=g)
    h[:, 0] *= 1e4
    assert min(outliers.int8_report(h).dim_levels) >= 1
    floor = 1 / (7 * math.sqrt(12))  # group-128's rounding floor: 7 levels a side
    bound = _bound("Q-ROW-3.4", "gap_recovered", "<")
    assert 1 - floor <= bound <= 1 - floor + whys.precision(f"{bound}")
    heavy = torch.randn(32, 256, generator=g) ** 3  # a heavy tail, its largest weights tens of standard deviations out
    for m in (torch.randn(32, 256, generator=g), heavy):
        assert quant_error.relative_error(m, "int4-g128") > floor
    tensor, g128 = (quant_error.relative_error(heavy, s) for s in ("int4-tensor", "int4-g128"))
    assert 0 < 1 - g128 / tensor < bound
    # the assumption's edge, as the why states it: a group whose norm is one weight 10^4 out rounds the rest to 0 and errs
    # by them alone, below the floor (w above: every ordinary weight at one level)
    assert quant_error.relative_error(w, "int4-g128") < floor


def test_the_speedup_and_peak_floors_are_their_derivations():
    """SPEC-SLOWDOWN's speedup >= 1 / (gamma c + 1) (a pass keeps at least the target's token), rounded down; and
    FLASH-NO-SCORES' peak >= the call's output over the scores, in the narrower of its two dtypes (fp16 on CUDA)."""
    b = registry.get("SPEC-SLOWDOWN").book
    floor = 1 / (b["gamma"] * b["c"] + 1)
    bound = _bound("SPEC-SLOWDOWN", "speedup", ">=")
    assert floor - 1e-4 <= bound <= floor
    n, d = registry.get("KV-SCORES-BYTES").book["n"], 64
    assert _bound("FLASH-NO-SCORES", "fused_peak_over_scores", ">=") == n * d * 2 / (n * n * 4)


def test_the_gain_before_the_knee_reads_the_book_curve_and_its_fault_passes_the_2x():
    """BAT-KNEE's gain_before_on_book_curve: 1.9 on the known curve, on every machine; the fault that reads the steepest
    doubling over two doublings gives 1.9^2 there, beyond gain_before_knee's limit of 2."""
    from cheapinfer.chapter.batching import knee
    from cheapinfer.faults import catalogue  # noqa: F401  (registers the faults)
    from cheapinfer.faults.core import FAULTS

    bound = next(c.bound for c in registry.get("BAT-KNEE").checks if c.q == "gain_before_on_book_curve")
    assert knee.gain_before_on_book_curve(16, 1.09) == bound == 1.9
    with FAULTS["knee-gain-before-over-two-doublings"].activate():
        assert knee.gain_before_on_book_curve(16, 1.09) == pytest.approx(1.9**2) and 1.9**2 > _bound("BAT-KNEE", "gain_before_knee", "<=")


def test_the_byte_floors_hold_on_the_real_layouts_and_their_fault_undercounts_below_them():
    """Q-BYTES-SPEED's floors on a two-layer twin: the int8 and int4 kernels' streamed bytes over the bf16 model's lie
    between the floors and the upper bounds; the fault that counts 8-bit tensors as packed nibbles puts them below the
    floors while the upper bounds still pass (the other side is what sees it)."""
    from cheapinfer.chapter.quantization import lowbit
    from cheapinfer.faults import catalogue  # noqa: F401  (registers the faults)
    from cheapinfer.faults.core import FAULTS
    from cheapinfer.runtime import models, roofline

    twin = models.twin("bf16", num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)
    low = {n: lowbit.variant(twin.model, n, random_codes=True) for n in ("int8", "int4")}

    def ratios():
        base = roofline.streamed_bytes(twin.model)
        return {n: roofline.streamed_bytes(m) / base for n, m in low.items()}

    floor = {"int8": _bound("Q-BYTES-SPEED", "bytes_ratio_8bit", ">="), "int4": _bound("Q-BYTES-SPEED", "bytes_ratio_4bit", ">=")}
    upper = {"int8": _bound("Q-BYTES-SPEED", "bytes_ratio_8bit", "<="), "int4": _bound("Q-BYTES-SPEED", "bytes_ratio_4bit", "<=")}
    assert all(floor[n] <= r <= upper[n] for n, r in ratios().items()), ratios()
    with FAULTS["roofline-int8-counted-as-nibbles"].activate():
        under = ratios()
    assert all(r < floor[n] for n, r in under.items()) and all(r <= upper[n] for n, r in under.items()), under
