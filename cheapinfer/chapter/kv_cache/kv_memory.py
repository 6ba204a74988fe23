"""KV-MEMORY-8.3X's peaks taken apart: the logits' bytes against the cache and everything else.

A peak above the resident weights says how much memory a generation needs, not what that memory holds.
:class:`PeakParts` is :class:`cheapinfer.runtime.accel.LivePeak` that also keeps, at its peak, the live
tensors by what they are:

- ``logits``: storage that the model's output embedding (``model.get_output_embeddings()``) produced,
  tagged by a forward hook as each output is created;
- ``cache``: storage that a transformers cache holds after a forward (tagged by a hook on the model's
  forward), and a cache resident before the block, held as live from its start (:meth:`PeakParts.hold`),
  so that a step that copies it into a longer one counts the old copy only while it lives;
- ``rest``: everything else created inside the block (activations, ids, masks).

Nothing is computed from shapes: a byte counts as logits because the head's output occupied it at the peak.

Usable without pytest::

    from cheapinfer.chapter import kv_memory
    from cheapinfer.runtime import models
    twin = models.twin("fp32")
    kv_memory.generation_peaks(twin.model, total=256, prompt=16)   # bytes of each peak, by part
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch

from ...runtime import hf
from ...runtime.accel import LivePeak
from . import kv
from .kv_evidence import random_ids

PARTS = ("logits", "cache", "rest")


class PeakParts(LivePeak):
    """:class:`LivePeak` that remembers which storages were live at its peak, and what each was (:data:`PARTS`)."""

    def __init__(self):
        super().__init__()
        self._serial: dict[int, int] = {}  # live storage key -> serial number of that storage (keys are reused; serials are not)
        self._tags: dict[int, str] = {}  # serial -> part, kept after the storage is freed
        self._next = 0
        self._base: frozenset[int] = frozenset()
        self.at_peak: dict[int, int] = {}  # serial -> bytes of each storage live at the peak

    def _snapshot(self) -> None:
        self.at_peak = {self._serial[k]: size for k, size in self._sizes.items()}

    def _track(self, t: torch.Tensor, input_storages: set[int]) -> None:
        key, before = t.untyped_storage().data_ptr(), self.peak
        fresh = key not in self._owners
        super()._track(t, input_storages)
        if fresh and key in self._owners:
            self._serial[key], self._next = self._next, self._next + 1
        if self.peak > before:
            self._snapshot()

    def _release(self, key: int, tid: int) -> None:
        super()._release(key, tid)
        if key not in self._owners:
            self._serial.pop(key, None)

    def restart(self) -> int:
        """A new peak from what is live now; what is live now is left out of :meth:`parts` (it was there before)."""
        live = super().restart()
        self._snapshot()
        self._base = frozenset(self.at_peak)
        return live

    def tag(self, tensors: Iterable[torch.Tensor], part: str) -> None:
        """Mark the storage of each tracked tensor as ``part``; storage made before the block is not tracked and stays untagged."""
        for t in tensors:
            serial = self._serial.get(t.untyped_storage().data_ptr())
            if serial is not None:
                self._tags[serial] = part

    def hold(self, tensors: Iterable[torch.Tensor], part: str) -> None:
        """Count tensors made before the block (a resident cache) as live from now until they are freed, as ``part``."""
        for t in tensors:
            self._track(t, set())
            self.tag([t], part)

    def parts(self) -> dict[str, int]:
        """Bytes live at the peak by part (:data:`PARTS`), leaving out what was live at the last :meth:`restart`."""
        out = dict.fromkeys(PARTS, 0)
        for serial, size in self.at_peak.items():
            if serial not in self._base:
                out[self._tags.get(serial, "rest")] += size
        return out


def logits_module(model) -> torch.nn.Module:
    """The module whose output is the logits: the output embedding (the LM head)."""
    return model.get_output_embeddings()


@contextlib.contextmanager
def tagging(model, tracker: PeakParts) -> Iterator[PeakParts]:
    """Hooks that tag, as the model runs, its head's outputs as logits and the cache each forward returns as cache."""

    def head(module, inputs, output):
        tracker.tag([output], "logits")

    def whole(module, inputs, output):
        cache = hf.output_cache(output)
        if cache is not None:
            tracker.tag(kv.dynamic_cache_tensors(cache), "cache")

    hooks = [logits_module(model).register_forward_hook(head), model.register_forward_hook(whole)]
    try:
        yield tracker
    finally:
        for h in hooks:
            h.remove()


def _peak(run, model, resident=None) -> dict[str, int]:
    with PeakParts() as tracker, tagging(model, tracker):
        if resident is not None:
            tracker.hold(kv.dynamic_cache_tensors(resident), "cache")
        run(tracker)
    parts = tracker.parts()
    return {**parts, "total": sum(parts.values())}


def uncached_last_step(model, ids: torch.Tensor) -> dict[str, int]:
    """The largest step of the suite's uncached generation (:func:`kv.greedy_uncached`): the second of two steps from
    ``ids`` [1, t], a forward over t + 1 tokens; bytes created in it and live at its peak, by part."""

    def run(tracker: PeakParts) -> None:
        kv.greedy_uncached(model, ids, 2, lambda k: tracker.restart() if k == 1 else None)

    return _peak(run, model)


