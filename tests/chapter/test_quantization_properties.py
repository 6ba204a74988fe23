"""Properties of the quantization section's code that are not claims of the book: the quantizer's half step, the
quantized copy."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from cheapinfer import testing
from cheapinfer.chapter.quantization import quant


def test_quantized_copy_replaces_only_the_projection_matrices(stand_in, quantized_stand_in):
    """The shared quantized variants: projections fake-quantized, everything else and the original untouched."""
    variant = quantized_stand_in["int4-g128"].model
    assert quantized_stand_in["int4-g128"].model is variant  # built once
    original = dict(stand_in.model.named_parameters())
    projections = quant.projection_weights(stand_in.model)
    assert len(projections) == 7 * stand_in.config.num_hidden_layers
    names = list(projections)
    recomputed = set(names[:: max(1, len(names) // 3)])  # quantized again: a few matrices, first to last
    for name, p in variant.named_parameters():
        if name in projections:
            assert not torch.equal(p, original[name]), name
            if name in recomputed:
                assert torch.equal(p, quant.fake_quantize(original[name], "int4-g128")), name
        else:
            assert torch.equal(p, original[name]), name
    assert not variant.training and not any(p.requires_grad for p in variant.parameters())


@given(w=testing.weights, scheme=st.sampled_from(testing.INT_SCHEMES + ("nf4", "nf4-g16")))
def test_the_suites_quantizer_stays_within_half_a_step(w, scheme):
    """The suite's own quantizer (fp16 scales, rows, groups, packed codes): half a step, idempotent,
    sign-symmetric, codes in range, all-zero groups stay zero; unpacked fake quantization equals it."""
    w = torch.from_numpy(w)  # [out, in]
    q = quant.quantize(w, scheme)
    w_hat = q.dequantize()
    assert torch.equal(quant.fake_quantize(w, scheme), w_hat)
    assert torch.equal(quant.fake_quantize(w_hat, scheme), w_hat)
    if q.scheme.kind == "int":
        codes = q.unpacked_codes()[:, : w.shape[1]].to(torch.int32)
        assert bool(((codes >= -q.scheme.qmax - 1) & (codes <= q.scheme.qmax)).all())
        scale = q.element_scales()  # [out, in]
        unclamped = (w.abs() <= (q.scheme.qmax + 0.5) * scale) & (scale > 0)
        ratio = ((w - w_hat).abs() / (scale / 2))[unclamped]
        assert not ratio.numel() or float(ratio.max()) <= 1.0001
        assert bool(((w - w_hat)[scale == 0] == 0).all())  # an all-zero group stays zero
        assert torch.equal(quant.fake_quantize(-w, scheme), -w_hat)  # NF4's levels are not symmetric
