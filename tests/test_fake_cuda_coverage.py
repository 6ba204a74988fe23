"""What the FakeTensorMode pass (test_fake_cuda_pass) covers, checked: every function of ``chapter/`` and ``runtime/``
that takes a device (a parameter named ``device``) is run there on fake CUDA tensors, or is named below as an
exception, with why fake tensors cannot follow it and the test that covers it directly. A new device-taking
function fails this test until it is placed; a named test that no longer calls its function fails it too.

The exceptions fall in four kinds:

- the device is read only for its type (no tensor is made on it): tested with a CUDA device on the CPU, here or in
  its own test;
- a CUDA driver is needed (events, the allocator's statistics, device properties, a synchronise): the CPU branch
  is tested on the CPU, the CUDA branch by ``pytest -m gpu`` (``python -m cheapinfer gpu-check``);
- a transformers model runs: it reads values back during a forward (masks, cache lengths), which fake tensors do
  not have; the suite's own model tests feed it ids through ``hf.model_ids`` (run in the pass);
- a library kernel with no fake implementation (bitsandbytes, torch's packed int8/int4 products).
"""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest
import torch
from fake_cuda import FakeCuda

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cheapinfer"

TYPE, DRIVER, MODEL, KERNEL = "reads the device's type only", "needs a CUDA driver", "runs a transformers model", "a kernel with no fake"

#: function -> the pass's test that runs it on fake CUDA tensors
IN_THE_PASS = {
    "chapter/asides/asides.py::qkv": "test_the_asides_inputs_the_twins_ids_and_the_dot_product_bound_on_the_device",
    "chapter/kv_cache/kv_evidence.py::random_ids": "test_the_asides_inputs_the_twins_ids_and_the_dot_product_bound_on_the_device",
    "chapter/kv_cache/kv.py::Head.__init__": "test_the_kv_head_and_its_rounding_bound_on_the_device",
    "chapter/kv_cache/kv.py::random_cache": "test_a_random_cache_and_the_paged_pool_on_the_device",
    "chapter/batching/paging.py::PagedKVCache.__init__": "test_a_random_cache_and_the_paged_pool_on_the_device",
    "chapter/batching/paging.py::paged_cache": "test_the_paged_cache_of_a_model_takes_its_keys_on_the_device",
    "chapter/quantization/quant.py::nf4_codebook": "test_quantizers_stay_on_the_weights_device",
    "runtime/accel.py::read_callable": "test_the_read_probe_on_the_device",
    "runtime/accel.py::stream_probes": "test_the_stream_probes_on_the_device",
}

#: function -> (kind, the test file that covers it directly: it calls the function by name)
EXCEPTIONS = {
    "chapter/batching/batch_curve.py::length_scale": (TYPE, "tests/test_fake_cuda_coverage.py"),
    "chapter/batching/batch_curve.py::batch_sizes": (TYPE, "tests/test_fake_cuda_coverage.py"),
    "chapter/batching/batch_curve.py::serving": (TYPE, "tests/test_fake_cuda_coverage.py"),
    "chapter/quantization/lowbit.py::_has_kernel": (TYPE, "tests/test_fake_cuda_coverage.py"),
    "runtime/accel.py::_cuda": (TYPE, "tests/test_fake_cuda_coverage.py"),
    "runtime/timing.py::device_threads": (TYPE, "tests/test_fake_cuda_coverage.py"),
    "runtime/device.py::indexed": (TYPE, "tests/test_fake_cuda_coverage.py"),
    "runtime/device.py::map_untimed": (TYPE, "tests/test_accel.py"),
    "runtime/device.py::bitsandbytes_cuda_problem": (TYPE, "tests/test_device_selection.py"),
    "runtime/device.py::environment": (DRIVER, "tests/test_accel.py"),
    "runtime/device.py::_environment": (DRIVER, "tests/test_inputs.py"),
    "runtime/models.py::serving_dtype": (TYPE, "tests/chapter/test_batching_tradeoff.py"),
    "runtime/models.py::claim_dtype": (TYPE, "tests/test_inputs.py"),
    "runtime/models.py::llm_int8_unavailable": (TYPE, "tests/test_device_selection.py"),
    "runtime/models.py::unusable_twin_dtype": (TYPE, "tests/test_device_selection.py"),
    "runtime/accel.py::sync": (DRIVER, "cheapinfer/runtime/timing.py"),  # every timed round; test_noise times on the CPU
    "runtime/accel.py::elapsed": (DRIVER, "tests/test_accel.py"),
    "runtime/accel.py::peak_above_resident": (DRIVER, "tests/test_accel.py"),
    "runtime/accel.py::device_peak": (DRIVER, "fixtures/recording.py"),
    "runtime/accel.py::reset_device_peak": (DRIVER, "fixtures/recording.py"),
    "runtime/accel.py::available_memory": (DRIVER, "claims/test_batching.py"),
    "runtime/accel.py::last_level_cache": (DRIVER, "tests/test_accel.py"),
    "runtime/accel.py::stream_bytes": (DRIVER, "tests/test_accel.py"),
    "runtime/accel.py::copy_callable": (DRIVER, "tests/test_accel.py"),  # Tensor.copy_ asks a CPU build for a CUDA guard
    "runtime/accel.py::attention_backend": (DRIVER, "cheapinfer/runtime/device.py"),  # in every record; test_accel reads it there
    "runtime/accel.py::describe": (DRIVER, "tests/test_accel.py"),
    "runtime/premise.py::enqueue_and_device": (DRIVER, "tests/test_fake_cuda_coverage.py"),  # with fake CUDA events
    "runtime/premise.py::device_bound": (DRIVER, "tests/test_premise.py"),
    "runtime/premise.py::launch_floor": (DRIVER, "tests/test_launch_floor.py"),  # CUDA events simulated by a timer
    "runtime/premise.py::sized_length": (DRIVER, "tests/test_launch_floor.py"),
    "chapter/kv_cache/kv.py::sized_prompt": (DRIVER, "tests/test_launch_floor.py"),  # on the fake CUDA machine, a simulated floor
    "runtime/timing.py::interleaved": (DRIVER, "tests/test_noise.py"),
    "runtime/timing.py::interleaved_until_decided": (DRIVER, "tests/test_noise.py"),
    "chapter/kv_cache/kv.py::marked_generation": (MODEL, "tests/chapter/test_kv_cache_timing.py"),
    "chapter/batching/batching.py::kernel_probe": (MODEL, "tests/chapter/test_batching_tradeoff.py"),
    "chapter/evaluation/evaluation.py::Table.fill": (MODEL, "fixtures/evaluation.py"),
    "chapter/batching/knee.py::measure_doubling": (MODEL, "tests/chapter/test_batching_knee.py"),
    "runtime/models.py::twin": (MODEL, "tests/test_memory.py"),
    "runtime/models.py::stand_in": (MODEL, "fixtures/profiles.py"),
    "runtime/models.py::book": (MODEL, "tests/test_inputs.py"),
    "chapter/quantization/crosscheck.py::_bitsandbytes_linear": (KERNEL, "tests/test_gpu.py"),
}


