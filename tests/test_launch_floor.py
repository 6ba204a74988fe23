"""Prompt lengths of the clocked claims on CUDA, sized from a measured launch floor (cheapinfer.runtime.premise.sized_length).

The GPU is simulated: the fake CUDA machine (tests/fake_cuda.py) answers device selection, and a timer stands for the CUDA
events: the host enqueues every step in ``floor`` seconds (the launch floor; a longer prompt launches the same kernels),
and the device works ``per_token`` seconds for each token the step's forward was fed (read by a forward pre-hook), or
waits for the host where that is less. The steps themselves run on the CPU, on a small Qwen2.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fake_cuda import FakeCuda

from cheapinfer.chapter.kv_cache import kv, kv_macs
from cheapinfer.runtime import device as devices
from cheapinfer.runtime import premise

PER_TOKEN = 1e-4  # seconds of device work per prompt token
FREE = 1 << 40  # bytes the simulated card has free: no bound


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    return kv_macs.tiny_model(dataclasses.replace(kv_macs.tiny_arch(), max_position=1024)).eval()


def simulated_gpu(model, floor: float):
    """A timer of (enqueue, device) seconds for one call on a GPU whose launch floor is ``floor``."""
    fed = []
    model.register_forward_pre_hook(lambda module, args, kwargs: fed.append((kwargs.get("input_ids") if args == () else args[0]).shape[1]),
                                    with_kwargs=True)

    def timer(fn, device):
        assert torch.device(device).type == "cuda"
        fed.clear()
        fn()
        return floor, max(floor, sum(fed) * PER_TOKEN) + 1e-6

    return timer


@pytest.fixture
def gpu(monkeypatch):
    """The fake CUDA machine; the device the suite selects on it."""
    FakeCuda(count=1).install(monkeypatch)
    return devices.pick("cuda")


def test_a_cpu_keeps_its_constant(small):
    """On a CPU nothing is measured and the claims' CPU lengths stay what they were."""
    sized = kv.sized_prompt(small, "cpu", cpu=4, start=256, reserve=48)
    assert (sized.length, sized.floor_s, sized.capped) == (4, 0.0, False)


def test_the_prompt_clears_the_floor_by_the_stated_factor(small, gpu):
    """The shortest start x 2^k whose prefill takes FLOOR_FACTOR floors of device time: 2 ms floor x 4 / 0.1 ms = 80 tokens -> 128."""
    sized = kv.sized_prompt(small, gpu, cpu=4, start=16, reserve=48, timer=simulated_gpu(small, 0.002), free_bytes=FREE)
    assert sized.length == 128 and not sized.capped
    assert sized.device_s >= premise.FLOOR_FACTOR * sized.floor_s
    assert sized.floor_s == 0.002 and "launch floors" in sized.why


def test_a_bigger_floor_gives_a_longer_prompt_bounded_by_the_context(small, gpu):
    lengths = [kv.sized_prompt(small, gpu, cpu=4, start=16, reserve=48, timer=simulated_gpu(small, floor), free_bytes=FREE).length
               for floor in (0.0005, 0.002, 0.008)]
    assert lengths == sorted(lengths) and len(set(lengths)) == 3, lengths
    capped = kv.sized_prompt(small, gpu, cpu=4, start=16, reserve=48, timer=simulated_gpu(small, 1.0), free_bytes=FREE)
    assert capped.capped and capped.length == small.config.max_position_embeddings - 48
    assert "the model's limit" in capped.why


def test_the_prompt_is_bounded_by_the_memory_its_logits_take(small, gpu):
    """Logits of 300 positions (256 x 4 B each) fill a quarter of the free bytes: no longer prompt, whatever the floor;
    a claim that runs 8x the sized length (span) gets an eighth of it."""
    free = int(300 * small.config.vocab_size * 4 / kv.LOGITS_SHARE_OF_FREE)
    for span, top in ((1, 300), (8, 37)):
        sized = kv.sized_prompt(small, gpu, cpu=4, start=16, reserve=48, span=span, timer=simulated_gpu(small, 1.0), free_bytes=free)
        assert sized.capped and sized.length == top


def test_sized_length_refuses_a_limit_below_one():
    with pytest.raises(ValueError, match="no length fits"):
        premise.sized_length(lambda n: (lambda: None), "cuda:0", 0.001, 8, 0, timer=lambda fn, d: (0.001, 0.001))


def test_the_floor_is_the_median_enqueue_time_of_a_small_step():
    """launch_floor reads the host's side of the CUDA timer only, after a warm-up call, median of its rounds."""
    calls, enqueues = [], iter([0.003, 0.001, 0.002, 0.009, 0.002])
    floor = premise.launch_floor(lambda: calls.append(1), "cuda:0", timer=lambda fn, d: (fn(), next(enqueues), 0.5)[1:])
    assert floor == 0.002 and len(calls) == 1 + premise.ROUNDS
