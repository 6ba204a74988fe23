"""`pytest -m gpu`: which claims it selects, what it does without CUDA, the prepared command for a GPU
box, and the bitsandbytes cross-check that runs only on a GPU."""

from __future__ import annotations

import ast
import contextlib
import copy
import json
import math
from pathlib import Path

import pytest
import torch
from test_inputs import _pytest  # pytest puts tests/ on the path

from cheapinfer.chapter.quantization import crosscheck, quant
from cheapinfer.harness import merge, registry
from cheapinfer.runtime import profiles, rounding

ROOT = Path(__file__).resolve().parent.parent
#: Fixtures that put a model on the run's device: a test that asks for one measures there.
MODEL_FIXTURES = {"twin", "twin_factory", "stand_in", "book_model", "quantized_stand_in", "quantized_variant",
                  "evaluation_table", "residual_streams", "reference_continuations", "speculative_runs", "error_tables"}
NO_CUDA = "this machine has CUDA: the gpu selection runs here"


def _claim_tests() -> list[tuple[str, str, list[str], set[str]]]:
    """(test name, claim ID, profiles of its @on_profiles or [], argument names) of every claim test."""
    out = []
    for path in sorted((ROOT / "claims").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            claim_id, profiles = None, []
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "claim":
                    claim_id = dec.args[0].value
                if isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "on_profiles":
                    profiles = [a.value for a in dec.args]
            if claim_id:
                out.append((node.name, claim_id, profiles, {a.arg for a in node.args.args}))
    return out


def test_device_dependent_is_a_model_profile():
    assert profiles.device_dependent(["twin"]) and profiles.device_dependent(["arithmetic", "stand-in"])
    assert not profiles.device_dependent(["arithmetic"]) and not profiles.device_dependent([])


def test_every_claim_test_that_runs_a_model_or_a_clock_is_device_dependent():
    """The selection follows the registry's runs_on; this keeps runs_on honest about what each test runs:
    a test that asks for a model or the timer is device-dependent, and a device-dependent one touches the device."""
    claims = registry.load()
    tests = _claim_tests()
    assert len({cid for _, cid, _, _ in tests}) == len(claims)
    for name, cid, on, args in tests:
        dependent = profiles.device_dependent(on or claims[cid].runs_on)
        measures_there = bool(args & (MODEL_FIXTURES | {"timed"})) or any(p in profiles.MODEL_PROFILES for p in on)
        assert dependent or not measures_there, f"{name} ({cid}) runs a model or a clock, but its runs_on {claims[cid].runs_on} has no model profile"
        assert measures_there or "device" in args or not dependent, f"{name} ({cid}) is device-dependent by runs_on {claims[cid].runs_on} but never touches the device"


def test_gpu_selection_is_every_device_dependent_claim(pytester, tmp_path):
    run = _pytest(pytester, "claims", "-m", "gpu", "--collect-only", "-q", tmp_path=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    selected = {line.split("::")[1].split("[")[0] for line in run.stdout.splitlines() if line.startswith("claims/")}
    claims = registry.load()
    expected = {name for name, cid, on, _ in _claim_tests() if profiles.device_dependent(on or claims[cid].runs_on)}
    assert selected == expected


def test_gpu_selection_runs_on_the_cpu_when_asked_by_name(pytester, tmp_path):
    if torch.cuda.is_available():
        pytest.skip(NO_CUDA)
    run = _pytest(pytester, "claims/test_asides.py", "-m", "gpu", "--device", "cpu", "-q", tmp_path=tmp_path)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["claims"]["FLASH-NO-SCORES"]["results"][0]["device"] == "cpu"


def test_verify_on_cuda_without_cuda_is_one_line_and_exit_2(capsys):
    if torch.cuda.is_available():
        pytest.skip(NO_CUDA)
    from cheapinfer import cli

    assert cli.main(["verify", "--device", "cuda:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cheapinfer verify: --device cuda:1") and "sees no CUDA device" in err[0]


def test_merge_labels_two_gpus_apart():
    record = json.loads((ROOT / "tests" / "data" / "run-record.json").read_text())
    records = []
    for gpu in ("NVIDIA H200", "NVIDIA A100-SXM4-80GB"):
        rec = copy.deepcopy(record)
        rec["environment"] |= {"gpu": gpu, "driver": "570.0", "cuda": "12.8"}
        records.append(rec)
    labels = [m["label"] for m in merge.merge(records, ["a", "b"])["machines"]]
    assert labels[0].startswith("NVIDIA H200 (") and labels[1].startswith("NVIDIA A100-SXM4-80GB (")
    text = merge.merge_markdown(records, ["a", "b"])
    assert all(label in text for label in labels)


# ------------------------------------------------------------------------------------------------
# bitsandbytes: layer by layer on any device, perplexity of the EVAL rows on a GPU
# ------------------------------------------------------------------------------------------------
# Every tolerance below is derived from the arithmetic each path does (cheapinfer.runtime.rounding), never
# from one device's result: NF4 holds the suite's own weights exactly, so only the summation order
# differs; LLM.int8() also rounds its activations to int8, half a step each, which is bounded too.

U32, U16 = rounding.unit_roundoff(torch.float32), rounding.unit_roundoff(torch.float16)  # 2^-24, 2^-11
#: bitsandbytes multiplies the int32 sum by a float constant for 1/127^2 (6.200124e-05 in its default
#: kernels: 1.8e-5 relative off); 2e-5 is assumed to cover its CUDA kernel's constant too.
DEQUANT_CONST_ERR = 2e-5


def _linear(out_features: int = 128, in_features: int = 256) -> torch.nn.Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(in_features, out_features, bias=False)
    layer.weight.data *= torch.exp(torch.randn(out_features, 1))  # rows of different magnitude
    return layer


def _nf4_weight(layer) -> torch.Tensor:
    """The weight a bitsandbytes ``Linear4bit`` computes with: its codes dequantized (fp32)."""
    import bitsandbytes.functional as bnbf

    return bnbf.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()


def _near_half(q: torch.Tensor, slack: float) -> torch.Tensor:
    """Where ``q`` lies within ``slack`` of a half-integer (a tie, or one that another rounding of q may put on either side)."""
    return ((q.abs() - q.abs().floor()) - 0.5).abs() <= slack


def _int8_codes_agree(layer, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bitsandbytes' per-row int8 of ``w`` against the suite's ``int8-row`` of the same fp16-rounded weight, fp32 scales.

    bitsandbytes rounds the weight to fp16 (exact), takes each row's absmax (exact) as SCB and
    codes round(w * (127 / SCB)) in fp32; the suite codes round(w / fl(SCB / 127)). The scales are
    then the same fp32 division of the same numbers: equal bitwise. Each quotient is within 3
    roundings (3 x 2^-24 relative, at most 127 x 3 x 2^-24 = 2.3e-5 absolute) of the exact one,
    so the two codes can differ only where the quotient is within twice that of a half-integer,
    and there by one level. Returns (the suite's codes, its scales).
    """
    w16 = w.detach().to(torch.float16).float()
    ours = quant.quantize(w16.cpu(), "int8-row", scale_dtype=torch.float32)
    scb = layer.weight.SCB.float().cpu()
    assert torch.equal(scb / 127, ours.scales.flatten()), "SCB / 127 is not the suite's fp32 scale"
    codes = layer.weight.CB if layer.weight.CB is not None else layer.weight.data
    diff = codes.cpu().to(torch.int16) - ours.codes.to(torch.int16)
    assert int(diff.abs().max()) <= 1, "codes differ by more than one level"
    q = w16.cpu() / ours.scales
    assert bool(_near_half(q, 2 * 127 * 3 * U32)[diff != 0].all()), "codes differ away from a rounding tie"
    return ours.codes, ours.scales


def _llm_int8_bound(x: torch.Tensor, w_hat: torch.Tensor, threshold: float = crosscheck.INT8_THRESHOLD) -> torch.Tensor:
    """A-priori bound (float64, ``[..., out]``) of |LLM.int8(x) W^T - x W_hat^T|.

    ``W_hat`` = codes x SCB / 127 exactly. LLM.int8() casts x to fp16 (u16 |x| per element), sets
    aside as outliers the columns holding an element >= threshold (computed in x's dtype), and
    codes the rest round(x16 x 127 / absmax) with absmax over the row's elements below threshold:
    a step s <= min(threshold, max |x16|) / 127 whatever the columns are, so every input is off by
    at most s / 2 (and 2 x 127 x 2^-24 of s for the quotient's roundings). The int32 sum is exact
    (or fp32 on a fallback: gamma_n(2^-24) of the magnitude); dequantization multiplies by two
    scales and a constant for 1/127^2 (3 roundings, DEQUANT_CONST_ERR) and may store in fp16 (u16);
    the outliers' fp32 product is within the same gamma_n.
    """
    x, w = x.double(), w_hat.double()
    n = x.shape[-1]
    aw = w.abs()
    s = x.to(torch.float16).double().abs().amax(-1, keepdim=True).clamp(max=threshold) / 127  # [..., 1]
    half = (s / 2) * (1 + 2 * 127 * U32)
    m = x.abs() @ aw.T  # [..., out]
    q = half * aw.sum(-1)  # every input off by half a step
    mq = m + q
    return q + U16 * m + (rounding.gamma(n + 4, U32) + DEQUANT_CONST_ERR + U16) * mq


def test_bitsandbytes_nf4_layer_computes_with_the_suites_nf4_weights():
    """bitsandbytes' NF4 (blocks of 64, fp32 absmax) holds the suite's nf4-g64 with fp32 scales exactly, and its product is within gamma_n.

    Weights: the same code times the same fp32 absmax is one rounding of the same product: equal
    bitwise. Output: the same x W_hat^T in another summation order, within gamma_n(2^-24) |x||W_hat|^T
    of float64 (the compute dtype is the layer's, fp32). A code off by one level moves an output
    by about |x_j| 0.1 absmax, 1e3 times that bound.
    """
    layer = _linear()
    # as built (training mode): dequantize, then an fp32 product, as on CUDA. In eval mode a CPU with
    # AVX-512 BF16 repacks the layer for a bf16 kernel with its absmax rounded to bf16 (2^-8): another arithmetic.
    theirs = crosscheck._bitsandbytes_linear(layer, "nf4", torch.device("cpu"))
    w_hat = quant.fake_quantize(layer.weight.data, "nf4-g64", scale_dtype=torch.float32)
    assert torch.equal(_nf4_weight(theirs), w_hat)
    x = torch.randn(4, 256)
    err = (theirs(x).double() - x.double() @ w_hat.double().T).abs()
    assert bool((err <= rounding.dot_bound(x, w_hat, U32)).all())


def test_bitsandbytes_int8_layer_stores_the_suites_per_row_codes():
    """bitsandbytes' Int8Params: SCB / 127 is the suite's fp32 scale of the fp16-rounded weight, bitwise; codes differ only at rounding ties, by one level."""
    layer = _linear()
    theirs = crosscheck._bitsandbytes_linear(layer, "int8", torch.device("cpu"))
    _int8_codes_agree(theirs, layer.weight.data)


def test_bitsandbytes_int8_layer_computes_llm_int8_of_its_codes():
    """LLM.int8() with outlier columns: each output within the derived bound of x W_hat^T (W_hat its own codes times SCB / 127).

    Two inputs hold an outlier (600 > 6.0): their columns go the fp32 way; the rest is coded per
    row at half a step. If the outliers were coded with the rest, those rows' step would be 600/127
    instead of <= 6/127, and their error a hundred times the bound's.
    """
    layer = _linear()
    theirs = crosscheck._bitsandbytes_linear(layer, "int8", torch.device("cpu")).eval()  # in training mode a CPU dequantizes the weight instead
    w_hat = theirs.weight.CB.double() * theirs.weight.SCB.double()[:, None] / 127
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(1))
    x[1, 3], x[4, 200] = 600.0, -600.0  # outlier features of LLMs reach hundreds (OUT-DIM62: 1,579.6)
    err = (theirs(x.clone()).double() - x.double() @ w_hat.T).abs()
    b = _llm_int8_bound(x, w_hat)
    assert bool((err <= b).all()), f"error {float((err / b).max()):.3g} x its bound"


@contextlib.contextmanager
def _ieee_fp32():
    """fp32 matrix products as IEEE fp32 (no TF32) and attention by its math kernel: the arithmetic the bounds assume."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.set_float32_matmul_precision(before)


def _nll64(model, windows: torch.Tensor) -> float:
    """Mean negative log-likelihood of every window's next tokens (``windows`` [W, L + 1]), from the logits summed in float64."""
    with torch.inference_mode():
        logits = model(input_ids=windows[:, :-1], use_cache=False).logits  # [W, L, V]
    return float(torch.nn.functional.cross_entropy(logits.double().flatten(0, 1), windows[:, 1:].flatten()))


def _with_weights(model, weights: dict[str, torch.Tensor]):
    """A copy of ``model`` whose projections hold ``weights`` (by parameter name), cast to the model's dtype."""
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in quant.projection_weights(clone).items():
            p.copy_(weights[name].to(p.dtype))
    return clone.eval()


class _LlmInt8Check:
    """Forward hooks on a model's bitsandbytes ``Linear8bitLt`` layers: every ``ROW_STEP``-th row of each
    output within :func:`_llm_int8_bound` of x W_hat^T (W_hat the layer's codes times SCB / 127), in float64."""

    ROW_STEP = 16

    def __init__(self, model):
        import bitsandbytes as bnb

        self.worst, self.checked = 0.0, 0
        self.handles = [m.register_forward_hook(self._check) for m in model.modules() if isinstance(m, bnb.nn.Linear8bitLt)]

    def _check(self, module, args, out):
        x = args[0].reshape(-1, args[0].shape[-1])[:: self.ROW_STEP]
        y = out.reshape(-1, out.shape[-1])[:: self.ROW_STEP]
        w_hat = module.state.CB.double() * module.state.SCB.double()[:, None] / 127
        b = _llm_int8_bound(x, w_hat)
        self.worst = max(self.worst, float(((y.double() - x.double() @ w_hat.T).abs() / b).max()))
        self.checked += 1

    def close(self):
        for h in self.handles:
            h.remove()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_bitsandbytes_on_the_gpu_gives_the_suites_perplexity(kind, stand_in, quantized_stand_in, corpus_text, record_property):
    """A bitsandbytes copy of the stand-in against the suite's quantization of the same weights, on the GPU.

    Every projection's stored weights are checked first: ``nf4``, dequantized, equal bitwise the
    suite's nf4-g64 with fp32 scales; ``int8``, SCB / 127 the suite's fp32 scale of the fp16-rounded
    weight bitwise, codes equal but at rounding ties (:func:`_int8_codes_agree`). Both models run
    in fp32 with IEEE products (no TF32) and the math attention kernel.

    ``nf4``: the two models hold the same numbers and differ only in summation order, so each mean
    log-likelihood is within B of the exact one, B the first-order probable bound of fp32 rounding
    (:func:`cheapinfer.runtime.rounding.first_order_bound`, one more rounding per projection for the
    dequantization), and |ln ppl_bnb - ln ppl_suite| <= 2B. A wrong block size, codebook or absmax
    fails the weight check; a kernel computing in 16 bits moves the perplexity by far more than 2B.

    ``int8``: LLM.int8() also codes every activation to int8 per token, half a step each. That noise
    is the algorithm, not rounding, and its bound for the perplexity (the same first-order analysis)
    is ten times the shift it causes; so the verdict is taken per projection, inside the model's
    forward on these tokens: every output within the a-priori bound of LLM.int8()'s arithmetic
    (:func:`_llm_int8_bound`). The perplexity against the same weights' is reported. Both report
    the ratio to the EVAL row of the same scheme (fp16 scales): its weights are not the ones
    bitsandbytes holds.
    """
    from cheapinfer.chapter.evaluation import perplexity
    from cheapinfer.runtime import corpus, models

    if kind == "int8" and models.llm_int8_unavailable(stand_in.device):
        pytest.skip(models.llm_int8_unavailable(stand_in.device))  # not run, with the reason: a card below sm75
    ids = corpus.held_out_ids(stand_in.tokenizer, corpus_text)
    windows = torch.stack([ids[s : s + perplexity.WINDOW + 1] for s in range(0, ids.numel() - 1, perplexity.WINDOW)]).to(stand_in.device)
    weights = quant.projection_weights(stand_in.model)
    theirs = crosscheck.bitsandbytes_copy(stand_in.model, kind)
    reference = {}
    for name, w in weights.items():
        layer = theirs.get_submodule(name.removesuffix(".weight"))
        if kind == "nf4":
            reference[name] = quant.fake_quantize(w, "nf4-g64", scale_dtype=torch.float32)
            assert torch.equal(_nf4_weight(layer), reference[name]), name
        else:
            codes, scales = _int8_codes_agree(layer, w)
            reference[name] = (codes.float() * scales).to(w.device)
    suite = _with_weights(stand_in.model, reference)
    check = _LlmInt8Check(theirs) if kind == "int8" else None
    try:
        with _ieee_fp32():
            nll_theirs, nll_suite = _nll64(theirs, windows), _nll64(suite, windows)
            eval_row = perplexity.perplexity(quantized_stand_in[crosscheck.SUITE_SCHEME[kind]].model, ids)
            bound = None
            if kind == "nf4":
                bound = rounding.first_order_bound(rounding.float64_copy(suite), windows[:, :-1],
                                                   lambda z: torch.nn.functional.cross_entropy(z.flatten(0, 1), windows[:, 1:].flatten()),
                                                   rounding.Precision.of(torch.float32, product_roundings=1))
    finally:
        if check:
            check.close()
    del theirs, suite
    record_property(f"bitsandbytes {kind} perplexity / the suite's EVAL row {crosscheck.SUITE_SCHEME[kind]} (fp16 scales) - 1", math.exp(nll_theirs) / eval_row - 1)
    record_property("|ln ratio| of bitsandbytes to the suite's quantization of the same weights", abs(nll_theirs - nll_suite))
    if kind == "int8":
        assert check.checked == len(weights) and check.worst <= 1, f"LLM.int8(): a projection's error is {check.worst:.3g} x its a-priori bound"
        return
    record_property("2B, its first-order bound", 2 * bound.probable)
    assert abs(nll_theirs - nll_suite) <= 2 * bound.probable, (
        f"bitsandbytes nf4: perplexity {math.exp(nll_theirs):.4f}, the suite's quantization of the same weights: {math.exp(nll_suite):.4f}; "
        f"|ln ratio| {abs(nll_theirs - nll_suite):.3g} > 2 x its first-order bound {bound.probable:.3g} (parts: {bound.parts})"
    )
