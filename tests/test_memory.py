"""The memory a run records: the process's peak after each claim, the claim that set the run's peak (no model)."""

from cheapinfer.harness import schema, tables
from cheapinfer.harness.record import Recorder, run_peak
from cheapinfer.runtime import memory

GIB = 2**30
SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=512, head_dim=16)


def _result(claim, peak, profile="twin"):
    return {"claim": claim, "profile": profile, "test": f"claims/test_x.py::{claim}", "memory": {"peak_rss_bytes": peak}}


def test_the_process_peak_is_at_least_its_resident_set_and_grows_with_an_allocation():
    before = memory.peak_rss()
    block = bytearray(64 * 2**20)  # touched: resident
    for i in range(0, len(block), 4096):
        block[i] = 1
    after = memory.snapshot()
    assert after["peak_rss_bytes"] >= after["rss_bytes"] > 64 * 2**20
    assert after["peak_rss_bytes"] >= before
    memory.release()  # collects and trims without error where glibc is absent too
    assert memory.available() >= 0


def test_the_claim_after_which_the_peak_last_rose_set_it_and_the_largest_rises_are_listed():
    results = [_result("A", 2 * GIB), _result("B", 5 * GIB), {"claim": "C", "profile": "twin", "verdict": "not run"},
               _result("D", 5 * GIB), _result("E", 6 * GIB), _result("F", 6 * GIB)]
    peak = run_peak(results, 6 * GIB)
    assert peak["peak_rss_bytes"] == 6 * GIB
    assert peak["set_by"]["claim"] == "E" and peak["set_by"]["peak_rss_bytes"] == 6 * GIB
    assert [(r["claim"], r["rise_bytes"]) for r in peak["rises"]] == [("B", 3 * GIB), ("A", 2 * GIB), ("E", GIB)]


def test_a_peak_after_the_last_claim_is_the_runs_and_is_said_so():
    record = {"run": {"memory": run_peak([_result("A", 2 * GIB)], 3 * GIB)}}
    lines = tables.memory_lines(record)
    assert lines[0].startswith("peak resident memory: 3.0 GiB") and "reached in A (twin) at 2.0 GiB, and after the last claim" in lines[0]
    assert lines[1] == "raised most by: A (twin) +2.0 GiB"


def test_no_memory_recorded_gives_no_peak_and_no_line():
    assert run_peak([{"claim": "A", "profile": "twin"}]) == {}
    assert tables.memory_lines({"run": {"memory": {}}}) == [] and tables.memory_lines({}) == []


def test_a_result_carries_its_memory_into_the_record():
    recorder = Recorder()
    result = recorder.not_run("KV-BYTES-FORMULA", "arithmetic", "cpu", "skipped")
    result.memory = {"peak_rss_bytes": 5, "rss_bytes": 4}
    assert result.to_dict()["memory"] == {"peak_rss_bytes": 5, "rss_bytes": 4}


def test_the_twin_factory_keeps_the_sessions_twins_and_drops_the_others_after_each_test(monkeypatch):
    import torch

    from cheapinfer.runtime import models
    from fixtures.profiles import TwinFactory

    real = models.twin
    monkeypatch.setattr(models, "twin", lambda dtype, device: real(dtype, device, **SMALL))
    factory = TwinFactory(torch.device("cpu"))
    fp32, bf16 = factory("fp32"), factory("bf16")
    assert factory("bf16") is bf16 and bf16.dtype == torch.bfloat16  # built once while the module runs
    session = factory.keep("fp16")
    factory.drop()  # the end of the test that asked for them
    assert set(factory.built) == {"fp32", "fp16"} and factory("fp32") is fp32 and factory("fp16") is session
    again = factory("bf16")  # a later test asks again: cast again, the same weights
    assert again is not bf16
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(), bf16.model.state_dict().values()))


def test_quantized_variants_are_built_again_the_same_after_a_modules_end():
    import torch

    from cheapinfer.runtime import models
    from fixtures.quant import QuantizedVariants

    variants = QuantizedVariants(models.twin("fp32", **SMALL))
    first = variants["int4-row"].model
    assert variants["int4-row"].model is first and variants.built() == ("int4-row",)
    variants.drop()
    assert variants.built() == ()
    again = variants["int4-row"].model
    assert again is not first and all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), first.state_dict().values()))


