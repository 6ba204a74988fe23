"""Device choice, synchronisation, and the environment record every report carries."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess

import torch


class DeviceUnavailable(RuntimeError):
    """The requested device does not exist on this machine."""


def pick(requested: str = "auto") -> torch.device:
    """``auto`` takes CUDA when present, else CPU. ``CHEAPINFER_DEVICE`` overrides ``auto``."""
    requested = os.environ.get("CHEAPINFER_DEVICE", requested) if requested == "auto" else requested
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"--device {requested} asked for CUDA, but torch {torch.__version__} sees no CUDA device "
            f"(torch.version.cuda = {torch.version.cuda}); run on a machine with an NVIDIA GPU and a CUDA build of torch"
        )
    if requested not in ("cpu",) and not requested.startswith("cuda"):
        raise DeviceUnavailable(f"--device must be auto, cpu or cuda[:N], not {requested!r}")
    return torch.device(requested)


def sync(device: torch.device | str) -> None:
    """Wait for queued kernels: call before reading a clock around device work."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _version(dist: str) -> str:
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


def _nvidia_driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "n/a"


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, str]:
    """What a reader needs to compare two runs: hardware, driver and library versions."""
    cuda = torch.cuda.is_available()
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "torch_threads": str(torch.get_num_threads()),
        "timing_threads_cpu": str(_timing_threads()),
        "gpu": torch.cuda.get_device_name(0) if cuda else "none",
        "gpu_memory_gib": f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f}" if cuda else "n/a",
        "driver": _nvidia_driver() if cuda else "n/a",
        "cuda": str(torch.version.cuda) if torch.version.cuda else "n/a (CPU build)",
    }
    for dist in ("torch", "transformers", "bitsandbytes", "gguf", "accelerate", "numpy", "scipy", "pytest-benchmark", "hypothesis"):
        env[dist] = _version(dist)
    return env