def device_taking() -> set[str]:
    """Every function and method of ``chapter/`` and ``runtime/`` with a parameter named ``device``."""
    found = set()
    for path in sorted([*(PACKAGE / "chapter").rglob("*.py"), *(PACKAGE / "runtime").glob("*.py")]):
        def visit(node, prefix=""):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    if any(p.arg == "device" for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]):
                        found.add(f"{path.relative_to(PACKAGE)}::{prefix}{child.name}")
                    visit(child, f"{prefix}{child.name}.")

        visit(ast.parse(path.read_text()))
    return found


def test_every_device_taking_function_is_in_the_pass_or_named_with_its_direct_test():
    found = device_taking()
    placed = set(IN_THE_PASS) | set(EXCEPTIONS)
    assert not set(IN_THE_PASS) & set(EXCEPTIONS)
    assert not found - placed, f"device-taking, neither run in the FakeTensorMode pass nor named here: {sorted(found - placed)}"
    assert not placed - found, f"named here, but no longer a device-taking function: {sorted(placed - found)}"


def _called(source: str, function: str) -> bool:
    name = function.split("::")[1].split(".")[-1]
    if name == "__init__":
        name = function.split("::")[1].split(".")[-2]
    return source.count(f"{name}(") > source.count(f"def {name}(")  # a call, not its definition


@pytest.mark.parametrize("function", sorted(IN_THE_PASS))
def test_the_pass_runs_what_it_is_said_to(function):
    tree = ast.parse((ROOT / "tests" / "test_fake_cuda_pass.py").read_text())
    test = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == IN_THE_PASS[function]), None)
    assert test is not None, f"test_fake_cuda_pass has no {IN_THE_PASS[function]}"
    assert _called(ast.unparse(test), function) or function.endswith("nf4_codebook"), function  # nf4: through quantize("nf4")


@pytest.mark.parametrize("function", sorted(EXCEPTIONS))
def test_each_exception_names_a_test_that_calls_it(function):
    assert _called((ROOT / EXCEPTIONS[function][1]).read_text(), function), f"{EXCEPTIONS[function][1]} does not call {function}"


def test_what_reads_only_the_devices_type_on_a_cuda_device(monkeypatch):
    """The TYPE exceptions without a test of their own, on a (fake) two-card machine's CUDA device."""
    from cheapinfer.chapter.batching import batch_curve
    from cheapinfer.chapter.quantization import lowbit
    from cheapinfer.runtime import accel, timing
    from cheapinfer.runtime import device as devices

    FakeCuda(count=2, current=1).install(monkeypatch)
    cuda = torch.device("cuda", 0)
    assert batch_curve.length_scale(cuda) == 1 and batch_curve.length_scale(torch.device("cpu")) > 1
    assert batch_curve.batch_sizes(["BAT-KNEE"], cuda)[-1] == 256 > batch_curve.batch_sizes(["BAT-KNEE"], torch.device("cpu"))[-1]
    assert batch_curve.serving(cuda)["serving_dtype"] == "fp16"
    assert timing.device_threads("cuda:0") is None and timing.device_threads("cpu") == timing.TIMING_THREADS
    assert accel._cuda("cuda:1") and not accel._cuda("cpu")
    assert devices.indexed("cuda") == torch.device("cuda", 1) and devices.indexed("cuda:0") == cuda
    # the CPU build has no CUDA kernels: the packed int8 product is looked up under the CUDA key, not the CPU's
    op = "aten::_weight_int8pack_mm"
    assert lowbit._has_kernel(op, torch.device("cpu")) and lowbit._has_kernel(op, cuda) == torch.backends.cuda.is_built()


class _FakeEvent:
    """A CUDA event whose time is the host's clock when it is recorded: the device finishes each call as it returns."""

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self, stream=None) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "_FakeEvent") -> float:
        return (end.at - self.at) * 1e3  # milliseconds, as CUDA's


def test_the_premises_cuda_timer_reads_the_enqueue_and_the_events(monkeypatch):
    """``premise.enqueue_and_device`` with CUDA's events faked: the host's time until the call returns, and the events'
    milliseconds as seconds, the second at least the first (the last event is recorded after the call returns)."""
    import contextlib

    from cheapinfer.runtime import premise

    FakeCuda(count=1).install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    enqueue, device = premise.enqueue_and_device(lambda: time.sleep(0.02), "cuda:0")
    assert 0.02 <= enqueue <= device < 1.0
