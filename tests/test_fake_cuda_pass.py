"""The chapter's tensor code on CUDA tensors, without a GPU: every device-taking function of ``chapter/`` and
``runtime/`` that fake tensors can follow runs on fake ``cuda`` tensors (:func:`fake_cuda.fake_cuda_tensors`),
where a CPU tensor meeting a CUDA one raises as the real kernels would.

What fake tensors cannot follow (a value read back to Python has no fake value), each with its direct test (the
full list, every device-taking function placed, is checked by test_fake_cuda_coverage):

- ``quant.extremes_kept``, ``quant.listing_blockwise`` and ``quant.rounding_rule`` read values back (``float``,
  ``bool``, ``tolist``): their tensors are the ones :func:`quant.fake_quantize` and :func:`quant.absmax_listing` make,
  run here; ``tests/chapter/test_quantization_properties.py`` tests them on the CPU.
- Models (``models.twin``, ``stand_in``, ``book``, ``lowbit.variant``, ``kv.greedy_*``, ``kv_evidence``, ``batching``,
  ``evaluation``): transformers reads values back during a forward (masks, cache lengths); the model tests move
  their inputs to ``model.device`` (``tests/chapter/test_batching_paging.py``, ``test_quantization_lowbit.py``), and ``pytest -m gpu`` runs them on a GPU.
- ``lowbit.Int8Linear``/``Int4Linear``: torch's int8/int4 packed kernels have no fake (meta) implementation for
  every device; their codes come from :func:`quant.quantize`, run here, and ``lowbit._has_kernel`` says whether the
  device has the kernel.
- ``accel.copy_callable``: ``Tensor.copy_`` asks a CPU build of torch for a CUDA device guard; its two tensors are
  made on the one device it is given (``test_accel`` runs it).
- ``runtime.accel``'s CUDA branches (events, allocator statistics, device properties) need a driver; the fake CUDA
  machine of :mod:`fake_cuda` tests device selection (``test_device_selection``).
"""

from __future__ import annotations

import pytest
import torch
from fake_cuda import fake_cuda_tensors

from cheapinfer.chapter.asides import asides
from cheapinfer.chapter.batching import paging
from cheapinfer.chapter.kv_cache import kv, kv_evidence
from cheapinfer.chapter.quantization import quant
from cheapinfer.runtime import accel, hf, rounding

CUDA = torch.device("cuda", 0)


def test_the_pass_catches_a_cpu_tensor_meeting_a_cuda_one():
    """The premise of every test below: a mismatch raises under the fake mode, as on a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError

    with fake_cuda_tensors():
        x = torch.zeros(4, device="cuda")
        with pytest.raises(FakeTensorDeviceMismatchError):
            torch.bucketize(x, torch.tensor([0.5]))
        with pytest.raises(RuntimeError, match="indices should be"):
            torch.tensor([1.0, 2.0])[x.long()]
        assert (x[1:] + 1).device == CUDA and x.to("cuda").device == CUDA


@pytest.mark.parametrize("scheme", [*quant.SCHEMES, "int8-g32", "nf4-g128"])
def test_quantizers_stay_on_the_weights_device(scheme):
    with fake_cuda_tensors():
        w = torch.randn(8, 300, device="cuda")
        assert quant.fake_quantize(w, scheme).device == CUDA
        if scheme != "reference":
            q = quant.quantize(w, scheme)
            assert q.codes.device == q.scales.device == CUDA
            assert q.dequantize().device == q.element_scales().device == CUDA
            assert quant.absmax_listing(w, q.scheme.bits)[2].device == CUDA


def test_the_kv_head_and_its_rounding_bound_on_the_device():
    """KV-SCORES-BYTES compares the two steps against their bound, on the head's device."""
    with fake_cuda_tensors():
        head = kv.Head(64, device="cuda")
        (out_re, s_re), (out_c, s_c) = head.recompute(), head.cached()
        ratio = (out_re - out_c).abs().double() / (2 * kv.head_row_bound(head))
        assert ratio.device == s_re.device == s_c.device == CUDA


def test_a_random_cache_and_the_paged_pool_on_the_device():
    from transformers import Qwen2Config

    config = Qwen2Config(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=16, intermediate_size=32, vocab_size=64)
    with fake_cuda_tensors():
        cache = kv.random_cache(config, 8, torch.float32, "cuda")
        assert cache.layers[0].keys.device == CUDA
        pool = paging.PagedKVCache(4, 4, 1, 8, device="cuda", layers=1)
        pool.add("a")
        pool.append("a", torch.zeros(1, 3, 8, device="cuda"), torch.zeros(1, 3, 8, device="cuda"))
        k, v = pool.gather("a")
        assert k.device == v.device == CUDA


def test_the_paged_cache_of_a_model_takes_its_keys_on_the_device():
    """``paging.paged_cache``: the transformers cache the model writes to, its pool on the device; an update from the
    device's attention hands back the device's keys."""
    from transformers import Qwen2Config

    config = Qwen2Config(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=16, intermediate_size=32, vocab_size=64)
    with fake_cuda_tensors():
        cache = paging.paged_cache(config, num_blocks=4, block_size=4, device="cuda")
        k, v = cache.update(torch.zeros(1, 1, 3, 8, device="cuda"), torch.zeros(1, 1, 3, 8, device="cuda"), 0)
        assert k.device == v.device == CUDA


def test_the_asides_inputs_the_twins_ids_and_the_dot_product_bound_on_the_device():
    """``asides.qkv`` (the attention aside's inputs), ``kv_evidence.random_ids`` (the twin's prompts) and
    ``rounding.dot_bound`` (the a-priori bound of a matrix product, in float64 beside its inputs)."""
    with fake_cuda_tensors():
        q, k, v = asides.qkv(8, heads=2, head_dim=4, device="cuda")
        assert q.device == k.device == v.device == CUDA
        assert asides.explicit(q, k, v).device == asides.fused(q, k, v).device == CUDA
        assert kv_evidence.random_ids(5, "cuda").device == CUDA
        x, w = torch.randn(3, 16, device="cuda"), torch.randn(4, 16, device="cuda")
        bound = rounding.dot_bound(x, w, rounding.unit_roundoff(torch.float32), bias=torch.zeros(4, device="cuda"))
        assert bound.device == CUDA and bound.dtype == torch.float64


def test_the_read_probe_on_the_device():
    with fake_cuda_tensors():
        fn, nbytes = accel.read_callable(2**20, "cuda")
        assert fn().device == CUDA and nbytes == 2**20


def test_the_stream_probes_on_the_device():
    with fake_cuda_tensors():
        (copy, moved), (read, nbytes) = accel.stream_probes(2**20, "cuda")
        assert read().device == CUDA and (moved, nbytes) == (2**21, 2**20)


def test_the_suites_model_tests_feed_ids_on_the_models_device():
    """The model tests (test_batching_paging, test_quantization_lowbit) hand their ids over through ``hf.model_ids``: on a model whose
    parameters are on CUDA, the ids reach its embedding on CUDA, from a tensor or a list."""
    with fake_cuda_tensors(), torch.no_grad():  # no autograd: a CPU build of torch cannot record a fake CUDA leaf
        model = torch.nn.Embedding(64, 8, device="cuda").requires_grad_(False)
        for made in (torch.randint(0, 64, (1, 5)), [[1, 2, 3]]):
            ids = hf.model_ids(model, made)
            assert model(ids).device == CUDA  # raises on CPU ids, as the kernel would
            assert ids.device == CUDA and ids.dtype == torch.long
