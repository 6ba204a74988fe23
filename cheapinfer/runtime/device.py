"""Device choice, which claims depend on the device, and the environment record every report carries.

What a CUDA device does differently (clocks, allocator peaks, bandwidth, attention kernel) lives in
:mod:`cheapinfer.runtime.accel`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
from typing import Callable, Sequence, TypeVar

import torch

from . import models
from .accel import attention_backend, describe, sync  # noqa: F401  (sync: the suite's one way to wait for a device)
from .profiles import ISA_VARIABLES

T = TypeVar("T")
R = TypeVar("R")

class DeviceUnavailable(RuntimeError):
    """The requested device does not exist on this machine."""


def pick(requested: str = "auto") -> torch.device:
    """``auto`` takes CUDA when present, else CPU. ``CHEAPINFER_DEVICE`` overrides ``auto``."""
    requested = os.environ.get("CHEAPINFER_DEVICE", requested) if requested == "auto" else requested
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"--device {requested} asked for CUDA, but torch {torch.__version__} sees no CUDA device "
            f"(torch.version.cuda = {torch.version.cuda}); run on a machine with an NVIDIA GPU and a CUDA build of torch"
        )
    if requested not in ("cpu",) and not requested.startswith("cuda"):
        raise DeviceUnavailable(f"--device must be auto, cpu or cuda[:N], not {requested!r}")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise DeviceUnavailable(f"--device must be auto, cpu or cuda[:N], not {requested!r}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceUnavailable(
                f"--device {requested}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
                f" (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')} renumbers them from 0)"
            )
        try:
            # torch.cuda.set_device refuses a torch.device without an index: plain "cuda" is the current card
            device = indexed(device)
            torch.cuda.set_device(device)  # tensors made on plain "cuda" land on the chosen card
        except (RuntimeError, ValueError, AssertionError) as exc:  # a driver that fails to start, a card in use
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DeviceUnavailable(f"--device {requested}: torch could not select the CUDA device: {first}") from None
    return device


def indexed(device: torch.device | str) -> torch.device:
    """``device`` with its index: plain ``cuda`` is the current CUDA device, ``cuda:<current>``; other devices as given."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def installed_version(dist: str) -> str:
    """The installed version of the distribution ``dist``, or "not installed"."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _timing_threads() -> int:
    from .timing import TIMING_THREADS

    return TIMING_THREADS or torch.get_num_threads()


def environment(device: torch.device | str) -> dict[str, str]:
    """What a reader needs to compare two runs: hardware, driver and library versions.

    The GPU entries describe ``device``, the run's device (the one ``pick`` chose, which the plugin keeps in its
    config; with ``CUDA_VISIBLE_DEVICES`` numbered among the visible cards): a run on the CPU says ``gpu = none``.
    The returned dict is shared: copy it before changing it.
    """
    return _environment(str(indexed(device)))


@functools.lru_cache(maxsize=4)
def _environment(device: str) -> dict[str, str]:
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "torch_threads": str(torch.get_num_threads()),
        "timing_threads_cpu": str(_timing_threads()),
        **cpu_kernels(),
        **describe(device),  # gpu, its memory and compute capability, driver, CUDA, cuDNN
        # the attention kernel of the book's shape, in the dtype the chapter's GPU runs (fp32 on a CPU)
        "attention_backend": attention_backend(device, models.DTYPES[models.claim_dtype("gpu-half", device)]),
    }
    env.update(library_versions())
    return env


def cpu_kernels() -> dict[str, str]:
    """The CPU kernel family the run was allowed: torch's vector capability (``ATEN_CPU_CAPABILITY`` caps it) and
    oneDNN's instruction-set cap (``ONEDNN_MAX_CPU_ISA``; unset: the best the CPU has). The serving dtype of the
    batch claims follows it (:func:`cheapinfer.runtime.models.serving_dtype`)."""
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "unknown")()
    return {
        "cpu_capability": str(capability),  # ATen's kernel family in this process
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "default"),
        "cpu_isa_caps": ", ".join(f"{v}={os.environ[v]}" for v in ISA_VARIABLES if os.environ.get(v)) or "none",
    }


#: The libraries whose versions a run records (and an erratum may be limited to).
LIBRARIES = ("torch", "transformers", "bitsandbytes", "gguf", "accelerate", "numpy", "scipy", "pytest-benchmark", "hypothesis")


def library_versions() -> dict[str, str]:
    """Installed version of each of :data:`LIBRARIES` ("not installed" where absent)."""
    return {dist: installed_version(dist) for dist in LIBRARIES}


def map_untimed(fn: Callable[[T], R], items: Sequence[T], device: torch.device | str, workers: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, for work whose result, not its time, is measured.

    On a CPU the items run ``workers`` at a time (default: the torch thread count, at least 1), each
    worker with one torch thread: a small model's one-token forward is bound by memory and by Python,
    so two one-thread streams move about 1.5x the tokens of one two-thread stream. On CUDA, in order.
    Never for timed work: the workers share the machine.
    """
    n = min(len(items), workers or torch.get_num_threads())
    if torch.device(device).type != "cpu" or n <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    from .timing import cpu_threads

    with cpu_threads(1), ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(fn, items))


def bitsandbytes_cuda_problem(device: torch.device | str) -> str | None:
    """Why bitsandbytes' CUDA library does not load on ``device`` (one line), or None: loaded, or not a CUDA run.

    bitsandbytes loads its native library at import and, where that fails, keeps a stand-in that raises only when a
    kernel is called (and logs a traceback at import): the probe imports it with that log silenced and asks which
    library it holds, so that the NF4 and LLM.int8() rows do not fail later with a long message."""
    import logging

    if torch.device(device).type != "cuda":
        return None
    log = logging.getLogger("bitsandbytes.cextension")
    level, log.level = log.level, logging.CRITICAL + 1
    try:
        from bitsandbytes import cextension
    except ImportError as exc:
        return f"bitsandbytes does not import ({(str(exc).strip().splitlines() or [type(exc).__name__])[0]}): its NF4 and LLM.int8() rows cannot run"
    except Exception as exc:  # a native library that fails in its own import code
        return f"bitsandbytes' CUDA library does not load: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}"
    finally:
        log.level = level
    lib = getattr(cextension, "lib", None)
    if type(lib).__name__ == "CudaBNBNativeLibrary":
        return None
    why = (str(getattr(lib, "error_msg", "") or "").strip().splitlines() or [f"it holds {type(lib).__name__}, not its CUDA library"])[0]
    return f"bitsandbytes' CUDA library does not load ({why}): its NF4 and LLM.int8() rows will fail"

