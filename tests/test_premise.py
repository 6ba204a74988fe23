"""The device-bound premise of the clocked claims (cheapinfer.runtime.premise): a host-bound step is inconclusive, never red."""

from __future__ import annotations

import time

import pytest

from cheapinfer.harness import numbers, registry, verdict, vocabulary
from cheapinfer.runtime import premise

#: The clocked claims the issue names, whose timing a GPU's launch floor would turn into false errata.
NAMED = ("KV-DECODE-MEMBOUND", "Q-BYTES-SPEED", "KV-HEAD-TIMING", "KV-SPEEDUP-48")


def gpu_timer(kernel_s: float):
    """A fake CUDA timer: the device runs ``kernel_s`` of work, queued while the host runs the step; the events
    see the longer of the host's enqueue and the device's work (the last event is queued after the call returns)."""

    def timer(fn, device):
        t0 = time.perf_counter()
        fn()
        enqueue = time.perf_counter() - t0
        return enqueue, max(enqueue, kernel_s) + 1e-5

    return timer


def sleeping_step(host_s: float):
    return lambda: time.sleep(host_s)


def passing(check: registry.Check):
    """A value that meets ``check`` (a shape check), for the checks a test does not look at."""
    b = check.bound
    if check.op in ("==", ">=", "<=") or not numbers.is_number(b):
        return b
    return b + 1 if check.op == ">" else b - 1


def judged(claim_id: str, clocked: dict[str, float], found: premise.Premise, device: str = "cuda:0") -> verdict.Judgement:
    """``claim_id`` judged on ``device`` with ``clocked`` (quantity -> value, each with a small standard error) where every
    other check passes, and the premise ``found``."""
    claim = registry.load()[claim_id]
    measured: dict[str, object] = {c.q: passing(c) for c in claim.checks if c.kind == "shape"}
    for q, v in clocked.items():
        measured[q], measured[f"{q}_se"] = v, 1e-3
    measured.update(found.measured())
    return verdict.judge(claim, measured, claim.runs_on[0], device)


#: Per claim: clocked values at a GPU's launch floor (the issue's figures), each beyond its bound by far more than its noise.
AT_THE_FLOOR = {
    "KV-DECODE-MEMBOUND": {"bandwidth_fraction": 0.05},
    "Q-BYTES-SPEED": {"speedup_16bit": 1.0},
    "KV-HEAD-TIMING": {"ratio_at_4096": 4.0},
    "KV-SPEEDUP-48": {"speedup": 1.1},
}


@pytest.mark.parametrize("claim_id", NAMED)
def test_a_host_bound_step_is_inconclusive_not_deviates(claim_id):
    host = premise.device_bound({"decode": sleeping_step(0.02)}, "cuda:0", rounds=3, timer=gpu_timer(0.002))
    assert host.holds is False and "host-bound" in host.why and host.measured()["host_share"] > premise.HOST_SHARE
    j = judged(claim_id, AT_THE_FLOOR[claim_id], host)
    assert j.verdict == vocabulary.INCONCLUSIVE, j.messages()
    assert any("device_bound" in m and "host-bound" in m for m in j.inconclusive_messages())
    # the same numbers from a device-bound step: the premise holds and the floor's values are judged, red
    device = premise.device_bound({"decode": sleeping_step(0.0005)}, "cuda:0", rounds=3, timer=gpu_timer(0.02))
    assert device.holds is True, device.why
    assert judged(claim_id, AT_THE_FLOOR[claim_id], device).verdict == vocabulary.DEVIATES


def test_on_a_cpu_the_premise_holds_by_construction_and_runs_nothing():
    ran = []
    found = premise.device_bound({"decode": lambda: ran.append(1)}, "cpu")
    assert found.holds is True and found.why == premise.CPU_WHY and not ran
    assert found.measured() == {"device_bound": True, "device_bound_why": premise.CPU_WHY}


def test_a_cuda_claim_without_a_probed_step_fails_its_premise_check():
    found = premise.device_bound({}, "cuda:0")
    assert found.holds is None
    assert judged("KV-DECODE-MEMBOUND", {"bandwidth_fraction": 0.9}, found).verdict == vocabulary.DEVIATES


