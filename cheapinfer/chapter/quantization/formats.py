"""What the quantization libraries store per weight, measured from their own objects.

The chapter counts bits per weight as codes plus a 16-bit scale per block (4 + 16/128 = 4.125 for
group-128, 4 + 16/64 = 4.25 for NF4). A library stores what its format says: bitsandbytes keeps NF4's
absmax in fp32, or in 8 bits with a second level when double quantization is on; GGUF's blocks hold
an fp16 scale per 32 weights; torch's int4 kernel (the one torchao's int4 path packs for) keeps a
bf16 scale and a bf16 zero per group; torchao's int8 weight-only keeps an fp32 scale and an int8 zero
per row. Each function here quantizes matrices of the given shapes with the library itself and counts
the bytes of what it holds, part by part. For bitsandbytes the bytes are also read from what its own
serialization writes (its state dict through safetensors), a second path to the same number.

Bytes depend on shapes only, so seeded random matrices stand in for the weights; each distinct shape
is quantized once and counted ``count`` times its multiplicity.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping

import torch


@dataclass(frozen=True)
class Stored:
    """The bytes a library holds for a set of matrices, by part, and the weights they hold."""

    library: str  # name and version
    layout: str  # the format, in words
    parts: Mapping[str, int]  # bytes per part (codes, scales, ...), over every matrix
    weights: int
    serialized: int | None = None  # bytes of the tensors the library's own serialization writes, where it has one
    book_bits: float | None = None  # the chapter's accounting for this format, where it gives one

    @property
    def nbytes(self) -> int:
        return sum(self.parts.values())

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / self.weights

    @property
    def serialized_bits_per_weight(self) -> float:
        return math.nan if self.serialized is None else 8 * self.serialized / self.weights


@dataclass(frozen=True)
class Unavailable:
    library: str
    layout: str
    reason: str
    book_bits: float | None = None


def _each_shape(shapes: Mapping[str, tuple[int, int]], count: int):
    """(matrix, copies) for each distinct shape: a seeded random fp32 matrix and how many of them there are."""
    g = torch.Generator().manual_seed(0)
    for shape, n in Counter(tuple(s) for s in shapes.values()).items():
        yield torch.randn(shape, generator=g), count * n


def _total(shapes, count, measure: Callable[[torch.Tensor], dict[str, int]]) -> tuple[dict[str, int], int]:
    parts: dict[str, int] = {}
    weights = 0
    for w, n in _each_shape(shapes, count):
        for part, b in measure(w).items():
            parts[part] = parts.get(part, 0) + n * b
        weights += n * w.numel()
    return parts, weights


def _version(module) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{module.__name__} {version(module.__name__)}"
    except PackageNotFoundError:
        return f"{module.__name__} {getattr(module, '__version__', '(version unknown)')}"


# ------------------------------------------------------------------------------------------------
# bitsandbytes NF4
# ------------------------------------------------------------------------------------------------


def _bnb_state(w: torch.Tensor, double_quant: bool):
    import bitsandbytes.functional as bf

    return bf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=double_quant)


def _bnb_parts(codes: torch.Tensor, qs) -> dict[str, int]:
    """The tensors a quantized weight and its QuantState hold: codes, absmax, code book, and the second level."""
    parts = {"codes": codes.nbytes, "absmax": qs.absmax.nbytes, "code book": qs.code.nbytes}
    if qs.state2 is not None:
        parts["absmax of absmax"] = qs.state2.absmax.nbytes + torch.as_tensor(qs.offset).nbytes
        parts["code book of absmax"] = qs.state2.code.nbytes
    return parts


def _bnb_serialized(codes: torch.Tensor, qs) -> int:
    """Bytes of tensor data in the safetensors file of the weight's state dict as bitsandbytes writes it
    (``Linear4bit``: the packed codes and ``QuantState.as_dict(packed=True)``)."""
    from safetensors.torch import save

    blob = save({"weight": codes, **{k: v.contiguous() for k, v in qs.as_dict(packed=True).items()}})
    header = int.from_bytes(blob[:8], "little")
    return len(blob) - 8 - header


def bnb_nf4(shapes: Mapping[str, tuple[int, int]], count: int = 1, double_quant: bool = False) -> Stored | Unavailable:
    """NF4 with block 64, as ``bitsandbytes.functional.quantize_4bit`` stores it (what ``Linear4bit`` and
    transformers' ``BitsAndBytesConfig`` load; ``double_quant``: ``bnb_4bit_use_double_quant``, QLoRA's setting)."""
    layout = "NF4, block 64, " + ("8-bit absmax, fp32 per 256 blocks (double quantization)" if double_quant else "fp32 absmax")
    try:
        import bitsandbytes
    except Exception as exc:  # noqa: BLE001 - any import failure makes the library unavailable, with its reason
        return Unavailable("bitsandbytes", layout, f"not importable: {type(exc).__name__}: {exc}", 4.25)
    parts: dict[str, int] = {}
    weights = written = 0
    for w, n in _each_shape(shapes, count):  # one quantization per shape, read both ways
        codes, qs = _bnb_state(w, double_quant)
        for part, b in _bnb_parts(codes, qs).items():
            parts[part] = parts.get(part, 0) + n * b
        written += n * _bnb_serialized(codes, qs)
        weights += n * w.numel()
    return Stored(_version(bitsandbytes), layout, parts, weights, written, 4.25)


# ------------------------------------------------------------------------------------------------
# GGUF, torch's int4 kernel, torchao int8
# ------------------------------------------------------------------------------------------------


def gguf_blocks(shapes: Mapping[str, tuple[int, int]], count: int = 1, qtype: str = "Q4_0") -> Stored | Unavailable:
    """A GGUF block type (``Q4_0``, ``Q8_0``) as ``gguf.quants.quantize`` writes it; ``serialized``: the bytes
    the format's own block table (``GGML_QUANT_SIZES``: weights per block, bytes per block) gives for them."""
    try:
        import gguf
        from gguf import quants
    except Exception as exc:  # noqa: BLE001
        return Unavailable("gguf", qtype, f"not importable: {type(exc).__name__}: {exc}")
    t = gguf.GGMLQuantizationType[qtype]
    per_block, block_bytes = gguf.GGML_QUANT_SIZES[t]
    parts, weights = _total(shapes, count, lambda w: {"blocks": quants.quantize(w.numpy(), t).nbytes})
    declared = weights // per_block * block_bytes
    return Stored(_version(gguf), f"{qtype}: blocks of {per_block} weights, {block_bytes} bytes each", parts, weights, declared)