def test_a_quantized_copy_holds_its_quantized_matrices_and_shares_every_other_tensor():
    import copy

    import torch

    from cheapinfer.chapter.quantization import quant
    from cheapinfer.runtime import models

    base = models.twin("fp32", **SMALL).model
    before = {k: v.clone() for k, v in base.state_dict().items()}
    projections = quant.projection_weights(base)
    for scheme in ("int4-row", "nf4", "reference"):
        clone = quant.quantized_copy(base, scheme)
        expected = copy.deepcopy(base)  # what the copy was: a deep copy quantized in place
        if scheme != "reference":
            for p in quant.projection_weights(expected).values():
                p.detach().copy_(quant.fake_quantize(p, scheme))
        got, want = clone.state_dict(), expected.state_dict()
        assert got.keys() == want.keys() and all(torch.equal(v, want[k]) and v.dtype == want[k].dtype for k, v in got.items())
        mine = dict(clone.named_parameters())
        for name, p in base.named_parameters():
            assert (mine[name].data_ptr() == p.data_ptr()) == (scheme == "reference" or name not in projections), name
        assert all(b.data_ptr() == a.data_ptr() for a, b in zip(base.buffers(), clone.buffers()))
        assert not clone.training and not any(p.requires_grad for p in clone.parameters())
        clone.model.norm = torch.nn.Identity()  # changing the copy's modules leaves the model as it was
        assert not isinstance(base.model.norm, torch.nn.Identity)
    assert all(torch.equal(v, before[k]) for k, v in base.state_dict().items())


def _whole_run(peak, command="pytest claims -q --device cpu", device="cpu"):
    import json
    from pathlib import Path

    record = json.loads((Path(__file__).parent / "data" / "run-record.json").read_text())
    record["run"].update(command=command, device=device, memory=run_peak([_result("Q-BYTES-SPEED", peak)], peak))
    return record


def test_the_memory_a_whole_run_needs_comes_from_its_record_and_only_a_whole_runs():
    from cheapinfer.harness.record import memory_need, memory_warning

    need = memory_need(_whole_run(9 * GIB), "cpu")
    assert need["peak_rss_bytes"] == 9 * GIB and need["set_by"]["claim"] == "Q-BYTES-SPEED" and need["created"] == "2026-01-01T00:00:00Z"
    for partial in ("pytest claims --claims KV-API", "pytest claims -k BYTES", "pytest claims -m gpu", "pytest claims --fault x"):
        assert memory_need(_whole_run(9 * GIB, partial), "cpu") is None, partial
    assert memory_need(_whole_run(9 * GIB, device="cuda:0"), "cpu") is None  # a GPU run's resident set is another machine's need
    assert memory_need(_whole_run(9 * GIB, device="cuda:0"), "cuda:1") is not None
    line = memory_warning(_whole_run(9 * GIB), "cpu", 6 * GIB, "reports/run.json")
    assert "9.0 GiB" in line and "6.0 GiB is available" in line and "Q-BYTES-SPEED" in line and "\n" not in line
    assert memory_warning(_whole_run(9 * GIB), "cpu", 10 * GIB, "reports/run.json") is None
    assert memory_warning(_whole_run(9 * GIB), "cpu", 0, "reports/run.json") is None  # unknown: no guess


def test_verify_warns_in_one_line_before_it_starts_when_memory_is_short(tmp_path, monkeypatch, capsys):
    import json

    from cheapinfer import cli

    started = []

    def child(cmd, env):
        started.append(capsys.readouterr().err)  # what was printed before the run started
        return 4, False

    monkeypatch.setattr(cli.verify, "_run_interruptibly", child)
    (tmp_path / schema.RECORD_NAME).write_text(json.dumps(_whole_run(9 * GIB)))
    monkeypatch.setattr(memory, "available", lambda: 5 * GIB)
    assert cli.main(["verify", "--device", "cpu", "--report-dir", str(tmp_path)]) == 4
    warned = [line for line in started[-1].splitlines() if "warning" in line]
    assert len(warned) == 1 and "9.0 GiB" in warned[0] and "5.0 GiB is available" in warned[0]
    assert cli.main(["verify", "--device", "cpu", "--report-dir", str(tmp_path), "--claims", "KV-API"]) == 4
    assert "warning" not in started[-1]  # part of the run: the whole run's peak is not its need
    monkeypatch.setattr(memory, "available", lambda: 20 * GIB)
    assert cli.main(["verify", "--device", "cpu", "--report-dir", str(tmp_path)]) == 4
    assert "warning" not in started[-1]
