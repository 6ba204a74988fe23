"""``python -m cheapinfer gpu-check``: one line and a non-zero exit without CUDA; on a (faked) CUDA machine its two
steps, offline, and one record with the GPU and the verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from commands import cheapinfer
from fake_cuda import FakeCuda

from cheapinfer import CHECKOUT, cli
from cheapinfer.audits import gpu_check, launch
from cheapinfer.cli.machine import gpu_check_cli
from cheapinfer.runtime import device as devices


def test_without_cuda_it_says_so_in_one_line_and_exits_non_zero(capfd, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as with CUDA_VISIBLE_DEVICES="" on a GPU machine
    run = cheapinfer(capfd, "gpu-check")
    assert run.returncode == gpu_check.NO_CUDA_EXIT != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0] and "Traceback" not in run.stderr, run.stderr
    assert run.stdout == ""


def test_it_refuses_a_cpu_device_in_one_line(capfd):
    run = cheapinfer(capfd, "gpu-check", "--device", "cpu")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and "runs on CUDA" in run.stderr


def test_it_is_a_command_of_the_generated_reference():
    assert cli.command_parser("gpu-check").prog == "cheapinfer gpu-check"
    assert "gpu-check" in cli.parser().format_help()


def test_the_plan_runs_the_gpu_tests_then_the_device_claims_as_verify_does(tmp_path):
    (tests_name, tests), (claims_name, claims) = gpu_check.plan("cuda:0", tmp_path, book_model="/models/qwen")
    assert tests_name == "tests" and tests[1:4] == ["-m", "pytest", str(CHECKOUT / "tests")] and tests[tests.index("-m", 3) + 1] == "gpu"
    assert tests[tests.index("--device") + 1] == "cuda:0" and tests[tests.index("--report-dir") + 1] == str(tmp_path / "tests")
    assert "--book-model" not in tests
    assert claims_name == "claims" and claims[1:4] == ["-m", "pytest", str(CHECKOUT / "claims")] and claims[claims.index("-m", 3) + 1] == "gpu"
    assert claims[claims.index("--device") + 1] == "cuda:0" and claims[claims.index("--report-dir") + 1] == str(tmp_path)
    assert claims[claims.index("--book-model") + 1] == "/models/qwen"


def test_on_cuda_it_runs_both_steps_offline_and_writes_one_record(tmp_path, monkeypatch, capsys):
    FakeCuda(count=1, current=0).install(monkeypatch)
    monkeypatch.delenv("CHEAPINFER_DEVICE", raising=False)
    monkeypatch.setattr(gpu_check, "_cached_artifacts", lambda: None)
    monkeypatch.setattr(devices, "environment", lambda device: {"gpu": "Fake H100", "gpu_capability": "9.0", "driver": "550.54", "torch": "2.13.0"})
    ran = []

    def call(cmd, env):
        ran.append((cmd, env))
        if cmd[3] == str(CHECKOUT / "claims"):  # what the claims run leaves behind: the run record
            results = {"KV-DECODE-MEMBOUND": {"results": [{"verdict": "inconclusive"}]}, "Q-NF4": {"results": [{"verdict": "shape holds"}]}}
            (tmp_path / "run.json").write_text(json.dumps({"claims": results}))
            return 1, False  # a claim deviates: a finding, and the check's exit says so
        return 0, False

    monkeypatch.setattr(launch, "run_interruptibly", call)
    code = gpu_check_cli(["--report-dir", str(tmp_path)])
    assert code == 1 and [c[0][3] for c in ran] == [str(CHECKOUT / "tests"), str(CHECKOUT / "claims")]
    assert all(env[k] == "1" for _, env in ran for k in gpu_check.OFFLINE)
    record = json.loads((tmp_path / gpu_check.RECORD_NAME).read_text())
    assert record["device"] == "cuda:0" and record["environment"]["gpu"] == "Fake H100"
    assert [s["exit"] for s in record["steps"]] == [0, 1] and record["verdicts"] == {"inconclusive": 1, "shape holds": 1}
    out = capsys.readouterr().out
    assert "Fake H100" in out and "capability 9.0" in out and str(tmp_path / gpu_check.RECORD_NAME) in out


def test_verdicts_of_an_unreadable_record_are_none(tmp_path):
    (tmp_path / "run.json").write_text("{not json")
    assert gpu_check.verdicts(tmp_path / "run.json") == {} and gpu_check.verdicts(Path(tmp_path / "absent.json")) == {}