def torch_int4_kernel(shapes: Mapping[str, tuple[int, int]], count: int = 1) -> Stored | Unavailable:
    """Group-128 int4 as torch's CPU int4 kernel holds it (``cheapinfer.chapter.quantization.lowbit.Int4Linear``: packed codes,
    a bf16 scale and a bf16 zero per group); torchao's int4 weight-only path packs for these kernels."""
    from . import lowbit

    def measure(w: torch.Tensor) -> dict[str, int]:
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        lin.weight.data.copy_(w)
        q = lowbit.Int4Linear.from_linear(lin, torch.bfloat16)
        return {name: b.nbytes for name, b in q.named_buffers()}

    try:
        parts, weights = _total(shapes, count, measure)
    except (RuntimeError, NotImplementedError, ValueError) as exc:  # no CPU int4 kernel in this torch, or rows not in groups of 128
        return Unavailable(f"torch {torch.__version__}", "int4, group 128", str(exc).splitlines()[0], 4.125)
    return Stored(f"torch {torch.__version__}", "int4, group 128 (scale and zero, bf16)", parts, weights, None, 4.125)


def torchao_int8(shapes: Mapping[str, tuple[int, int]], count: int = 1) -> Stored | Unavailable:
    """Int8 weight-only per row as ``torchao.quantization.Int8WeightOnlyConfig`` stores it (the tensor
    subclass's inner tensors, read through ``__tensor_flatten__``)."""
    try:
        import torchao
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except Exception as exc:  # noqa: BLE001
        return Unavailable("torchao", "int8 per row", f"not importable: {type(exc).__name__}: {exc}")

    def measure(w: torch.Tensor) -> dict[str, int]:
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False).to(torch.bfloat16)
        lin.weight.data.copy_(w)
        quantize_(lin, Int8WeightOnlyConfig())
        return {name: getattr(lin.weight, name).nbytes for name in lin.weight.__tensor_flatten__()[0]}

    parts, weights = _total(shapes, count, measure)
    return Stored(_version(torchao), "int8 per row", parts, weights)


def survey(shapes: Mapping[str, tuple[int, int]], count: int = 1) -> dict[str, Stored | Unavailable]:
    """Every library format the chapter's 4- and 8-bit accounting can be set beside, by a short key."""
    return {
        "bnb-nf4": bnb_nf4(shapes, count),
        "bnb-nf4-double-quant": bnb_nf4(shapes, count, double_quant=True),
        "torch-int4-g128": torch_int4_kernel(shapes, count),
        "gguf-q4_0": gguf_blocks(shapes, count, "Q4_0"),
        "gguf-q8_0": gguf_blocks(shapes, count, "Q8_0"),
        "torchao-int8": torchao_int8(shapes, count),
    }


def table_rows(found: Mapping[str, Stored | Unavailable]) -> list[list[str]]:
    """Rows for the report: library, layout, bits per weight, by part, the chapter's accounting."""
    rows = []
    for s in found.values():
        book = "" if s.book_bits is None else f"{s.book_bits:g}"
        if isinstance(s, Unavailable):
            rows.append([s.library, s.layout, "not run: " + s.reason, "", book])
            continue
        parts = ", ".join(f"{k} {8 * b / s.weights:.4g}" for k, b in s.parts.items())
        rows.append([s.library, s.layout, f"{s.bits_per_weight:.4f}", parts, book])
    return rows


TABLE_HEADER = ["library", "layout", "bits per weight", "of which (bits per weight)", "the chapter's accounting"]

