"""Section 2, batching: static and continuous batching run for real.

:func:`run_policies` runs both policies of :mod:`cheapinfer.chapter.batching.workload`'s scheduling model over real
decode steps of a model, with a real batched KV cache whose rows are refilled (continuous) or padded
(static); :func:`validate` runs both and simulates both with step costs probed on the same model during
the run, so the simulation can be checked against reality.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ... import SEED
from ...runtime import hf
from ...runtime.device import sync
from . import batching, workload

#: Tokens of history each probe step's cache holds (per occupied slot). Every probe call feeds one token and crops
#: it again, so every traced probe forward holds exactly this many: BAT-STATIC-CONT's ``probe_history_tokens``.
PROBE_CONTEXT = 8

# ----------------------------------------------------------------------------------------------
# static vs continuous batching: the real run
# ----------------------------------------------------------------------------------------------


class SlotBatch:
    """A real batched KV cache over occupied slots, for one model.

    Rows are requests; keys and values live in a transformers ``DynamicCache`` ([B, H_kv, C, D]
    per layer), left-padded: every row appends at the same column, and ``mask`` [B, C] marks the
    columns a row may attend to. A row admitted mid-flight starts with all older columns masked
    and position 0; columns no row attends to any more are cut away after each step.
    """

    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = hf.new_cache(model.config)
        self.requests: list[int] = []
        self.left: list[int] = []  # tokens still to generate, per row
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [B, C]
        self.pos = torch.zeros(0, dtype=torch.long, device=self.device)  # [B] next position
        self.tokens = torch.zeros(0, dtype=torch.long, device=self.device)  # [B] next input token

    def __len__(self) -> int:
        return len(self.requests)

    def admit(self, request: int, length: int, prompt_token: int, row: int | None = None) -> None:
        """Put ``request`` in ``row`` (a finished row is reused) or in a new row."""
        tok = torch.tensor([prompt_token], device=self.device)
        if row is None:
            if self.cache.get_seq_length() > 0:
                self._select(list(range(len(self))) + [0])  # a new row: a copy of row 0, then reset
            else:
                self.mask = torch.zeros(len(self) + 1, 0, dtype=torch.long, device=self.device)
                self.pos = torch.cat([self.pos, self.pos.new_zeros(1)])
                self.tokens = torch.cat([self.tokens, tok])
                self.requests.append(request)
                self.left.append(length)
                return
            row = len(self) - 1
            self.requests.append(request)
            self.left.append(length)
        self.requests[row], self.left[row] = request, length
        self.mask[row] = 0
        self.pos[row] = 0
        self.tokens[row] = tok[0]

    def _select(self, rows: list[int]) -> None:
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        if self.cache.get_seq_length() > 0:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        self.mask, self.pos, self.tokens = self.mask[idx], self.pos[idx], self.tokens[idx]

    def drop(self, rows: list[int]) -> None:
        keep = [i for i in range(len(self)) if i not in set(rows)]
        self._select(keep)
        self.requests = [self.requests[i] for i in keep]
        self.left = [self.left[i] for i in keep]

    def step(self) -> list[int]:
        """One decode step for every row; returns the rows whose request just finished."""
        mask = torch.cat([self.mask, self.mask.new_ones(len(self), 1)], dim=1)  # [B, C + 1]
        with torch.inference_mode():
            out = batching.step_forward(self.model, self.tokens[:, None], self.cache, self.pos[:, None], mask)
        self.tokens = out.logits[:, -1].argmax(-1)  # [B] greedy
        self.mask, self.pos = mask, self.pos + 1
        self.left = [n - 1 for n in self.left]
        live = self.mask.any(dim=0)  # columns some row still attends to
        first = int(live.int().argmax()) if bool(live.any()) else self.mask.shape[1]
        if first > 0:
            for layer in self.cache.layers:
                if layer.keys is not None:  # a layer the forward never wrote holds nothing to cut (its cache was not used)
                    layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            self.mask = self.mask[:, first:]
        return [i for i, n in enumerate(self.left) if n <= 0]


def policy_steps(model, policy: str, lengths: Sequence[int], slots: int, prompts: Sequence, out: workload.PolicyResult, new_batch: Callable[[], object] | None = None):
    """The real scheduler as a generator: one decode step (plus its bookkeeping) per ``next``.

    Time is this policy's own clock: the wall-clock time of its steps only (device synced), so two
    policies advanced alternately share the machine's load alike. Results are written into ``out``.
    ``new_batch()`` makes the batch the scheduler fills (default: a :class:`SlotBatch`; a
    :class:`PagedSlotBatch` runs the same schedule on the paged cache).
    """
    dev = next(model.parameters()).device
    clock = 0.0
    new_batch = new_batch or (lambda: SlotBatch(model))

    def timed_step(batch: SlotBatch) -> list[int]:
        nonlocal clock
        sync(dev)
        t = time.perf_counter()
        finished = batch.step()
        sync(dev)
        took = time.perf_counter() - t
        clock += took
        out.step_s.append(took)
        out.steps += 1
        return finished

    if policy == "static":
        for g in range(0, len(lengths), slots):
            group = list(range(g, min(g + slots, len(lengths))))
            longest = max(lengths[r] for r in group)
            batch, start = new_batch(), clock
            for r in group:
                batch.admit(r, lengths[r], prompts[r])
            for _ in range(longest):  # finished rows keep decoding: padding
                timed_step(batch)
                yield
            out.padded_slot_steps += sum(longest - lengths[r] for r in group)
            for r in group:
                out.latency_s[r], out.service_s[r] = clock, clock - start
    elif policy == "continuous":
        queue = list(range(len(lengths)))[::-1]
        admitted = [0.0] * len(lengths)
        batch = new_batch()
        while queue and len(batch) < slots:
            r = queue.pop()
            batch.admit(r, lengths[r], prompts[r])
        while len(batch):
            finished = timed_step(batch)
            for row in finished:
                r = batch.requests[row]
                out.latency_s[r], out.service_s[r] = clock, clock - admitted[r]
            refill = finished[: len(queue)]  # more rows may finish in one step than requests are queued
            for row in refill:  # a freed slot admits the next queued request at the next step
                r = queue.pop()
                batch.admit(r, lengths[r], prompts[r], row=row)
                admitted[r] = clock
            if len(refill) < len(finished):
                batch.drop([row for row in finished if row not in refill])
            yield
    else:
        raise ValueError(f"policy must be static or continuous, not {policy!r}")
    out.makespan_s = clock


def run_policies(
    model,
    lengths: Sequence[int],
    slots: int,
    policies: Sequence[str] = ("static", "continuous"),
    probe_context: int = PROBE_CONTEXT,
    seed: int = SEED,
    trace=None,
) -> tuple[dict[str, workload.PolicyResult], dict[int, list[float]]]:
    """Static and continuous batching for real: real decode steps, a real batched cache, measured times.

    Each request's prompt is one seeded random token; it generates exactly ``lengths[r]`` tokens
    greedily (end-of-sequence ignored). The policies advance interleaved and paced so that they
    span the same stretch of wall-clock time (at each tick the policy least far through its steps
    moves; the step counts are known in advance, the schedule being deterministic), and after
    each tick one probe step of k = 1..slots occupied slots (round-robin, a ``probe_context``-token
    cache each) is timed: the per-step costs the simulation is fed come from the same stretch of
    time, so a change in the machine's load hits the real runs and the costs alike.
    Returns the results and the probe samples (seconds) per number of slots. ``trace``: a
    :class:`cheapinfer.runtime.hf.ForwardTrace` of ``model``, whose label is set to the policy (or ``"probe"``)
    whose forward runs.
    """
    prompts = torch.randint(0, model.config.vocab_size, (len(lengths),), generator=torch.Generator().manual_seed(seed)).tolist()
    unit = dict.fromkeys(range(1, slots + 1), 1.0)
    total = {p: workload.simulate(p, lengths, slots, unit).steps for p in policies}
    results = {p: workload.PolicyResult(p, 0.0, sum(lengths), 0, [0.0] * len(lengths), [0.0] * len(lengths), sum(lengths)) for p in policies}
    running = {p: policy_steps(model, p, lengths, slots, prompts, results[p]) for p in policies}
    probes = {k: batching.decode_step(model, k, probe_context, seed) for k in range(1, slots + 1)}
    label = (lambda name: setattr(trace, "label", name)) if trace is not None else (lambda name: None)
    label("probe")
    for k in probes:  # warm-up
        probes[k]()
    samples: dict[int, list[float]] = {k: [] for k in probes}
    dev = next(model.parameters()).device
    tick = 0
    while running:
        p = min(running, key=lambda name: results[name].steps / total[name])
        label(p)
        if next(running[p], StopIteration) is StopIteration:
            del running[p]
            continue
        label("probe")
        k = tick % slots + 1
        sync(dev)
        t = time.perf_counter()
        probes[k]()
        sync(dev)
        samples[k].append(time.perf_counter() - t)
        tick += 1
    return results, samples


@dataclass
class Validation:
    simulated: dict[str, float]
    real: dict[str, float]
    results: dict[str, workload.PolicyResult] = field(default_factory=dict)
    step_cost: dict[int, float] = field(default_factory=dict)  # seconds per step, by occupied slots
    evidence: dict[str, dict[str, object]] = field(default_factory=dict)  # cache use of each policy's steps and of the probes
    probes: dict[int, list[float]] = field(default_factory=dict)  # the probe steps' seconds, by occupied slots
    lengths: list[int] = field(default_factory=list)
    slots: int = 0

    @property
    def throughput_error(self) -> float:
        """Relative error of the simulated throughput ratio against the real one."""
        return abs(self.simulated["throughput_ratio"] - self.real["throughput_ratio"]) / self.real["throughput_ratio"]

    def noise(self) -> dict[str, float]:
        """Standard errors of the real throughput ratio and of the prediction error that the timing noise of this one
        run explains (the delta method; model error, the simulation's own bias, is not noise and is what the error measures):

        - one step's time has the relative noise the probes show: sigma, the median over occupancies of
          1.4826 MAD / median of that occupancy's probe times;
        - the real ratio is static time / continuous time (same tokens), each a sum of single steps with that
          noise, independent: its relative standard error is sigma sqrt(sum s_i^2 / S^2 + sum c_j^2 / C^2). Load that
          drifts over the run is not in it: the policies advance interleaved over the same stretch of time;
        - the simulated ratio moves with each occupancy's median probe cost by its standard error
          (:func:`cheapinfer.runtime.timing.robust_se`), summed in quadrature;
        - the prediction error |sim / real - 1| combines both.
        """
        from ...runtime.timing import robust_se

        s, c = self.results["static"], self.results["continuous"]
        cv = statistics.median(1.4826 * statistics.median(abs(x - statistics.median(v)) for x in v) / statistics.median(v)
                               for v in self.probes.values() if len(v) >= 2) if self.probes else math.inf
        S, C = sum(s.step_s), sum(c.step_s)
        real = S / C
        real_se = real * cv * math.sqrt(sum(x * x for x in s.step_s) / S**2 + sum(x * x for x in c.step_s) / C**2)
        sim = self.simulated["throughput_ratio"]
        moves = []
        for k, v in self.probes.items():
            se = robust_se(v)
            if not math.isfinite(se):
                return {"real_throughput_ratio_se": real_se, "prediction_error_se": math.inf, "step_noise": cv}
            moved = {**self.step_cost, k: self.step_cost[k] + se}
            moves.append(workload.compare(self.lengths, self.slots, moved)["throughput_ratio"] - sim)
        sim_se = math.sqrt(sum(m * m for m in moves))
        error_se = math.sqrt((sim_se / real) ** 2 + (sim * real_se / real**2) ** 2)
        return {"real_throughput_ratio_se": real_se, "prediction_error_se": error_se, "simulated_throughput_ratio_se": sim_se, "step_noise": cv}


def validate(model, lengths: Sequence[int], slots: int) -> Validation:
    """Run both policies for real, and simulate them with step costs probed on the same model during the run (medians).

    The run is traced (:class:`cheapinfer.runtime.hf.ForwardTrace`): each policy's steps and the probes prove they used their cache."""
    from ...runtime.evidence import cache_use
    from ...runtime.hf import ForwardTrace

    with ForwardTrace(model) as trace:
        runs, samples = run_policies(model, lengths, slots, trace=trace)
    evidence = {name: cache_use(model, trace.labelled(name)) for name in ("static", "continuous", "probe")}
    step_cost = {k: statistics.median(v) for k, v in samples.items()}
    sim = workload.compare(lengths, slots, step_cost)
    s, c = runs["static"], runs["continuous"]
    real = {**workload.ratios(s, c), "static_s": s.makespan_s, "continuous_s": c.makespan_s}
    return Validation(sim, real, {"static": s, "continuous": c}, step_cost, evidence, {k: list(v) for k, v in samples.items()}, list(lengths), slots)