def cached_prefill(model, ids: torch.Tensor) -> dict[str, int]:
    """The cached generation's prefill of ``ids`` and its first token (:func:`kv.greedy_cached`), by part."""
    return _peak(lambda tracker: kv.greedy_cached(model, ids, 1), model)


def cached_step(model, context: int) -> dict[str, int]:
    """One decode step against a resident cache of ``context`` tokens (random keys and values: a step's bytes do not
    depend on them): the cache is counted as live from the start, and the step's longer copy of it replaces it as the
    step goes, so the peak holds the cache once, plus a layer's copy in flight, the step's logits and its activations."""
    p = next(model.parameters())
    cache = kv.random_cache(model.config, context, p.dtype, p.device)
    step = kv.decode_step(model, cache, context)
    return _peak(lambda tracker: step(), model, resident=cache)


def generation_peaks(model, total: int = 256, prompt: int = 16) -> dict[str, object]:
    """The peaks of generating ``total`` tokens from a ``prompt``-token prompt, by part, at each generation's largest
    step: uncached, the step that yields token ``total`` (a forward over ``total`` - 1 tokens); cached, the larger of
    its prefill and a step against a ``total`` - 1 token cache.

    Returns ``uncached_<part>_bytes`` and ``cached_<part>_bytes`` for each of :data:`PARTS`, their totals, the ratio of
    the totals, each peak's logits share, whether the cached peak is its prefill's, and ``prompt_for_ratio(r)``'s input.
    """
    with torch.inference_mode():
        p = next(model.parameters())
        ids = random_ids(total - 2, p.device, vocab=min(32_000, model.config.vocab_size))
        uncached = uncached_last_step(model, ids)
        pre = cached_prefill(model, ids[:, :prompt])
        step = cached_step(model, total - 1)
    cached = pre if pre["total"] >= step["total"] else step
    out: dict[str, object] = {}
    for name, peak in (("uncached", uncached), ("cached", cached), ("prefill", pre), ("step", step)):
        out.update({f"{name}_{part}_bytes": peak[part] for part in PARTS})
        out[f"{name}_bytes"] = peak["total"]
    out.update(ratio=uncached["total"] / cached["total"], cached_peak_at_prefill=pre["total"] >= step["total"],
               uncached_logits_share=uncached["logits"] / uncached["total"], cached_logits_share=cached["logits"] / cached["total"],
               prompt=prompt, total=total)
    return out


def prompt_for_ratio(peaks: dict, ratio: float) -> float | None:
    """The prompt length at which the uncached peak is ``ratio`` times the cached one, where the cached peak is its
    prefill's and scales with the prompt as the prefill's bytes do (every part of a prefill, its logits included, is
    one row per prompt token). None where that prompt's prefill would sit below the decode step's peak (the ratio is
    then the step's, whatever the prompt)."""
    prefill_per_token = peaks["prefill_bytes"] / peaks["prompt"]
    tokens = peaks["uncached_bytes"] / ratio / prefill_per_token
    return tokens if tokens * prefill_per_token >= peaks["step_bytes"] else None


def parts_table(peaks: dict) -> tuple[str, list[str], list[list[str]]]:
    """A report table of what each peak holds (MiB), with each one's logits share: (title, header, rows)."""
    mib = 2**20
    rows = [[name, *(f"{peaks[f'{name}_{part}_bytes'] / mib:.3f}" for part in PARTS), f"{peaks[f'{name}_bytes'] / mib:.3f}",
             f"{peaks[f'{name}_logits_bytes'] / peaks[f'{name}_bytes']:.3f}"] for name in ("uncached", "prefill", "step")]
    at = "prefill" if peaks["cached_peak_at_prefill"] else "decode step"
    return f"What each peak holds, by the tensors live at it (MiB; the cached peak is its {at}'s)", ["peak", *PARTS, "total", "logits share"], rows


def reported(peaks: dict, ratio: float) -> tuple[dict[str, object], str]:
    """The record's quantities of a breakdown (each peak's parts, totals and shares, and the prompt that would give the
    book's ``ratio``), and a sentence on that prompt."""
    prompt = prompt_for_ratio(peaks, ratio)
    out: dict[str, object] = {f"{name}_{part}_bytes": peaks[f"{name}_{part}_bytes"] for name in ("uncached", "cached") for part in PARTS}
    out.update(uncached_traced_bytes=peaks["uncached_bytes"], cached_traced_bytes=peaks["cached_bytes"],
               uncached_logits_share=peaks["uncached_logits_share"], cached_logits_share=peaks["cached_logits_share"],
               cached_peak_at_prefill=peaks["cached_peak_at_prefill"], prompt_for_book_ratio=prompt)
    said = (f"the uncached peak is {peaks['uncached_bytes'] / peaks['prefill_bytes'] * peaks['prompt']:.0f} prefill tokens' worth of the "
            f"cached one's bytes: a ratio of {ratio:g} needs a prompt of "
            + (f"{prompt:.0f} tokens" if prompt else "no length (the decode step sets the cached peak)") + "; the book prints none")
    return out, said
