"""The real low-bit kernels compute what the suite's own quantizers describe."""

import copy

import pytest
import torch

from cheapinfer import corpus, evaluation, lowbit, quant

PPL_TOKENS = 256  # one window: a few hundred corpus tokens keep this test at seconds
#: |real / fake - 1| for the perplexity. Both models run bf16 activations and hold the same int8
#: codes; they differ only in where bf16 rounding falls (the fake model's dequantized weights,
#: the kernel's scales: at most 2^-9 relative each, of either sign), which is smaller than the
#: int8 rounding itself (up to half a step, 2^-8 of a row's largest weight). A copy left
#: unquantized misses by the int8 scheme's own gap to the reference (1.5% on these tokens).
PPL_TOL = 0.005


@pytest.mark.parametrize("scheme", ["int8-row", "int4-g128"])
def test_kernel_layer_equals_the_suites_dequantized_weight(scheme):
    """One layer: the kernel's output equals x @ fake_quantize(W)^T (fp32 activations: same numbers, other summation order)."""
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(256, 96, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(96, 256, generator=g) * 0.05)
    layer = (lowbit.Int8Linear if scheme == "int8-row" else lowbit.Int4Linear).from_linear(lin, torch.float32)
    x = torch.randn(3, 5, 256, generator=g)  # [B, T, in]
    want = x @ quant.fake_quantize(lin.weight.detach(), scheme).T + lin.bias.detach()
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)


def test_int8_kernel_gives_the_perplexity_of_the_suites_fake_quantized_int8(stand_in, corpus_text, quantized_variant):
    """The stand-in's projections as int8-row codes through torch's int8 kernel: the perplexity of the suite's fake-quantized int8-row."""
    ids = corpus.held_out_ids(stand_in.tokenizer, corpus_text, PPL_TOKENS)
    fake = copy.deepcopy(quantized_variant(stand_in, "int8-row")).to(torch.bfloat16)  # the EVAL table's own variant, cast on a copy
    real = lowbit.variant(stand_in.model, "int8", projections_only=True, act_dtype=torch.bfloat16)
    assert sum(isinstance(m, lowbit.Int8Linear) for m in real.modules()) == len(quant.projection_weights(stand_in.model))
    with torch.inference_mode():
        p_fake, p_real = evaluation.perplexity(fake, ids, PPL_TOKENS), evaluation.perplexity(real, ids, PPL_TOKENS)
    assert abs(p_real / p_fake - 1) < PPL_TOL, f"perplexity {p_real:.4f} with the int8 kernel, {p_fake:.4f} fake-quantized (tolerance {PPL_TOL:.1%})"
    assert next(stand_in.model.parameters()).dtype == torch.float32  # the session's stand-in is untouched
