"""The premise of every clocked claim: the step it times is bound by the device, not by the host that feeds it.

The chapter's cost models price a step by what the device does (bytes streamed, arithmetic). On a GPU a small step
(batch 1 of a 0.5 B model in eager transformers, one attention head) can be bound by the host instead: Python and
kernel launches, about 10-20 ms a step, while the device idles between kernels. A ratio of two such steps is a
ratio of launch counts, and judging it against the book would write false errata. So each clocked claim measures
its premise on the device it runs on (:func:`device_bound`) and the registry judges its timing checks only where
the premise holds (``when_found = "device_bound"``); where it fails the claim is *inconclusive*, with the numbers.

**The measurement (CUDA).** Each step is called between two CUDA events; the host's clock reads how long the call
takes to *enqueue* its work (until the call returns, no synchronisation), the events how long the device took from
the first event to the last. The device's time cannot be much below the host's enqueue time (the last event is
queued after the call returns), and where the device is the bottleneck the host finishes queuing early and the
device works through its queue: enqueue / device well below 1. Where the host is the bottleneck, the device waits
for each launch and the two are about equal. The premise holds when the median enqueue time is at most
:data:`HOST_SHARE` of the median device time for every step probed: then the device is busy for at least the other
half of the step with work already queued, so the step's time is the device's work, not the host's. Assumption: the
step does not synchronise inside (a ``.item()``, a host copy, ``generate``'s per-token stopping check): one that
does makes the host wait on the device, and reads as host-bound, which leaves its claim inconclusive (never an
erratum): a conservative premise.

**On a CPU** the host runs the step itself: nothing is queued, the clock that times the step is the device's own,
and the premise holds by construction of the measurement (the record says so); nothing is measured.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

#: The premise holds where the host's enqueue time is at most this share of the device's time (see the module doc).
HOST_SHARE = 0.5
#: Calls of each step whose medians decide (after one warm-up call).
ROUNDS = 5
CPU_WHY = ("on a CPU the host runs the step itself: nothing is queued and the clock that times the step is the "
           "device's own, so the step is device-bound by construction of the measurement (nothing was measured)")

#: ``timer(fn, device) -> (enqueue seconds, device seconds)`` of one call.
Timer = Callable[[Callable[[], object], torch.device], tuple[float, float]]


def enqueue_and_device(fn: Callable[[], object], device: torch.device | str) -> tuple[float, float]:
    """One call of ``fn`` on a CUDA ``device``: (seconds until the call returned, seconds between its CUDA events)."""
    torch.cuda.synchronize(device)
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        enqueue = time.perf_counter() - t0
        end.record()
        end.synchronize()
    return enqueue, start.elapsed_time(end) / 1e3


@dataclass
class Premise:
    """Whether the probed steps are device-bound, with each step's median (enqueue, device) seconds."""

    holds: bool | None  # None: nothing was probed where something had to be (a harness gap: the claim fails)
    steps: dict[str, tuple[float, float]] = field(default_factory=dict)
    why: str = ""

    def measured(self) -> dict[str, object]:
        """Measured values for the claim: ``device_bound``, its ``device_bound_why`` and the worst step's numbers."""
        out: dict[str, object] = {"device_bound": self.holds, "device_bound_why": self.why}
        if self.steps:
            name, (enqueue, device) = max(self.steps.items(), key=lambda kv: kv[1][0] / kv[1][1] if kv[1][1] > 0 else float("inf"))
            out.update(host_share=enqueue / device if device > 0 else float("inf"), host_share_step=name,
                       host_enqueue_s=enqueue, device_step_s=device)
        return out

    def __and__(self, other: "Premise") -> "Premise":
        """Both premises (two timed blocks of one claim): holds where both hold."""
        holds = None if None in (self.holds, other.holds) else self.holds and other.holds
        return Premise(holds, {**self.steps, **other.steps}, "; ".join(w for w in (self.why, other.why) if w and w != CPU_WHY) or CPU_WHY)


