"""The rounding bounds every comparison of two numeric paths takes its tolerance from (cheapinfer.runtime.rounding)."""

import pytest
import torch
import torch.nn.functional as F

from cheapinfer.runtime import rounding


def test_unit_roundoff_of_the_formats():
    assert rounding.unit_roundoff(torch.float64) == 2.0**-53
    assert rounding.unit_roundoff(torch.float32) == 2.0**-24
    assert rounding.unit_roundoff(torch.float16) == 2.0**-11
    assert rounding.unit_roundoff(torch.bfloat16) == 2.0**-8  # 8 significant bits: 7 stored and the implicit one
    assert rounding.unit_roundoff(torch.int8) == 0.0


def test_gamma_is_n_u_over_1_minus_n_u_and_refuses_n_u_from_1():
    u = 2.0**-24
    assert rounding.gamma(1000, u) == 1000 * u / (1 - 1000 * u)  # the same expression: the same bits
    with pytest.raises(ValueError, match="bound nothing"):
        rounding.gamma(256, 2.0**-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda d: f"dtype={str(d)[6:]}")
def test_dot_bound_holds_for_every_summation_order(dtype):
    """Sums in the format itself, left to right, right to left, pairwise and by torch's kernel: all within the bound."""
    g = torch.Generator().manual_seed(0)
    n = 64 if dtype != torch.float32 else 1024  # gamma_n needs n u < 1: 64 x 2^-8 = 0.25
    x, w = torch.randn(8, n, generator=g).to(dtype), torch.randn(16, n, generator=g).to(dtype)
    exact = x.double() @ w.double().T
    bound = rounding.dot_bound(x, w, rounding.unit_roundoff(dtype))
    products = x[:, None, :] * w[None, :, :]  # [8, 16, n], each rounded once

    def pairwise(t):
        while t.shape[-1] > 1:
            t = t[..., 0::2] + t[..., 1::2]
        return t[..., 0]

    def sequential(t):
        s = t[..., 0]
        for i in range(1, t.shape[-1]):
            s = s + t[..., i]
        return s

    for got in (sequential(products), sequential(products.flip(-1)), pairwise(products)):
        assert bool(((got.double() - exact).abs() <= bound).all())
    if dtype == torch.float32:
        assert bool(((x @ w.T).double() - exact).abs().le(bound).all())
        assert not bool(((x @ (w * (1 + 1e-3)).T).double() - exact).abs().le(bound).all())  # a 1e-3 change is far outside


def _tiny(arch: str, seed: int = 0):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    torch.manual_seed(seed)
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              max_position_embeddings=256)
    config = LlamaConfig(**kw) if arch == "llama" else Qwen2Config(**kw)  # Qwen2's q, k, v have biases
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval().requires_grad_(False)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_first_order_bound_covers_an_fp32_forward(arch):
    """The float32 model's mean log-likelihood and a logit gap lie within the bounds of the float64 value."""
    model = _tiny(arch)
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(1))
    model64 = rounding.float64_copy(model)
    with torch.inference_mode():
        z32 = model(input_ids=ids, use_cache=False).logits.double()
    fp32, fp16 = rounding.Precision.of(torch.float32), rounding.Precision.of(torch.float16)
    for f in (lambda z: F.cross_entropy(z[0, :-1], ids[0, 1:]), lambda z: z[0, -1, 3] - z[0, -1, 7]):
        b = rounding.first_order_bound(model64, ids, f, fp32)
        assert abs(float(f(z32)) - b.value) <= b.probable <= b.worst
        assert set(b.parts) == {"matrix products", "norms", "attention", "activation"}
        assert rounding.first_order_bound(model64, ids, f, fp16).probable > 100 * b.probable  # 2^13 coarser


def test_compare_greedy_allows_a_flip_only_at_a_near_tie():
    model = _tiny("llama")
    prompt = [5, 9, 2, 44]
    with torch.inference_mode():
        z = model(input_ids=torch.tensor([prompt + [7, 7]]), use_cache=False).logits[0]
    want = [7, 7, int(z[-1].argmax())]  # a continuation; only its last token is the model's own choice
    assert rounding.compare_greedy(model, prompt, want, want).agree
    with torch.inference_mode():  # a caller's inference mode does not keep the bound from differentiating
        assert not rounding.compare_greedy(model, prompt, want, want[:2] + [int(z[-1].topk(2).indices[1])]).agree
    runner_up = int(z[-1].topk(2).indices[1])
    other = want[:2] + [runner_up]
    far = rounding.compare_greedy(model, prompt, want, other)
    assert far.position == 2 and far.tokens == (want[2], runner_up) and not far.near_tie and not far.agree
    assert abs(far.gap - float(z[-1, want[2]] - z[-1, runner_up])) <= far.bound  # the fp32 gap, within its rounding bound of the float64 one
    coarse = rounding.compare_greedy(model, prompt, want, other, rounding.Precision(0.25, 2.0**-24))  # activations stored so coarsely the gap is within it
    assert coarse.near_tie and coarse.agree and "near-tie" in coarse.describe()
