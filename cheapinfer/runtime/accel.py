"""What a CUDA device does differently from the CPU, in one place, each with its CPU counterpart.

============================  ============================================  ==========================================
what                          CUDA                                          CPU (the counterpart CI tests)
============================  ============================================  ==========================================
wait for queued work          ``torch.cuda.synchronize``                    nothing is queued
time one call                 CUDA events around the call                   ``time.perf_counter`` around the call
peak above resident weights   ``max_memory_allocated`` after                :class:`LivePeak`: live bytes of the
                              ``reset_peak_memory_stats``, minus            tensors created inside the call
                              ``memory_allocated`` before
copy bandwidth                a 512 MiB copy on the device, timed like      the same copy in host memory
                              any call (:func:`copy_callable`)
attention kernel              torch's own choice for the shapes: flash,     the same choice: flash-cpu (tiled) or
                              memory-efficient, cuDNN or math               math
description                   name, memory, compute capability, driver,     ``gpu = none``
                              CUDA, cuDNN
============================  ============================================  ==========================================

The CUDA branches are the few lines under ``if _cuda(device)``; everything else is shared.
"""

from __future__ import annotations

import subprocess
import time
import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import memory

#: Bytes of the copy that measures a device's bandwidth: far beyond any last-level cache (a CPU's
#: tens of MB, an H100's or H200's 50-60 MB of L2), so the copy streams from and to memory.
COPY_BYTES = 512 * 2**20

#: A bandwidth probe streams at least this many times the last-level cache it runs beside, so that no more than a
#: quarter of it can be served from that cache, whatever the replacement policy (:func:`stream_bytes`).
PROBE_OVER_CACHE = 4

#: The last-level cache assumed where the operating system does not report one (:func:`last_level_cache`): above one
#: core complex's L3 on current CPUs (32-96 MiB) and a GPU's L2 (50-60 MiB on an H100 or H200), so that the default
#: probe, :data:`COPY_BYTES`, is still four times it.
ASSUMED_CACHE_BYTES = 128 * 2**20


def _cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def sync(device: torch.device | str) -> None:
    """Wait for queued kernels: call before reading a host clock around device work."""
    if _cuda(device):
        torch.cuda.synchronize(device)


