"""The CPU counterparts of what ``cheapinfer.runtime.accel`` does on CUDA: clock, memory peak, copy bandwidth,
attention kernel, device description; and decode efficiency, which reads a step against that bandwidth."""

from __future__ import annotations

import time

import pytest
import torch

from cheapinfer.chapter.kv_cache import kv
from cheapinfer.runtime import accel, roofline
from cheapinfer.runtime.arch import qwen2_config

CPU = torch.device("cpu")


def test_elapsed_times_the_call_on_the_cpu_clock():
    seconds = accel.elapsed(lambda: time.sleep(0.05), CPU)
    assert 0.05 <= seconds < 0.5


def test_elapsed_returns_what_the_call_took_not_what_came_before():
    started = time.perf_counter()
    time.sleep(0.05)
    assert accel.elapsed(lambda: None, CPU) < 0.01 < time.perf_counter() - started


def test_peak_above_resident_counts_what_the_call_creates():
    n = 2**18  # fp32: 1 MiB
    # ones (1 MiB) and ones + 1 (1 MiB) are alive together: the peak is both
    assert accel.peak_above_resident(lambda: torch.ones(n) + 1, CPU) == 2 * 4 * n


def test_peak_above_resident_leaves_out_the_resident_weights():
    weights = torch.ones(2**20)
    assert accel.peak_above_resident(lambda: weights.mul_(2), CPU) == 0  # in place on resident storage
    assert accel.peak_above_resident(lambda: weights.sum(), CPU) == 4  # one fp32 scalar


def test_peak_above_resident_sees_freed_temporaries_at_their_peak():
    n = 2**18

    def one_at_a_time():
        for _ in range(4):
            t = torch.ones(n)
            del t

    assert accel.peak_above_resident(one_at_a_time, CPU) == 4 * n  # never two alive at once


def test_copy_callable_copies_and_counts_read_and_write():
    copy, moved = accel.copy_callable(2**20, CPU)
    assert moved == 2 * 2**20
    dst = copy()
    assert dst.numel() == 2**18 and bool((dst == 1).all())


def test_stream_probes_hold_two_buffers_and_each_streams_its_bytes():
    """The copy and the read of stream_probes hold two buffers of n (source and destination), not three, while each
    streams n bytes: the read sums the copy's destination, which holds what the copy wrote (ones) even before it ran."""
    n = 4 * 2**20
    with accel.LivePeak() as made:
        (copy, moved), (read, nbytes) = accel.stream_probes(n, CPU)
        assert float(read()) == n // 4  # ones from the start: no untouched page is ever read
        dst = copy()
        total = read()
    assert moved == 2 * n and nbytes == n and float(total) == n // 4 and dst.nbytes == n
    assert 2 * n <= made.peak < 2 * n + 2**12  # two buffers alive at once (and the sums' scalars), never three


def test_the_read_takes_a_buffer_of_its_size_only():
    with pytest.raises(ValueError, match="fp32 values"):
        accel.read_callable(2**20, CPU, buffer=torch.ones(2**10))
    with pytest.raises(ValueError, match="fp32 values"):
        accel.read_callable(2**20, CPU, buffer=torch.ones(2**18, dtype=torch.float64))


def test_copy_bandwidth_timed_on_the_cpu_is_a_plausible_memory_speed():
    copy, moved = accel.copy_callable(64 * 2**20, CPU)
    copy()
    bandwidth = moved / min(accel.elapsed(copy, CPU) for _ in range(3))
    assert 1e8 < bandwidth < 1e13  # 0.1 GB/s (a broken clock or no copy) .. 10 TB/s (no CPU copies faster)


def test_sdpa_backend_reports_the_kernel_torch_takes_on_the_cpu():
    q = torch.zeros(1, 14, 64, 64)  # [B, H, S, D]
    assert accel.sdpa_backend(q, q, q) == "flash-cpu"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # a restriction in force changes the answer
        assert accel.sdpa_backend(q, q, q) == "math"


