"""The suite's own quantizers cross-checked against bitsandbytes' kernels.

:func:`bitsandbytes_copy` gives a copy of a model with every projection matrix (the ones
``quant.quantized_copy`` quantizes) replaced by a bitsandbytes layer:

- ``nf4``: ``bnb.nn.Linear4bit`` (NF4, blocks of 64, fp32 absmax without double quantization,
  computing in the model's dtype): the suite's ``nf4`` row, whose absmax is stored in fp16;
- ``int8``: ``bnb.nn.Linear8bitLt`` (LLM.int8(): int8 weights with one absmax per output row,
  activations quantized per token, columns with an activation above ``threshold`` kept in 16 bits):
  the suite's ``int8-row`` row, which quantizes the weights only.

Embeddings, the LM head and the norms stay as they are in both. On a GPU these run bitsandbytes'
CUDA kernels; on a CPU, its CPU fallback (slow). Not always the same arithmetic: on a CPU with
AVX-512 BF16, an NF4 layer in eval mode (as :func:`bitsandbytes_copy` returns it) repacks itself
for a bf16 kernel on its first forward, its absmax rounded to bf16 (2^-8 relative), while in
training mode it dequantizes to the compute dtype as on CUDA; LLM.int8() on a CPU in training
mode dequantizes the weight instead of coding the activations. ``tests/test_gpu.py`` states which
mode each check runs in; its tolerances are derived from the arithmetic of that path.
"""

from __future__ import annotations

import copy

import torch

from .quant import projection_weights

#: bitsandbytes layer per suite scheme it is compared with.
SUITE_SCHEME = {"nf4": "nf4", "int8": "int8-row"}
#: LLM.int8()'s default outlier threshold (bitsandbytes' and transformers' default).
INT8_THRESHOLD = 6.0


def _bitsandbytes_linear(linear: torch.nn.Linear, kind: str, device: torch.device) -> torch.nn.Module:
    import bitsandbytes as bnb

    bias = linear.bias is not None
    w = linear.weight.data.detach().to("cpu", torch.float32)  # bitsandbytes quantizes when the layer moves to its device
    if kind == "nf4":
        layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=bias, compute_dtype=linear.weight.dtype,
                                  compress_statistics=False, quant_type="nf4", device="meta")
        layer.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4", compress_statistics=False, blocksize=64)
    elif kind == "int8":
        layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=bias, has_fp16_weights=False,
                                    threshold=INT8_THRESHOLD, device="meta")
        layer.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    else:
        raise ValueError(f"kind must be one of {tuple(SUITE_SCHEME)}, not {kind!r}")
    if bias:
        layer.bias = torch.nn.Parameter(linear.bias.data.detach().to("cpu"), requires_grad=False)
    return layer.to(device)


@torch.no_grad()
def bitsandbytes_copy(model, kind: str):
    """A deep copy of ``model`` whose projection matrices are bitsandbytes ``kind`` layers (``nf4`` | ``int8``)."""
    device = next(model.parameters()).device
    clone = copy.deepcopy(model)
    for weight_name in list(projection_weights(clone)):
        name = weight_name.removesuffix(".weight")
        parent_name, _, child = name.rpartition(".")
        setattr(clone.get_submodule(parent_name), child, _bitsandbytes_linear(clone.get_submodule(name), kind, device))
    return clone.eval().requires_grad_(False)