def elapsed(fn: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Seconds one call of ``fn`` takes on ``device``: CUDA events on a GPU, ``perf_counter`` elsewhere.

    Work queued before the call is waited for first, so the clock sees only this call.
    """
    sync(device)
    if _cuda(device):
        with torch.cuda.device(device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in ms
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------
# memory: peaks above the resident weights
# ------------------------------------------------------------------------------------------------


class LivePeak(TorchDispatchMode):
    """Peak bytes of tensor storage created inside the block and still alive (CPU or any device).

    Every op's output storage is counted once, from the op that creates it until the last tensor
    viewing it is freed. Storage that existed before the block (weights, inputs) is not counted, so
    the peak is "allocator peak minus resident weights" for allocators that have no statistics of
    their own (the CPU's). No allocator rounding or caching: a lower bound on what an allocator holds.
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._owners: dict[int, int] = {}  # storage data_ptr -> live tracked tensors viewing it
        self._sizes: dict[int, int] = {}
        self._tensors: set[int] = set()  # ids of tracked tensor objects

    def restart(self) -> int:
        """Start a new peak from what is live now (e.g. at a step boundary); returns the live bytes."""
        self.peak = self.live
        return self.live

    def _track(self, t: torch.Tensor, input_storages: set[int]) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or id(t) in self._tensors:
            return
        if key not in self._owners:
            if key in input_storages:
                return  # a view of (or in-place on) storage made before the block: weights, inputs
            self._owners[key] = 0
            self._sizes[key] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        self._owners[key] += 1
        self._tensors.add(id(t))
        weakref.finalize(t, self._release, key, id(t))

    def _release(self, key: int, tid: int) -> None:
        self._tensors.discard(tid)
        self._owners[key] -= 1
        if self._owners[key] == 0:
            self.live -= self._sizes.pop(key)
            del self._owners[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = [t for a in (*args, *kwargs.values()) for t in (a if isinstance(a, (list, tuple)) else (a,))]
        inputs = {t.untyped_storage().data_ptr() for t in flat if isinstance(t, torch.Tensor) and not t.is_meta}
        out = func(*args, **kwargs)
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                self._track(t, inputs)
        return out


def peak_above_resident(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes ``fn`` needs above what was resident before it (weights, inputs, caches).

    CUDA: the caching allocator's own statistics (its peak includes its rounding). Elsewhere:
    :class:`LivePeak`, the live bytes of the tensors the call creates.
    """
    if _cuda(device):
        sync(device)
        torch.cuda.empty_cache()
        resident = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - resident
    with LivePeak() as tracker:
        fn()
    return tracker.peak


def device_peak(device: torch.device | str) -> int | None:
    """Bytes torch allocated at most on a CUDA device since its last :func:`reset_device_peak`; None on a CPU (the
    process's resident set is :func:`cheapinfer.runtime.memory.peak_rss`)."""
    return int(torch.cuda.max_memory_allocated(device)) if _cuda(device) else None


def reset_device_peak(device: torch.device | str) -> None:
    """Start :func:`device_peak` afresh (a CUDA device; nothing on a CPU)."""
    if _cuda(device):
        torch.cuda.reset_peak_memory_stats(device)


def available_memory(device: torch.device | str) -> int:
    """Bytes the device can still hand out now: on CUDA the driver's free memory plus what torch's caching
    allocator holds unused; on a CPU the kernel's estimate of memory available without swapping
    (``MemAvailable`` of ``/proc/meminfo``; elsewhere 0, so that nothing beyond it is planned)."""
    if _cuda(device):
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    return memory.available()


# ------------------------------------------------------------------------------------------------
# bandwidth
# ------------------------------------------------------------------------------------------------


def last_level_cache(device: torch.device | str = "cpu") -> tuple[int, bool]:
    """The bytes of the largest cache a probe on ``device`` passes through, and whether the system reported it: a GPU's
    L2; a CPU's highest-level data or unified cache of cpu0 as Linux's sysfs lists it. Elsewhere
    :data:`ASSUMED_CACHE_BYTES`, with ``False``."""
    if _cuda(device):
        return int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size), True
    import glob
    import re

    best: tuple[int, int] | None = None  # (level, bytes)
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index[0-9]*"):
        try:
            with open(f"{index}/level") as f:
                level = int(f.read())
            with open(f"{index}/type") as f:
                kind = f.read().strip()
            with open(f"{index}/size") as f:
                m = re.fullmatch(r"(\d+)([KMG]?)", f.read().strip())
        except (OSError, ValueError):
            continue
        if m is None or kind == "Instruction":
            continue
        size = int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
        if best is None or (level, size) > best:
            best = (level, size)
    return (best[1], True) if best else (ASSUMED_CACHE_BYTES, False)


def stream_bytes(device: torch.device | str = "cpu") -> int:
    """Bytes of a bandwidth probe on ``device``: :data:`COPY_BYTES`, or :data:`PROBE_OVER_CACHE` times the last-level
    cache where that is more (a CPU with hundreds of MiB of L3)."""
    return max(COPY_BYTES, PROBE_OVER_CACHE * last_level_cache(device)[0])


def copy_callable(nbytes: int = COPY_BYTES, device: torch.device | str = "cpu") -> tuple[Callable[[], object], int]:
    """A STREAM-style copy of ``nbytes`` and the bytes it moves (read + write): time it beside the work it bounds."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * src.numel() * 4


def read_callable(nbytes: int = COPY_BYTES, device: torch.device | str = "cpu", buffer: torch.Tensor | None = None) -> tuple[Callable[[], object], int]:
    """A read-only stream of ``nbytes`` (a sum over them) and the bytes it reads: the fastest a step can stream its
    weights on this device at this thread count, the upper limit beside :func:`copy_callable`'s lower reference.
    One CPU thread may read faster than it copies (a copy also writes, and may allocate its lines first).
    ``buffer``: sum this fp32 tensor of ``nbytes`` (already written) instead of a new one (:func:`stream_probes`)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device) if buffer is None else buffer
    if src.dtype != torch.float32 or src.numel() != nbytes // 4:
        raise ValueError(f"the read's buffer must be {nbytes // 4} fp32 values, not {src.numel()} {src.dtype}")
    return (lambda: src.sum()), src.numel() * 4


def stream_probes(nbytes: int = COPY_BYTES, device: torch.device | str = "cpu") -> tuple[tuple[Callable[[], object], int], tuple[Callable[[], object], int]]:
    """:func:`copy_callable`'s copy of ``nbytes`` and :func:`read_callable`'s read of ``nbytes``, each with the bytes it
    moves, on two buffers instead of three: the read sums the copy's destination (written with ones first, so that
    the read never meets untouched pages). Each still streams ``nbytes`` from memory: a probe sized against a CPU's
    last-level cache is gigabytes (1.9 GiB each beside 480 MiB of L3). On a virtual machine a read's speed follows where
    its buffer's pages lie more than what else streams them (three buffers of one process on a 2-core VM read at 3.0,
    3.9 and 6.1 GB/s in the order they were allocated, a buffer of its own the slowest): the read sums the destination,
    allocated after the source (a read of the source, the first buffer allocated, was 1.27x slower in one run)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.ones_like(src)
    return ((lambda: dst.copy_(src)), 2 * src.numel() * 4), read_callable(nbytes, device, buffer=dst)


# ------------------------------------------------------------------------------------------------
# attention kernel
# ------------------------------------------------------------------------------------------------

_SDPA_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = True) -> str:
    """The kernel ``scaled_dot_product_attention`` takes for these inputs, as torch chooses it.

    Asks torch's own selector (the function ``scaled_dot_product_attention`` calls), so the answer
    follows the installed torch, the inputs' device, dtype and shapes, and any ``sdpa_kernel``
    restriction in force: ``flash``, ``efficient``, ``cudnn`` or ``math`` on CUDA; ``flash-cpu``
    (torch's tiled CPU kernel) or ``math`` on a CPU.
    """
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return "unknown (this torch has no _fused_sdp_choice)"
    name = _SDPA_NAMES.get(int(choose(q, k, v, attn_mask, 0.0, is_causal)), "unknown")
    return f"{name}-cpu" if name == "flash" and q.device.type == "cpu" else name


def attention_backend(device: torch.device | str, dtype: torch.dtype, heads: int = 14, n: int = 256, head_dim: int = 64) -> str:
    """The kernel a causal attention of the book's shape ([1, 14, n, 64]) in ``dtype`` takes on ``device``."""
    q = torch.zeros(1, heads, n, head_dim, dtype=dtype, device=device)  # [B, H, S, D]
    return f"{sdpa_backend(q, q, q)} ({str(dtype).removeprefix('torch.')}, [1, {heads}, {n}, {head_dim}], causal)"


# ------------------------------------------------------------------------------------------------
# description
# ------------------------------------------------------------------------------------------------


def _nvidia_smi(query: str) -> str:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "n/a"


def rocm_version() -> str | None:
    """The HIP version of a ROCm build of torch (which answers ``torch.cuda`` for an AMD GPU), or None."""
    return getattr(torch.version, "hip", None)


def describe(device: torch.device | str) -> dict[str, str]:
    """The device in the words a reader compares runs by; on a CPU, the GPU entries say none."""
    desc = {
        "gpu": "none",
        "gpu_memory_gib": "n/a",
        "gpu_capability": "n/a",
        "driver": "n/a",
        "cuda_driver": "n/a",
        "cuda": torch.version.cuda or "n/a (CPU build)",  # the CUDA torch was built with
        "cudnn": "n/a",
    }
    hip = rocm_version()
    if hip:  # a ROCm build answers torch.cuda for an AMD GPU: its library is HIP, its DNN library MIOpen
        desc["cuda"] = f"n/a (ROCm/HIP {hip} build)"
    if _cuda(device):
        props = torch.cuda.get_device_properties(device)
        driver_cuda = getattr(torch._C, "_cuda_getDriverVersion", lambda: 0)()  # e.g. 12040: the newest CUDA the driver runs
        desc |= {
            "gpu": props.name,
            "gpu_memory_gib": f"{props.total_memory / 2**30:.1f}",
            "gpu_capability": f"{props.major}.{props.minor}",
            "driver": _nvidia_smi("driver_version"),
            "cuda_driver": f"{driver_cuda // 1000}.{driver_cuda % 1000 // 10}" if driver_cuda else "n/a",
            "cudnn": f"n/a (ROCm: MIOpen {torch.backends.cudnn.version()})" if hip else str(torch.backends.cudnn.version()),
        }
    return desc