def test_describe_cpu_says_no_gpu_and_the_environment_names_the_attention_kernel():
    from cheapinfer.runtime import device

    desc = accel.describe(CPU)
    assert desc["gpu"] == "none" and desc["cudnn"] == "n/a" and desc["gpu_capability"] == "n/a"
    assert set(desc) >= {"gpu", "gpu_memory_gib", "gpu_capability", "driver", "cuda_driver", "cuda", "cudnn"}
    assert device.environment(CPU)["attention_backend"].startswith("flash-cpu (float32, [1, 14, 256, 64]")


@pytest.mark.parametrize("tied", [True, False])
def test_decode_bytes_are_the_weights_and_the_caches_the_step_reads(tied):
    """Every weight once; of an untied embedding table one row (a lookup), of a tied one the whole table (the LM head)."""
    from cheapinfer.runtime import hf

    config = qwen2_config(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                          tie_word_embeddings=tied)
    model = hf.from_config(config)
    batch, context = 3, 10
    cache = kv.random_cache(model.config, context, torch.float32, CPU, batch=batch)
    weights = sum(p.numel() * 4 for p in {p.data_ptr(): p for p in model.parameters()}.values())
    assert kv.parameter_bytes(model) == weights
    read = weights if tied else weights - 255 * 64 * 4  # 255 of the 256 rows of the untied table are not read
    assert roofline.streamed_bytes(model) == read
    assert kv.decode_bytes(model, batch, context) == read + kv.dynamic_cache_bytes(cache)
    assert roofline.decode_efficiency(2_000, 0.5, 8_000) == 0.5  # 2,000 / 0.5 / 8,000: every quotient exact in binary


def test_map_untimed_keeps_the_order_and_gives_back_the_thread_count():
    import torch

    from cheapinfer.runtime.device import map_untimed

    before = torch.get_num_threads()
    seen = []
    out = map_untimed(lambda x: (seen.append(torch.get_num_threads()), x * x)[1], list(range(6)), "cpu", workers=2)
    assert out == [x * x for x in range(6)] and set(seen) == {1} and torch.get_num_threads() == before


def _sysfs(tmp_path, caches):
    """A fake ``/sys/devices/system/cpu/cpu0/cache`` with ``(level, type, size)`` entries."""
    for i, (level, kind, size) in enumerate(caches):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return str(tmp_path / "index[0-9]*")


def test_the_last_level_cache_is_the_highest_data_or_unified_level(tmp_path, monkeypatch):
    import glob

    pattern = _sysfs(tmp_path, [(1, "Data", "32K"), (1, "Instruction", "64K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")])
    real = glob.glob
    monkeypatch.setattr(glob, "glob", lambda p: real(pattern))
    assert accel.last_level_cache(CPU) == (32 * 2**20, True)
    assert accel.stream_bytes(CPU) == accel.COPY_BYTES  # 512 MiB is 16x a 32 MiB L3


def test_a_large_cache_gets_a_probe_four_times_its_size(tmp_path, monkeypatch):
    import glob

    pattern = _sysfs(tmp_path, [(1, "Data", "48K"), (3, "Unified", "504M")])
    real = glob.glob
    monkeypatch.setattr(glob, "glob", lambda p: real(pattern))
    assert accel.stream_bytes(CPU) == accel.PROBE_OVER_CACHE * 504 * 2**20


def test_an_unreported_cache_is_assumed_and_says_so(monkeypatch):
    import glob

    monkeypatch.setattr(glob, "glob", lambda p: [])
    assert accel.last_level_cache(CPU) == (accel.ASSUMED_CACHE_BYTES, False)
    assert accel.stream_bytes(CPU) >= accel.PROBE_OVER_CACHE * accel.ASSUMED_CACHE_BYTES


def test_a_rocm_build_is_recorded_as_rocm_not_as_a_cpu_build(monkeypatch):
    """torch on ROCm answers torch.cuda; the record names HIP and MIOpen, never "CPU build" or cuDNN."""
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    desc = accel.describe("cpu")
    assert desc["cuda"] == "n/a (ROCm/HIP 6.2.41133 build)" and "CPU build" not in desc["cuda"]
