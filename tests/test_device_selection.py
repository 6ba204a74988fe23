"""Device selection on a CUDA machine, tested on a CPU (:mod:`fake_cuda`): ``auto``, ``cuda``, ``cuda:N`` and
``CHEAPINFER_DEVICE``, through ``pick``, ``verify --device cuda`` and the pytest plugin's configure.

``torch.cuda.set_device`` refuses a ``torch.device`` without an index; the fake keeps that rule, so a selection
that hands it plain ``cuda`` fails here as it would on the first GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fake_cuda import FakeCuda
from plugin_runs import suite

from cheapinfer import cli
from cheapinfer.audits import launch
from cheapinfer.runtime import device as devices

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.delenv("CHEAPINFER_DEVICE", raising=False)
    return FakeCuda(count=2, current=1).install(monkeypatch)


def test_the_fake_keeps_torchs_index_rule(fake):
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_device(torch.device("cuda"))


@pytest.mark.parametrize("requested, env, expected", [
    ("auto", None, "cuda:1"), ("cuda", None, "cuda:1"), ("cuda:0", None, "cuda:0"), ("cuda:1", None, "cuda:1"),
    ("auto", "cuda", "cuda:1"), ("auto", "cuda:0", "cuda:0"), ("auto", "cpu", "cpu"), ("cpu", "cuda", "cpu"),
])
def test_pick_selects_an_indexed_cuda_device(fake, monkeypatch, requested, env, expected):
    """Plain ``cuda`` (asked for, chosen by ``auto`` or by ``CHEAPINFER_DEVICE``) is the current card, with its index."""
    if env:
        monkeypatch.setenv("CHEAPINFER_DEVICE", env)
    got = devices.pick(requested)
    assert str(got) == expected
    assert fake.selected == ([] if expected == "cpu" else [got.index])


def test_pick_names_the_cards_there_are(fake):
    with pytest.raises(devices.DeviceUnavailable, match="cuda:0 to cuda:1"):
        devices.pick("cuda:2")


def test_a_card_that_cannot_be_selected_is_one_line(monkeypatch):
    FakeCuda(count=1, fail="CUDA error: all CUDA-capable devices are busy or unavailable\nmore").install(monkeypatch)
    with pytest.raises(devices.DeviceUnavailable) as err:
        devices.pick("cuda")
    assert "busy or unavailable" in str(err.value) and "\n" not in str(err.value)


def test_verify_device_cuda_starts_the_claims_on_the_indexed_card(fake, monkeypatch, tmp_path, capsys):
    started = []
    monkeypatch.setattr(cli.verify, "_run_interruptibly", lambda cmd, env: (started.append(cmd), (launch.NOTHING_SELECTED, False))[1])
    code = cli.main(["verify", "--device", "cuda", "--report-dir", str(tmp_path)])
    assert started, capsys.readouterr()
    assert code != 0 and "Traceback" not in capsys.readouterr().err
    cmd = started[0]
    assert cmd[cmd.index("--device") + 1] == "cuda:1"


def test_verify_on_a_card_that_fails_is_one_line(monkeypatch, tmp_path, capsys):
    FakeCuda(count=1, fail="CUDA error: initialization error").install(monkeypatch)
    assert cli.main(["verify", "--device", "cuda", "--report-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "initialization error" in err and "Traceback" not in err


@pytest.mark.parametrize("device, env", [("cuda", None), ("auto", None), ("cuda:1", None), ("auto", "cuda")])
def test_the_plugin_configures_on_a_cuda_machine(tmp_path, device, env, pytester, monkeypatch):
    """pytest with the suite's plugin on a (fake) two-card machine: configure selects the card, collection runs,
    no INTERNALERROR."""
    FakeCuda(count=2, current=0).install(monkeypatch)
    monkeypatch.delenv("CHEAPINFER_DEVICE", raising=False)
    if env:
        monkeypatch.setenv("CHEAPINFER_DEVICE", env)
    run = suite(pytester, f"--rootdir={ROOT}", f"--report-dir={tmp_path}", "--device", device, "tests/test_layout.py", "--co", "-q")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "INTERNALERROR" not in run.stdout + run.stderr


@pytest.mark.parametrize("capability, refused", [((7, 5), True), ((8, 0), False), ((9, 0), False)])
def test_bf16_twin_needs_an_ampere_card(fake, monkeypatch, capability, refused):
    from cheapinfer.runtime import models

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    why = models.unusable_twin_dtype("bf16", "cuda:0")
    assert bool(why) == refused and (not why or "8.0" in why)
    assert models.unusable_twin_dtype("fp16", "cuda:0") is None


@pytest.mark.parametrize("capability, refused", [((6, 1), True), ((7, 0), True), ((7, 5), False), ((9, 0), False)])
def test_llm_int8_needs_a_turing_card(fake, monkeypatch, capability, refused):
    """LLM.int8() is not run below sm75, with the reason (as bf16 below sm80); never gated on a CPU."""
    from cheapinfer.runtime import models

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    why = models.llm_int8_unavailable("cuda:0")
    assert bool(why) == refused and (not why or ("not run" in why and f"{capability[0]}.{capability[1]}" in why and "7.5" in why))
    assert models.llm_int8_unavailable("cpu") is None


def _fake_bitsandbytes(monkeypatch, lib):
    import sys
    import types

    cext = types.ModuleType("bitsandbytes.cextension")
    cext.lib = lib
    package = types.ModuleType("bitsandbytes")
    package.cextension = cext
    monkeypatch.setitem(sys.modules, "bitsandbytes", package)
    monkeypatch.setitem(sys.modules, "bitsandbytes.cextension", cext)


def test_bitsandbytes_cuda_library_that_does_not_load_is_one_line(fake, monkeypatch):
    class ErrorHandlerMockBNBNativeLibrary:  # bitsandbytes' stand-in where its native library failed to load
        error_msg = "libcudart.so.13: cannot open shared object file: No such file or directory\nmore detail"

    class CudaBNBNativeLibrary:
        pass

    _fake_bitsandbytes(monkeypatch, ErrorHandlerMockBNBNativeLibrary())
    why = devices.bitsandbytes_cuda_problem("cuda:0")
    assert why.startswith("bitsandbytes' CUDA library does not load (libcudart.so.13") and "\n" not in why
    _fake_bitsandbytes(monkeypatch, CudaBNBNativeLibrary())
    assert devices.bitsandbytes_cuda_problem("cuda:0") is None
    assert devices.bitsandbytes_cuda_problem("cpu") is None  # never probed on a CPU
    monkeypatch.setitem(__import__("sys").modules, "bitsandbytes", None)  # not installed
    assert devices.bitsandbytes_cuda_problem("cuda:0").startswith("bitsandbytes does not import")