def test_two_timed_blocks_hold_only_where_both_hold():
    ok, bad = premise.Premise(True, {"a": (1e-3, 1e-2)}, "a ok"), premise.Premise(False, {"b": (1e-2, 1e-2)}, "b host")
    assert (ok & bad).holds is False and (ok & ok).holds is True and set((ok & bad).steps) == {"a", "b"}


def test_every_clocked_claim_judges_its_timing_only_where_its_premise_holds():
    """Every noisy check (a quantity read from timing rounds or steps) is gated on its claim's device_bound, but the
    physical upper limits (over_read: a step cannot read its weights faster than memory streams), which a host floor
    can only help to meet."""
    clocked = {cid: c for cid, c in registry.load().items() if any(k.noise for k in c.checks)}
    assert set(NAMED) <= set(clocked)
    for cid, claim in clocked.items():
        premise_checks = [k for k in claim.checks if k.q == "device_bound"]
        assert premise_checks and premise_checks[0].measurable and premise_checks[0].requires == "cuda", cid
        for k in claim.checks:
            if k.noise and k.q != "over_read":
                assert "device_bound" in k.premises, f"{cid} {k.q}"


_PLUGIN_TEST = '''
import time

import pytest

from cheapinfer.runtime import premise

@pytest.fixture(autouse={fake_gpu})
def _fake_gpu(monkeypatch):
    """The run's device seen as a GPU whose kernels take 1 ms: the 20 ms step (a sleep: the host) binds. Undone after the
    test (the run shares this process with the tests that started it)."""
    real = premise.device_bound

    def on_a_fake_gpu(steps, device, **kw):
        def timer(fn, device):
            t0 = time.perf_counter()
            fn()
            enqueue = time.perf_counter() - t0
            return enqueue, max(enqueue, 0.001) + 1e-5

        return real(steps, "cuda:0", rounds=3, timer=timer)

    monkeypatch.setattr(premise, "device_bound", on_a_fake_gpu)


@pytest.mark.claim("KV-DECODE-FLAT")
def test_flat(claim, timed):
    step = lambda: time.sleep(0.02)
    timed({{"C=16": step, "C=1024": step}}, rounds=3, warmup=1)
    # a ratio far beyond its bound (1.25) and its noise: red wherever it is judged
    claim.verify("twin", step_ratio=2.0, step_ratio_se=0.01, cache_grows_by_one=True, logit_change_vs_no_context=1.0,
                 timed_forwards=1, timed_forwards_max=1)
'''


@pytest.mark.parametrize("fake_gpu", [True, False])
def test_through_the_plugin_a_host_bound_step_is_inconclusive_and_a_cpu_judges(pytester, fake_gpu):
    """The timed fixture measures the premise of the steps it timed and the claim's verdict reads it: on a (faked) GPU
    where a sleep in the step binds, inconclusive with the numbers; on the CPU, by construction, the ratio is judged."""
    import json

    from plugin_runs import run

    pytester.makepyfile(test_clocked=_PLUGIN_TEST.format(fake_gpu=fake_gpu))
    ran = run(pytester, "-q", "-rx", "--device", "cpu")
    result = json.loads((pytester.path / "reports" / "run.json").read_text())["claims"]["KV-DECODE-FLAT"]["results"][0]
    measured = result["measured"]
    if fake_gpu:
        assert ran.ret == 0 and "1 xfailed" in ran.stdout.str(), ran.stdout.str()[-2000:] + ran.stderr.str()[-2000:]
        assert result["verdict"] == vocabulary.INCONCLUSIVE and measured["device_bound"] is False
        assert "host-bound on cuda:0" in measured["device_bound_why"] and measured["host_share"] > premise.HOST_SHARE
    else:
        assert ran.ret == 1 and result["verdict"] == vocabulary.DEVIATES, ran.stdout.str()[-2000:]
        assert measured["device_bound"] is True and measured["device_bound_why"] == premise.CPU_WHY
