"""Each certain defect of issue 41 has a CPU test, green as the code is, and a fault of the device path
(:mod:`cheapinfer.faults.device`) that puts the defect back at its narrowest point and turns that test red, in the
way the defect fails on a GPU: the tests are not true by construction.

Each body below is the defect's own test (in test_device_selection, test_fake_cuda_pass, test_accel, test_premise),
run once as it is (green) and once under its fault (red, with the error the defect gives).
"""

from __future__ import annotations

import pytest
import test_accel as accel_tests
import test_device_selection as selection
import test_fake_cuda_pass as fake_pass
import test_premise as premises
from fake_cuda import FakeCuda
from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError

from cheapinfer.faults import device as device_faults
from cheapinfer.runtime.device import DeviceUnavailable


def _two_cards(monkeypatch) -> FakeCuda:
    monkeypatch.delenv("CHEAPINFER_DEVICE", raising=False)
    return FakeCuda(count=2, current=1).install(monkeypatch)


#: defect -> (its fault, its CPU test's body given ``monkeypatch``, what the defect raises in that test)
#: (set_device's: torch's own refusal, in the one line pick gives it)
DEFECTS = {
    "set_device without an index": ("set-device-without-index", lambda mp: selection.test_pick_selects_an_indexed_cuda_device(
        _two_cards(mp), mp, "cuda", None, "cuda:1"), (DeviceUnavailable, "specified index")),
    "NF4 codebook on the CPU": ("nf4-codebook-on-the-cpu", lambda mp: fake_pass.test_quantizers_stay_on_the_weights_device("nf4"),
                                FakeTensorDeviceMismatchError),
    "KV-SCORES-BYTES bound on the CPU": ("kv-bound-on-the-cpu", lambda mp: fake_pass.test_the_kv_head_and_its_rounding_bound_on_the_device(),
                                         FakeTensorDeviceMismatchError),
    "ids on the CPU for a GPU model": ("ids-on-the-cpu", lambda mp: fake_pass.test_the_suites_model_tests_feed_ids_on_the_models_device(),
                                       FakeTensorDeviceMismatchError),
    "ROCm taken for CUDA": ("rocm-taken-for-cuda", accel_tests.test_a_rocm_build_is_recorded_as_rocm_not_as_a_cpu_build, AssertionError),
    "bf16 below sm80 not refused": ("bf16-below-sm80", lambda mp: selection.test_bf16_twin_needs_an_ampere_card(
        _two_cards(mp), mp, (7, 5), True), AssertionError),
    "LLM.int8() below sm75 not gated": ("llm-int8-below-sm75", lambda mp: selection.test_llm_int8_needs_a_turing_card(
        _two_cards(mp), mp, (7, 0), True), AssertionError),
    "host-bound premise missing": ("host-bound-premise-missing",
                                   lambda mp: premises.test_a_host_bound_step_is_inconclusive_not_deviates("KV-DECODE-MEMBOUND"), AssertionError),
}


def test_every_device_fault_guards_a_defect():
    assert sorted(fault for fault, _, _ in DEFECTS.values()) == sorted(device_faults.FAULTS)


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_each_device_fault_turns_its_defects_cpu_test_red(defect, monkeypatch):
    name, body, raised = DEFECTS[defect]
    raised, match = raised if isinstance(raised, tuple) else (raised, None)
    body(monkeypatch)  # green as the code is
    with monkeypatch.context() as mp, device_faults.FAULTS[name].activate(), pytest.raises(raised, match=match):
        body(mp)  # red with the defect put back
