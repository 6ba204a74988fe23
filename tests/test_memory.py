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


def test_the_stand_in_is_loaded_once_per_module_and_again_after_a_drop(monkeypatch):
    import pytest
    import torch

    from cheapinfer.runtime import artifacts, models
    from fixtures.profiles import StandIn
    from fixtures.quant import QuantizedVariants

    loads = []
    monkeypatch.setattr(models, "stand_in", lambda device: loads.append(device) or models.twin("fp32", **SMALL))
    loader = StandIn(torch.device("cpu"))
    variants = QuantizedVariants(loader)
    first = loader()
    assert loader() is first and variants.base is first and len(loads) == 1  # kept while the module runs
    built = variants["int4-row"].model
    loader.drop(), variants.drop()  # the end of the module
    again = loader()
    assert len(loads) == 2 and again is not first and variants.base is again
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(), first.model.state_dict().values()))
    rebuilt = variants["int4-row"].model  # a later module's quantized copy, from the stand-in it loaded
    assert all(torch.equal(a, b) for a, b in zip(rebuilt.state_dict().values(), built.state_dict().values()))
    assert rebuilt.model.embed_tokens.weight.data_ptr() == again.model.model.embed_tokens.weight.data_ptr()

    def unavailable(device):
        loads.append(device)
        raise artifacts.ArtifactUnavailable("offline")

    monkeypatch.setattr(models, "stand_in", unavailable)
    broken = StandIn(torch.device("cpu"))
    for _ in range(2):
        with pytest.raises(artifacts.ArtifactUnavailable):
            broken()
    assert len(loads) == 3  # a failed load is not tried again


_TWO_CLAIMS = '''
import pytest


@pytest.mark.claim("KV-BYTES-FORMULA")
def test_one(claim, stand_in):
    from cheapinfer.chapter.kv_cache import kv
    from cheapinfer.runtime.arch import QWEN25_05B

    claim.verify("arithmetic", bytes_per_token=kv.arch_kv_bytes_per_token(QWEN25_05B, 2))


def test_not_a_claim(stand_in):
    pass
'''


_KV_BODY = '''    from cheapinfer.chapter.kv_cache import kv
    from cheapinfer.runtime.arch import QWEN25_05B

    claim.verify("arithmetic", bytes_per_token=kv.arch_kv_bytes_per_token(QWEN25_05B, 2))'''
_Q_BODY = '''    from cheapinfer.chapter.quantization import quant_error
    from cheapinfer.runtime.arch import QWEN25_05B

    n = QWEN25_05B.parameter_count()
    claim.verify("arithmetic", parameters=n, parameters_billion=n / 1e9, gb_fp32=round(quant_error.decimal_gb(n, 4), 2),
                 gb_16bit=round(quant_error.decimal_gb(n, 2), 2), gb_8bit=round(quant_error.decimal_gb(n, 1), 2))'''


def test_after_each_claim_test_memory_goes_back_and_the_stand_in_is_let_go_after_each_module(pytester, monkeypatch):
    import torch
    from plugin_runs import record, run

    from cheapinfer.runtime import models

    calls, loads = [], []
    monkeypatch.setattr(memory, "release", lambda: calls.append("release"))
    monkeypatch.setattr(models, "stand_in", lambda device: loads.append(device) or models.twin("fp32", **SMALL))
    pytester.makepyfile(test_a=_TWO_CLAIMS, test_b=_TWO_CLAIMS.replace('"KV-BYTES-FORMULA"', '"Q-SIZES"').replace(_KV_BODY, _Q_BODY))
    result = run(pytester, "-q")
    got = record(pytester)
    results = {cid: r for cid in ("KV-BYTES-FORMULA", "Q-SIZES") for r in got["claims"][cid]["results"]}
    assert all(got["claims"][cid]["verdict"] == "reproduced" for cid in results), result.stdout.str()[-2000:]
    assert calls == ["release", "release"]  # after each claim test, not after the other tests
    assert len(loads) == 2 and all(d == torch.device("cpu") for d in loads)  # once in each module, not once per test
    for r in results.values():  # each claim's result holds the process's peak after it
        assert r["memory"]["peak_rss_bytes"] >= r["memory"]["rss_bytes"] > 0
    assert got["run"]["memory"]["peak_rss_bytes"] >= max(r["memory"]["peak_rss_bytes"] for r in results.values())


def test_a_filled_evaluation_table_keeps_its_numbers_and_lets_go_of_its_models(monkeypatch):
    import gc
    import weakref
    from types import SimpleNamespace

    import torch

    from cheapinfer.chapter.evaluation import battery, evaluation, perplexity

    monkeypatch.setattr(battery, "stock_repetition_penalty", lambda model: 1.0)
    monkeypatch.setattr(battery, "battery", lambda model, tokenizer, **kw: SimpleNamespace(repetition_penalty=1.0, score=3, n=4))
    monkeypatch.setattr(perplexity, "perplexity", lambda model, ids: float(model.weight.detach().sum()))
    monkeypatch.setattr(perplexity, "library_perplexity", lambda model, ids: 2.0)
    monkeypatch.setattr(perplexity, "ln_ppl_bound", lambda model, ids: 1e-6)
    monkeypatch.setattr(evaluation, "agreement_by_position", lambda model, conts: [[True, False]])
    reference = torch.nn.Linear(2, 2, bias=False)
    torch.nn.init.constant_(reference.weight, 1.0)
    variants = {"reference": reference, "int8": torch.nn.Linear(2, 2, bias=False)}
    torch.nn.init.constant_(variants["int8"].weight, 0.5)
    alive = [weakref.ref(m) for m in variants.values()]
    table = evaluation.evaluate(reference, None, variants.__getitem__, ("reference", "int8"), torch.arange(10), continuations=["c"])
    del reference, variants
    table.fill("cpu", workers=1)
    gc.collect()
    assert [r() for r in alive] == [None, None]  # the table held the only references: they are gone
    assert table.ppl("reference") == 4.0 and table.ppl("int8") == 2.0 and table.cross_check.library_ppl == 2.0
    assert table["int8"].agree == 1 and table.table_rows()[1] == ["int8", "2.00", "3/4", "3/4", "1/2"]
