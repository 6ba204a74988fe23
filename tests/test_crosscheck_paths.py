"""A cross-check runs on the same path as the number it guards (issue 43).

Every check the registry declares a cross-check (``reads`` names the measured path, ``guards`` the quantities it vouches
for) is run here through its claim's own measurement on a tiny input, with the named function wrapped at its module:
the path must be called, and the check and every guarded quantity must move when the path's results are perturbed.
A check computed on another path (a quantizer property checked on a fresh quantizer call beside the error table it
vouches for) does not move, and fails. No model is loaded.
"""

import pytest
import torch

from cheapinfer.chapter.quantization import quant, quant_error
from cheapinfer.faults.core import activate
from cheapinfer.harness import registry
from cheapinfer.runtime import provenance


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(8, 256, generator=g) * 0.02, torch.randn(16, 384, generator=g) * 0.02
    a[3, 17] = 0.9  # a heavy weight: INT4 per tensor collapses on its matrix
    return {"model.layers.0.mlp.down_proj.weight": a, "model.layers.0.self_attn.q_proj.weight": b}


def _matrix() -> torch.Tensor:
    w = torch.randn(64, 512, generator=torch.Generator().manual_seed(8), dtype=torch.float64) * 0.02
    w[0, :3] = torch.tensor([0.5, -0.4, 0.3], dtype=torch.float64)
    return w


#: Each claim with a cross-check: its measurement (the package function its claim test calls) on a tiny input.
MEASUREMENTS = {
    "Q-ERROR-TABLE": lambda: quant_error.table_values(_weights()),
    "Q-ROW-3.4": lambda: quant_error.scale_ratios(_weights()),
    "Q-NF4": lambda: quant_error.nf4_values(_weights()),
    "Q-DOWNPROJ-STATS": lambda: quant_error.tail_values(_matrix()),
}


def _cross_checks() -> list[tuple[str, registry.Check]]:
    return [(cid, c) for cid, claim in registry.load().items() for c in claim.checks if c.reads]


def test_every_cross_check_has_its_claims_measurement_here_and_names_a_function():
    declared = {cid for cid, _ in _cross_checks()}
    assert declared == set(MEASUREMENTS), "a claim with a cross-check needs its measurement in MEASUREMENTS (and only those)"
    for cid, check in _cross_checks():
        assert callable(provenance.resolve(check.reads)[2]), (cid, check.q)


@pytest.mark.parametrize("claim_id, check", _cross_checks(), ids=lambda v: v if isinstance(v, str) else v.q)
def test_a_cross_check_and_the_quantities_it_guards_come_from_the_path_it_names(claim_id, check):
    names = (check.q, *check.guards)
    read = provenance.reads(MEASUREMENTS[claim_id], check.reads, names)
    assert all(read.values()), f"{claim_id}: not read off {check.reads}: {[n for n, ok in read.items() if not ok]}"


def test_a_cross_check_on_a_fresh_quantizer_call_beside_the_table_is_found():
    """The catalogue's fault: the absmax property checked on a fresh quantizer call, not on the table's output."""
    with activate("q-absmax-kept-beside-the-table"):
        read = provenance.reads(MEASUREMENTS["Q-ROW-3.4"], "cheapinfer.chapter.quantization.quant_error.error_table",
                                ("row_absmax_kept", "g128_absmax_kept", "tensor_over_row"))
    assert read == {"row_absmax_kept": False, "g128_absmax_kept": False, "tensor_over_row": True}


def test_the_claims_own_read_off_check_fails_under_that_fault():
    weights = _weights()
    names = [n for c in registry.get("Q-ROW-3.4").checks if c.reads for n in (c.q, *c.guards)]
    assert all(provenance.moved(lambda t: quant_error.scale_ratios(weights, t), quant_error.error_table, names).values())
    with activate("q-absmax-kept-beside-the-table"):
        assert not all(provenance.moved(lambda t: quant_error.scale_ratios(weights, t), quant_error.error_table, names).values())


def test_the_table_keeps_every_rows_absmax_and_a_transposed_scale_does_not():
    """What the cross-check measures, read off the table: 1 on correct code; a reconstruction whose row scales come
    from the other axis loses row maxima, which the ratios alone barely show."""
    weights = _weights()
    (row,) = quant_error.error_table(weights, ("int4-row",))
    assert set(row.kept.values()) == {1.0}
    w = next(iter(weights.values()))
    scale = w.abs().amax(dim=1, keepdim=True).roll(1, 0) / 7  # each row scaled by its neighbour's absmax
    wrong = scale * torch.round(w / scale).clamp(-8, 7)
    assert quant.absmax_kept(w, wrong, "int4-row") < 1.0


def test_a_perturbation_moves_every_float_by_its_own_factor_and_keeps_names_counts_and_flags():
    from dataclasses import dataclass

    @dataclass
    class Row:
        name: str
        errors: dict
        count: int
        flag: bool

    row = Row("a", {"x": 1.0, "y": 1.0}, 3, True)
    shaken = provenance.perturbed([row, (2.0, torch.ones(3))])
    assert shaken[0].name == "a" and shaken[0].count == 3 and shaken[0].flag is True
    assert shaken[0].errors["x"] != shaken[0].errors["y"] and all(0.5 <= v < 0.9 for v in shaken[0].errors.values())
    assert shaken[1][0] != 2.0 and len(set(shaken[1][1].tolist())) == 3
    assert row.errors == {"x": 1.0, "y": 1.0}  # the original stays


@pytest.mark.parametrize("field, value, message", [
    ("reads", "os.system", "no dotted name of a function under cheapinfer.chapter"),
    ("reads", "cheapinfer.chapter.quantization.quant_error.error_table", "names both the path it reads"),
    ("guards", ["tensor_over_row"], "names both the path it reads"),
    ("draws", 99, "at least 100"),
    ("draws", True, "at least 100"),
    ("fault", "Q_ABSMAX", "must name one fault of the catalogue"),
    ("fault", ["q-absmax-clamp-dropped"], "must name one fault of the catalogue"),
])
def test_the_loader_refuses_a_cross_check_or_draws_it_cannot_use(field, value, message):
    check = {"q": "ratio", "kind": "shape", "op": ">", "bound": 1.0, "why": "a reason", field: value}
    with pytest.raises(registry.RegistryError, match=message):
        registry._check_from("X-1", check, {})


def test_the_loader_refuses_a_cross_check_guarding_no_check_of_its_claim():
    text = '''[X-1]
section = "quantization"
statement = "s"
runs_on = ["stand-in"]
checks = [
  { q = "kept", kind = "shape", op = ">=", bound = 1.0, reads = "cheapinfer.chapter.quantization.quant_error.error_table", guards = ["nothing"], why = "w" },
]
'''
    with pytest.raises(registry.RegistryError, match=r"guards \['nothing'\], which no check"):
        registry.parse(text)
