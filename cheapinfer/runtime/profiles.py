"""Which profiles run a model on the run's device, and the variables that cap the CPU's kernels.

Facts about claims and processes that the harness reads without torch (the ``-m gpu`` selection, the ISA
matrix); :mod:`cheapinfer.runtime.device` measures the device itself.
"""

from __future__ import annotations

from typing import Iterable

#: Profiles whose measurement runs a model on the run's device (``arithmetic`` runs none).
MODEL_PROFILES = ("twin", "stand-in", "book")
#: Environment variables that cap the CPU kernels a process may use: oneDNN's (bf16 and int8 matmuls, the
#: serving dtype's check), ATen's vectorised kernels (attention, reductions, the low-bit packs) and MKL's
#: (fp32 GEMM). Each run records the ones set (``cpu_isa_caps``) and ATen's capability (``cpu_capability``).
ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def device_dependent(runs_on: Iterable[str]) -> bool:
    """Whether a measurement on these profiles depends on the device: it runs a model (twin, stand-in,
    book) there, so timings, memory peaks, kernels and forward passes come from the device.
    Arithmetic (bytes, counts, formulas, sampling statistics) does not."""
    return any(p in MODEL_PROFILES for p in runs_on)
