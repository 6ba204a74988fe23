"""KV-MEMORY-8.3X's breakdown of each peak: the logits' share is read from the tensors live at the peak, not assumed.

A small Qwen2 with a wide vocabulary (8,192 logits per position against a 64-wide hidden state) has the twin's
proportions, so its peaks hold what the twin's do, in a second on a CPU.
"""

import dataclasses

import pytest
import torch

from cheapinfer.chapter.kv_cache import kv, kv_macs, kv_memory
from cheapinfer.faults import core as runner
from cheapinfer.harness import registry

VOCAB, TOTAL, PROMPT = 8192, 64, 8


@pytest.fixture(scope="module")
def wide():
    torch.manual_seed(0)
    return kv_macs.tiny_model(dataclasses.replace(kv_macs.tiny_arch(), vocab=VOCAB)).eval()


def _bound(q: str) -> float:
    return next(c.bound for c in registry.get("KV-MEMORY-8.3X").checks if c.q == q)


def test_logits_are_the_heads_outputs_live_at_each_peak(wide):
    """The uncached peak holds one logit row per position of its forward (TOTAL - 1), the prefill one per prompt token."""
    peaks = kv_memory.generation_peaks(wide, TOTAL, PROMPT)
    assert peaks["uncached_logits_bytes"] == (TOTAL - 1) * VOCAB * 4
    assert peaks["prefill_logits_bytes"] == PROMPT * VOCAB * 4
    assert peaks["cached_peak_at_prefill"] and peaks["cached_logits_bytes"] == peaks["prefill_logits_bytes"]
    assert peaks["uncached_logits_share"] > _bound("uncached_logits_share")
    assert 0 < peaks["uncached_rest_bytes"] < peaks["uncached_logits_bytes"] / 10
    assert peaks["ratio"] == peaks["uncached_bytes"] / peaks["cached_bytes"]


def test_the_share_follows_the_tensors_a_forward_makes(wide):
    """A forward that keeps only the last position's logits (the catalogue's fault) moves the measured share: the
    breakdown reads what was created, so the same shapes of input give another split."""
    with runner.catalogue()["kv-forward-keeps-last-logits-only"].activate():
        peaks = kv_memory.generation_peaks(wide, TOTAL, PROMPT)
    assert peaks["uncached_logits_bytes"] <= VOCAB * 4
    assert peaks["uncached_logits_share"] < 0.5


def test_a_breakdown_that_tags_another_tensor_fails_the_share_check(wide):
    """The catalogue's kv-breakdown-tags-hidden-state: the hidden rows tagged as logits fall far below the bound."""
    with runner.catalogue()["kv-breakdown-tags-hidden-state"].activate():
        peaks = kv_memory.generation_peaks(wide, TOTAL, PROMPT)
    assert peaks["uncached_logits_share"] < _bound("uncached_logits_share")


def test_a_resident_cache_is_counted_once(wide):
    """A decode step copies its cache into a longer one layer by layer; the resident copy is held as live and freed as
    it is replaced, so the step's peak holds the cache once (plus one layer in flight), not the old and the new copy."""
    context = TOTAL - 1
    cache = kv.random_cache(wide.config, context, torch.float32, "cpu")
    once = kv.dynamic_cache_bytes(cache)
    step = kv_memory.cached_step(wide, context)
    layer = 2 * once // wide.config.num_hidden_layers  # one layer's keys and values, old and new
    assert once <= step["cache"] <= once * (context + 1) / context + layer
    assert step["cache"] < 2 * once
    assert step["total"] > step["cache"]


def test_tags_belong_to_a_storage_not_to_its_address():
    """A freed tensor's tag does not pass to a later one that reuses its memory; what was live at restart is left out."""
    with kv_memory.PeakParts() as parts:
        a = torch.ones(1000)
        parts.tag([a], "logits")
        del a
        b = torch.ones(2000)
    assert parts.parts() == {"logits": 0, "cache": 0, "rest": 8000}
    with kv_memory.PeakParts() as parts:
        kept = torch.ones(1000)
        parts.restart()
        c = torch.ones(500)
        parts.tag([c], "logits")
    assert parts.parts() == {"logits": 2000, "cache": 0, "rest": 0}
    del b, kept, c


def test_the_prompt_a_ratio_implies():
    """Prefill-bound: the prompt scales the cached peak; step-bound: no prompt gives the ratio (None)."""
    peaks = {"prefill_bytes": 1600, "prompt": 16, "uncached_bytes": 25_500, "step_bytes": 700}
    assert kv_memory.prompt_for_ratio(peaks, 8.5) == pytest.approx(30)
    assert kv_memory.prompt_for_ratio(peaks, 100) is None
