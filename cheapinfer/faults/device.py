"""The device path's faults: the suite's own bugs on a GPU, not the chapter's (as :mod:`cheapinfer.faults.writer`'s).

Each puts back one certain defect of issue 41 at its narrowest point (one value, or a wrapper around the function
that was fixed), so that the CPU test guarding against it turns red (tests/test_device_faults.py): the test is
not true by construction. The claims' faults (:mod:`cheapinfer.faults.catalogue`) turn claims red; these turn
self-tests red, on a CPU (a fake CUDA machine, fake CUDA tensors).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator

import torch

from ..chapter.kv_cache import kv
from ..chapter.quantization import quant
from ..runtime import accel, hf, models, premise
from ..runtime import device as devices
from .base import patched


@dataclass(frozen=True)
class DeviceFault:
    name: str
    what: str  # the defect it puts back, in one sentence
    activate: Callable[[], ContextManager[None]]


FAULTS: dict[str, DeviceFault] = {}


def _fault(name: str, what: str):
    def register(gen: Callable[[], Iterator[None]]) -> Callable[[], Iterator[None]]:
        FAULTS[name] = DeviceFault(name, what, contextlib.contextmanager(gen))
        return gen

    return register


@_fault("set-device-without-index", "plain cuda (asked for, chosen by auto or by CHEAPINFER_DEVICE) reaches "
        "torch.cuda.set_device without its index, which torch refuses: every run on a GPU stops before its first test")
def _():
    with patched(devices, "indexed", torch.device):  # the device as given, no index added
        yield


@_fault("nf4-codebook-on-the-cpu", "the NF4 codebook and its thresholds are made on the CPU whatever the weights' device: "
        "bucketize and the codebook's indexing meet a CPU tensor with a GPU one")
def _():
    real = quant.nf4_codebook
    with patched(quant, "nf4_codebook", lambda dtype=torch.float32, device="cpu": real(dtype)):
        yield


@_fault("kv-bound-on-the-cpu", "KV-SCORES-BYTES's rounding bound is left on the CPU, where it was computed in float64: "
        "the head's GPU difference is divided by a CPU tensor")
def _():
    real = kv.head_row_bound
    with patched(kv, "head_row_bound", lambda head: real(head).cpu()):
        yield


@_fault("ids-on-the-cpu", "the suite's own model tests hand a model on the GPU token ids made on the CPU: "
        "its embedding meets a CPU index with a GPU table")
def _():
    real = hf.model_ids
    with patched(hf, "model_ids", lambda model, ids: real(model, ids).cpu()):
        yield


@_fault("rocm-taken-for-cuda", "a ROCm build of torch is not told from a CPU build: the record says 'CPU build' "
        "and labels MIOpen as cuDNN")
def _():
    with patched(accel, "rocm_version", lambda: None):
        yield


@_fault("bf16-below-sm80", "--twin-dtype bf16 is taken on a card below compute capability 8.0, whose bf16 timings "
        "are an emulation's")
def _():
    with patched(models, "BF16_CAPABILITY", (0, 0)):
        yield


@_fault("llm-int8-below-sm75", "LLM.int8() is run on a card below compute capability 7.5, which has no int8 path")
def _():
    with patched(models, "INT8_CAPABILITY", (0, 0)):
        yield


@_fault("host-bound-premise-missing", "a clocked step bound by the host (launches, Python) is read as device-bound: "
        "a GPU's launch floor is judged against the book and written as errata")
def _():
    with patched(premise, "HOST_SHARE", math.inf):  # no enqueue time exceeds it: every step reads as device-bound
        yield
