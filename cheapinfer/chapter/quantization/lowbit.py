"""Section 3, real low-bit weight kernels: fewer bytes per weight, and what a decode step does with them.

The suite's own quantizers (:mod:`cheapinfer.chapter.quantization.quant`) store codes and scales but evaluate by
dequantizing once (fake quantization): the model still multiplies full-precision matrices. Here
the same codes run through kernels that read them as stored:

- :class:`Int8Linear`: ``int8-row`` codes (int8, one scale per output row) through torch's
  ``aten._weight_int8pack_mm``: the int8 weight is loaded as stored and widened in registers; no
  full-precision copy of the weight is made.
- :class:`Int4Linear`: ``int4-g128`` codes (4 bits, one scale per group of 128 inputs), two per
  byte, through torch's ``aten._weight_int4pack_mm_for_cpu``.

Both kernels have a vectorised (AVX-512) path for 16-bit activations; with fp32 activations they
take a scalar loop (on a 2-core AVX-512 CPU the twin's int8 step with fp32 activations was 2x
slower than fp32 itself, int4 4x). So a low-bit variant keeps the activations of the 16-bit model
it is built from, and is compared with that model: only the bytes of the matrices differ.

Beside them, the libraries' own paths, each classified by what its code does:

- torchao ``Int8WeightOnlyConfig`` (0.18), eager mode: ``Int8Tensor``'s ``linear`` casts the whole
  int8 weight to the activation dtype on every call and then runs a dense product, a per-call
  dequantization that only ``torch.compile`` fuses away. ``Int4WeightOnlyConfig`` needs the
  ``mslk`` package (>= 1.0), which PyPI does not have: int4 through torchao is not run.
- bitsandbytes ``Linear4bit`` (NF4): at batch 1 its ``gemv_4bit`` reads the packed codes directly,
  on CUDA and, on a CPU with AVX-512 BF16, through the fused kernel of its CPU library (its faster
  CPU GEMM comes from the ``kernels`` package, which loads from a model hub and is never used
  here); elsewhere the CPU fallback dequantizes each weight to 16 bits before a dense product.
  ``Linear8bitLt`` (LLM.int8) quantizes the activations on every call and splits outlier columns
  into a second product.

:func:`cheapinfer.runtime.roofline.streamed_bytes` counts what one decode step reads in full: every matrix product's weight in
the form it is stored (codes + scales), norms and biases, and one row of the embedding table (a
lookup reads one row; a tied LM head reads the whole table and counts it once).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch
import torch.nn as nn

from ... import SEED
from ...runtime.roofline import streamed_bytes, tensor_bytes
from ...runtime.settings import TIMING_THREADS_VARIABLE
from . import quant

INT4_GROUP = 128

#: Each low-bit variant: (its kernel, whether that kernel reads the stored codes directly).
#: Only a direct kernel is under the cost model "step time ∝ bytes moved"; a per-call
#: dequantization moves more bytes than the 16-bit weight it started from.
LOW_BIT = {
    "int8": ("torch _weight_int8pack_mm (int8-row codes)", True),
    "int4": ("torch _weight_int4pack_mm_for_cpu (int4-g128 codes)", True),
    "torchao-int8": ("torchao Int8WeightOnlyConfig, eager: casts the weight every call", False),
    "bnb-nf4": ("bitsandbytes Linear4bit NF4, gemv_4bit", True),
    "bnb-int8": ("bitsandbytes Linear8bitLt (LLM.int8): quantizes activations every call", False),
}


def _has_kernel(op: str, device: torch.device) -> bool:
    key = "CUDA" if device.type == "cuda" else "CPU"
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, key)


class Int8Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` stored as int8 codes [out, in] and one scale per output row [out] (the suite's ``int8-row``)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("codes", codes.contiguous())  # int8 [out, in]
        self.register_buffer("scales", scales.contiguous())  # [out], in the activation dtype
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out_features = codes.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear, act_dtype: torch.dtype, generator: torch.Generator | None = None) -> "Int8Linear":
        """The suite's ``int8-row`` codes of ``linear`` (fp16 scales, kept exactly); with ``generator``: seeded random codes of the same shape."""
        w, dev = linear.weight.detach(), linear.weight.device
        if generator is None:
            q = quant.quantize(w.float(), "int8-row")
            codes, scales = q.codes, q.scales.reshape(-1)
        else:
            codes = torch.randint(-127, 128, w.shape, generator=generator, dtype=torch.int8)
            scales = torch.full((w.shape[0],), 0.02 / 127)
        bias = None if linear.bias is None else linear.bias.detach().to(act_dtype)
        return cls(codes.to(dev), scales.to(dev, act_dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, x.shape[-1]), self.codes, self.scales)  # [N, out]
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class Int4Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` stored as 4-bit codes, one scale per group of 128 inputs (the suite's ``int4-g128``), packed for torch's CPU int4 kernel.

    The kernel computes ``(q - 8) * scale + zero`` per group; the suite's symmetric codes ``c`` in
    [-8, 7] are stored as ``q = c + 8`` with ``zero = 0``, so it computes exactly the suite's ``c * scale``.
    """

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        """``packed``: uint8 [out, in / 2] in the kernel's layout; ``scales``: [out, in / 128] in the activation dtype."""
        super().__init__()
        self.register_buffer("packed", packed)
        self.register_buffer("scales_zeros", torch.stack([scales.t(), torch.zeros_like(scales.t())], dim=-1).contiguous())  # [in / 128, out, 2]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out_features = packed.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear, act_dtype: torch.dtype, generator: torch.Generator | None = None) -> "Int4Linear":
        """The suite's ``int4-g128`` codes of ``linear``; with ``generator``: seeded random codes (random packed bytes) of the same shape."""
        w = linear.weight.detach()
        out, inp = w.shape
        if inp % INT4_GROUP:
            raise ValueError(f"int4 kernel: {inp} inputs is not a multiple of the group size {INT4_GROUP}")
        if generator is None:
            q = quant.quantize(w.float(), f"int4-g{INT4_GROUP}")
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu((q.unpacked_codes().to(torch.int32) + 8).contiguous(), 1)  # uint8 [out, in / 2]
            scales = q.scales
        else:
            packed = torch.randint(0, 256, (out, inp // 2), generator=generator, dtype=torch.uint8)  # two random codes per byte
            scales = torch.full((out, inp // INT4_GROUP), 0.02 / 7)
        bias = None if linear.bias is None else linear.bias.detach().to(act_dtype)
        return cls(packed.to(w.device), scales.to(w.device, act_dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, x.shape[-1]), self.packed, INT4_GROUP, self.scales_zeros)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def _replace_linears(model, make: Callable[[nn.Linear], nn.Module], projections_only: bool = False) -> None:
    """Replace every ``nn.Linear`` of ``model`` (the projections and the LM head) by ``make(linear)``.

    ``projections_only``: only the decoder layers' projections (:func:`cheapinfer.chapter.quantization.quant.projection_weights`), as the suite's own schemes do.
    """
    keep = {name.removesuffix(".weight") for name in quant.projection_weights(model)} if projections_only else None
    for prefix, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{prefix}.{child_name}" if prefix else child_name
            if isinstance(child, nn.Linear) and (keep is None or full in keep):
                setattr(module, child_name, make(child))


def _sharing_copy(model):
    """A copy of ``model``'s modules that shares its parameter and buffer tensors (no weight is copied).

    Replacing a module of the copy leaves ``model`` untouched (never change a shared tensor in place).
    """
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


def variant(model, name: str, random_codes: bool = False, seed: int = 0, projections_only: bool = False, act_dtype: torch.dtype | None = None):
    """A copy of ``model`` whose matrix products (projections and LM head) run the kernel ``name``; ``model`` is not changed.

    Everything else (norms, embedding, activations) keeps ``model``'s dtype, so only the bytes of
    the matrices differ from ``model``. ``int8``/``int4``: the suite's ``int8-row``/``int4-g128``
    codes through torch's kernels; with ``random_codes``, seeded random codes of the same shapes
    instead (for the twin, whose weights are random anyway: a step's cost depends on the shapes
    and the kernel, not on the values). ``torchao-int8``: torchao's weight-only int8.
    ``bnb-nf4``/``bnb-int8``: bitsandbytes' layers. See :data:`LOW_BIT` for what each kernel does.
    ``projections_only``: leave the LM head as it is (the matrices the suite's own schemes quantize).
    ``act_dtype``: run the copy in this dtype instead (its other tensors are cast copies; the
    codes are still quantized from ``model``'s own weights).
    """
    if name not in LOW_BIT:
        raise ValueError(f"unknown low-bit variant {name!r}; known: {', '.join(LOW_BIT)}")
    p = next(model.parameters())
    device, act = p.device, act_dtype or p.dtype
    clone = _sharing_copy(model)
    g = torch.Generator().manual_seed(seed) if random_codes else None
    if name == "int8":
        if not _has_kernel("aten::_weight_int8pack_mm", device):
            raise NotImplementedError(f"torch {torch.__version__} has no _weight_int8pack_mm kernel for {device.type}")
        _replace_linears(clone, lambda lin: Int8Linear.from_linear(lin, act, g), projections_only)
    elif name == "int4":
        if device.type != "cpu":
            raise NotImplementedError("the int4 kernel used here is torch's CPU one (_weight_int4pack_mm_for_cpu)")
        _replace_linears(clone, lambda lin: Int4Linear.from_linear(lin, act, g), projections_only)
    elif name == "torchao-int8":
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        keep = {n.removesuffix(".weight") for n in quant.projection_weights(clone)}
        quantize_(clone, Int8WeightOnlyConfig(set_inductor_config=False), filter_fn=(lambda m, fqn: isinstance(m, nn.Linear) and fqn in keep) if projections_only else None)
    else:
        _replace_linears(clone, lambda lin: _bnb_linear(lin, name, act), projections_only)
    if act != p.dtype:
        _cast_copies(clone, act)
    return clone.eval().requires_grad_(False)


def _cast_copies(model, dtype: torch.dtype) -> None:
    """Give every floating-point parameter of ``model``'s ordinary modules a cast copy (shared tensors are not changed)."""
    for module in model.modules():
        if isinstance(module, (Int8Linear, Int4Linear)) or type(module).__module__.startswith(("bitsandbytes", "torchao")):
            continue
        for name, t in list(module.named_parameters(recurse=False)):
            if t.is_floating_point() and t.dtype != dtype:
                setattr(module, name, nn.Parameter(t.detach().to(dtype), requires_grad=False))


def _bnb_linear(lin: nn.Linear, name: str, act_dtype: torch.dtype) -> nn.Module:
    """A bitsandbytes layer holding ``lin``'s weight, quantized as it moves to ``lin``'s device."""
    import bitsandbytes as bnb

    w = lin.weight.detach().to("cpu", act_dtype)
    if name == "bnb-nf4":
        new = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None, compute_dtype=act_dtype, quant_type="nf4", device="meta")
        new.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4")
    else:
        new = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=lin.bias is not None, has_fp16_weights=False, threshold=6.0, device="meta")
        new.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    if lin.bias is not None:
        new.bias = nn.Parameter(lin.bias.detach().to("cpu", act_dtype), requires_grad=False)
    return new.to(lin.weight.device)


# ----------------------------------------------------------------------------------------------
# bytes one decode step streams
# ----------------------------------------------------------------------------------------------


@dataclass
class Step:
    """One variant's decode step: the bytes it streams, its median time, and where that sits on the roofline."""

    name: str
    bytes: int
    step_s: float
    copy_bandwidth: float  # bytes/s of a plain copy, measured in the same run
    evidence: dict = field(default_factory=dict)  # the timed step, traced once: it used its cache (cheapinfer.runtime.evidence)
    read_bandwidth: float = float("nan")  # bytes/s of a read-only stream (a sum), measured in the same run

    @property
    def bandwidth(self) -> float:
        """Weight bytes per second the step achieved."""
        return self.bytes / self.step_s

    @property
    def roofline(self) -> float:
        """Fraction of the copy bandwidth the step's weight traffic reached (1: as fast as memory allows)."""
        return self.bandwidth / self.copy_bandwidth

    @property
    def over_read(self) -> float:
        """Weight bytes per second over what a read-only stream reaches (at most 1: no step reads its weights faster)."""
        return self.bandwidth / self.read_bandwidth


#: The names of the memory probes :func:`decode_steps` times beside the steps. Their size is the caller's: far beyond a
#: last-level cache (:func:`cheapinfer.runtime.accel.stream_bytes`).
COPY, READ = "memory copy", "memory read"

#: Each path's premise probe: one matrix of the model, in the path's own kernel, whose weights stay in a cache
#: (layer 0's query projection: 896 x 896 in the book's architecture, 1.6 MB in 16 bits, within a core's L2 or a
#: GPU's), multiplied by one token ``PROBE_CALLS`` times per timed call.
PROBE_MATRIX, PROBE_CALLS = "model.layers.0.self_attn.q_proj", 50


def resident_name(name: str) -> str:
    """The timed variant of path ``name``'s premise probe (:func:`resident_callable`)."""
    return f"resident {name}"


def _probe(model) -> tuple[nn.Module, torch.Tensor]:
    """The probe matrix of ``model`` (its own kernel) and one seeded token of activations in the model's dtype."""
    module = model.get_submodule(PROBE_MATRIX)
    emb = model.get_input_embeddings().weight
    x = torch.randn(1, 1, model.config.hidden_size, generator=torch.Generator().manual_seed(SEED), dtype=torch.float32)
    return module, x.to(emb.device, emb.dtype)


def resident_bytes(model, calls: int = PROBE_CALLS) -> int:
    """Weight bytes :func:`resident_callable` reads: the probe matrix as stored, ``calls`` times."""
    module, _ = _probe(model)
    stored = {id(t): t for t in (*module.parameters(), *module.buffers())}  # each tensor once
    return sum(tensor_bytes(t) for t in stored.values()) * calls


def resident_callable(model, calls: int = PROBE_CALLS) -> Callable[[], object]:
    """``calls`` products of one token with the probe matrix, in the path's own kernel: after the first, its weights
    are in a cache, so the time is the kernel's own arithmetic (and its call overhead), not memory's.
    :func:`headroom` sets the rate it reaches against the memory's read."""
    module, x = _probe(model)

    def go():
        with torch.inference_mode():
            for _ in range(calls):
                out = module(x)
        return out

    return go


def headroom(resident: int, t: Mapping[str, float], name: str, read_bytes: int) -> float:
    """How much faster path ``name``'s kernel consumes its weights from a cache than memory reads bytes, from one set
    of times by name: ``resident`` bytes (:func:`resident_bytes`) / its probe's time, over ``read_bytes`` (the read
    probe's) / :data:`READ`'s time. Above 1 the kernel outruns memory, so its step is bound by the bytes it reads (the roofline's
    memory side); at or below 1 its own arithmetic sets its pace, and fewer bytes cannot be what makes it faster."""
    return (resident / t[resident_name(name)]) / (read_bytes / t[READ])


def bytes_bound(headrooms: Mapping[str, float], paths: tuple[str, ...]) -> tuple[bool, str]:
    """Whether every one of ``paths`` is bound by the bytes it reads here (its :func:`headroom` above 1), and why not:
    the premise of a claim that fewer bytes make a step faster. A kernel that cannot consume cached weights faster
    than memory delivers them is paced by its arithmetic; comparing it says what its arithmetic costs, not its bytes."""
    slow = [p for p in paths if not headrooms[p] > 1]
    if not slow:
        return True, ""
    rates = ", ".join(f"{p} {headrooms[p]:.2f}x" for p in paths)
    return False, (f"the kernels consume their weights from a cache at {rates} the rate memory reads them ({PROBE_MATRIX}, {PROBE_CALLS} "
                   f"products of one token per round): {', '.join(slow)} {'is' if len(slow) == 1 else 'are'} bound by arithmetic, not by "
                   "bytes, so the speedup here measures the kernels, not the bytes; kernels that outrun this memory can measure it "
                   f"(other CPU kernels, or more threads per timed step: {TIMING_THREADS_VARIABLE})")


def dense_copy_per_call(model) -> float:
    """Bytes one product of one token with the probe matrix creates, over the bytes of a dense 16-bit copy of that
    matrix (:func:`cheapinfer.runtime.accel.peak_above_resident`): about 1 / columns for a kernel that reads its codes in place
    (it creates its output), 1 or more for one that dequantizes the weight on every call."""
    from ...runtime.accel import peak_above_resident

    module, x = _probe(model)
    with torch.inference_mode():
        out = module(x)
        created = peak_above_resident(lambda: module(x), x.device)
    return created / (out.shape[-1] * x.shape[-1] * 2)


def over_read(step_bytes: Mapping[str, int], t: Mapping[str, float], read_bytes: int) -> float:
    """The largest weight bandwidth of any step, over the read stream's, from one set of times by name (those of
    :func:`decode_steps`, which time :data:`READ` beside them): the physical limit, per path. A step that
    beats a plain read of as many bytes did not read its weights (skipped, replayed, or missed by the clock)."""
    reading = read_bytes / t[READ]
    return max(step_bytes[n] / t[n] for n in step_bytes) / reading


def decode_steps(models: Mapping[str, object], timed: Callable, probe_bytes: int, context: int = 32, rounds: int = 7, warmup: int = 2,
                 quantities: Callable[[Mapping[str, float]], Mapping[str, float]] | None = None) -> tuple[dict[str, Step], dict]:
    """Batch-1 decode step of each model at ``context`` cached tokens, its premise probe (:func:`resident_callable`), a
    memory copy and a memory read, in one interleaved run: each model's :class:`Step`, and the timed samples of every
    variant by name (the steps' and the probes').

    ``timed(variants, rounds, warmup)`` is :func:`cheapinfer.runtime.timing.interleaved` (or the suite's
    fixture around it; with ``quantities``, a function of one set of times by name, it is handed on,
    so that the fixture adds rounds while a noisy check on them cannot decide). The copy and the read
    (``probe_bytes`` each: :func:`cheapinfer.runtime.accel.stream_bytes`, so that neither sits in a cache) give the bandwidths the roofline is read against: the copy the reference,
    the read the limit (:func:`over_read`).
    """
    from ...runtime.accel import stream_probes
    from ...runtime.evidence import traced
    from ...runtime.memory import release
    from ..batching.batching import decode_step

    steps = {name: decode_step(m, 1, context) for name, m in models.items()}
    device = next(next(iter(models.values())).parameters()).device
    release()  # what building the models freed goes back to the system before the probes take their gigabytes
    (copy_fn, moved), (read_fn, read) = stream_probes(probe_bytes, device)  # two buffers: the read sums the copy's destination
    assert read == probe_bytes and moved == 2 * probe_bytes, "over_read(), headroom() and the caller's cache check count each probe as probe_bytes"
    variants = {**steps, **{resident_name(name): resident_callable(m) for name, m in models.items()}, COPY: copy_fn, READ: read_fn}
    # the fixture (with quantities) measures the premise of the clocked claim (runtime.premise) on the decode steps, not on the probes
    samples = (timed(variants, rounds=rounds, warmup=warmup) if quantities is None
               else timed(variants, rounds=rounds, warmup=warmup, quantities=quantities, premise=steps))
    # Traced after the timed calls: the trace's history then proves they left each cache at ``context``.
    evidence = {name: traced(models[name], step)[1] for name, step in steps.items()}
    bw, rbw = moved / samples[COPY].median, read / samples[READ].median
    steps = {name: Step(name, streamed_bytes(m), samples[name].median, bw, evidence[name], rbw) for name, m in models.items()}
    return steps, samples