def device_bound(steps: Mapping[str, Callable[[], object]], device: torch.device | str, rounds: int = ROUNDS,
                 timer: Timer | None = None) -> Premise:
    """The premise for ``steps`` (name -> one call of the timed step) on ``device``: see the module doc.

    ``timer`` replaces the CUDA measurement (a test's fake device); without one a CPU holds by construction."""
    device = torch.device(device)
    if timer is None and device.type != "cuda":
        return Premise(True, {}, CPU_WHY)
    if not steps:
        return Premise(None, {}, f"no step was probed on {device}: the claim's test measured no premise")
    timer = timer or enqueue_and_device
    found: dict[str, tuple[float, float]] = {}
    with torch.inference_mode():
        for name, fn in steps.items():
            fn()  # warm-up: lazy initialisation and the allocator, outside the premise as outside the clock
            calls = [timer(fn, device) for _ in range(rounds)]
            found[name] = (statistics.median(c[0] for c in calls), statistics.median(c[1] for c in calls))
    bound = {name: e <= HOST_SHARE * d for name, (e, d) in found.items()}
    numbers = ", ".join(f"{name}: host enqueue {e * 1e3:.3g} ms of a {d * 1e3:.3g} ms device step ({e / d if d > 0 else float('inf'):.2f})"
                        for name, (e, d) in found.items())
    host = [name for name, ok in bound.items() if not ok]
    if host:
        why = (f"host-bound on {device}: the host's enqueue time exceeds {HOST_SHARE:g} of the device's time for {', '.join(host)} "
               f"(medians of {rounds} calls: {numbers}); the step times launches and Python, not the device's memory or arithmetic, "
               "so its ratios cannot test the chapter's cost model here: measure with a larger batch or a compiled (CUDA graph) step")
    else:
        why = f"device-bound on {device}: the host's enqueue time is at most {HOST_SHARE:g} of the device's time (medians of {rounds} calls: {numbers})"
    return Premise(not host, found, why)


# ------------------------------------------------------------------------------------------------
# sizing a step from the launch floor (CUDA): the premise made to hold by the step's size, not assumed of a constant
# ------------------------------------------------------------------------------------------------

#: A step sized from the launch floor must take at least this many floors of device time. Its enqueue time is about one
#: floor (a longer prompt launches the same kernels), so its host share is then at most 1 / FLOOR_FACTOR: half of
#: :data:`HOST_SHARE`, the premise met with a factor of two to spare for the floor's own noise.
FLOOR_FACTOR = 2 / HOST_SHARE


def launch_floor(step: Callable[[], object], device: torch.device | str, rounds: int = ROUNDS, timer: Timer | None = None) -> float:
    """The host's launch floor on ``device``: the median seconds the host takes to enqueue ``step``, a step too small to
    keep the device busy (one decode step of batch 1: every kernel of the model launched once, each on a row)."""
    timer = timer or enqueue_and_device
    with torch.inference_mode():
        step()  # warm-up, as in device_bound
        return statistics.median(timer(step, torch.device(device))[0] for _ in range(rounds))


@dataclass
class Sized:
    """A length chosen from the launch floor: the step at ``length`` took ``device_s`` of device time against ``floor_s``."""

    length: int
    floor_s: float
    device_s: float
    capped: bool  # the limit came first: the step is as long as the model allows, and the premise decides the rest
    why: str

    def measured(self, name: str) -> dict[str, object]:
        return {f"{name}": self.length, f"{name}_floor_s": self.floor_s, f"{name}_device_s": self.device_s, f"{name}_why": self.why}


def sized_length(make_step: Callable[[int], Callable[[], object]], device: torch.device | str, floor: float, start: int, limit: int,
                 factor: float = FLOOR_FACTOR, rounds: int = 3, timer: Timer | None = None) -> Sized:
    """The shortest length ``start`` x 2^k, at most ``limit`` (the model's context, less what the claim generates after
    it), whose step ``make_step(length)`` takes at least ``factor`` x ``floor`` seconds of device time (median of
    ``rounds`` calls after a warm-up). Where the limit comes first, the limit (``capped``): the step is then as long as
    the model allows, and the claim's premise (:func:`device_bound`) says whether that is enough."""
    if limit < 1:
        raise ValueError(f"sized_length: no length fits below a limit of {limit}")
    timer, device = timer or enqueue_and_device, torch.device(device)
    length = min(start, limit)
    while True:
        step = make_step(length)
        with torch.inference_mode():
            step()
            took = statistics.median(timer(step, device)[1] for _ in range(rounds))
        if took >= factor * floor or length >= limit:
            break
        length = min(2 * length, limit)
    capped = took < factor * floor
    why = (f"{length} tokens: the shortest of {start} x 2^k whose step takes at least {factor:g} launch floors of device time "
           f"({took * 1e3:.3g} ms against a floor of {floor * 1e3:.3g} ms, the host's enqueue time of one decode step)")
    if capped:
        why = (f"{length} tokens, the model's limit: its step takes {took * 1e3:.3g} ms of device time, under {factor:g} launch floors "
               f"of {floor * 1e3:.3g} ms; the premise decides whether the claim can be judged")
    return Sized(length, floor, took, capped, why)
