"""``python -m cheapinfer engine``: the parts that work without vLLM (workload, table, KV replay, the "not run" line)."""

import importlib.abc
import json
import sys

import pytest

from cheapinfer.chapter.batching import workload
from cheapinfer.cli import main
from cheapinfer.reference import comparison, engine


def test_workload_is_the_batching_workload_scaled():
    """The engine runs the suite's own workload: at scale 1 the book's statistics, at scale N the lengths / N rounded up."""
    full = engine.workload(1)
    assert workload.length_stats(full.lengths) == {"median_len": 18, "max_len": 231, "total_len": 1_874, "requests": 64}
    w = engine.workload(8, prompt_len=3)
    assert w.lengths == workload.scaled(workload.skewed_lengths(), 8)
    assert len(w.prompts) == 64 and {len(p) for p in w.prompts} == {3}
    assert engine.workload(8, prompt_len=3).prompts == w.prompts  # seeded


def test_static_groups_cover_the_queue_in_order_and_pad_to_their_longest():
    w = engine.Workload([3, 1, 4, 1, 5, 9, 2], [[0]] * 7, slots=3, length_scale=1)
    assert w.groups() == [[0, 1, 2], [3, 4, 5], [6]]
    assert [w.padded(r) for r in range(7)] == [4, 4, 4, 9, 9, 9, 2]


def test_ratios_agree_with_the_simulations_own():
    """``comparison.ratios`` reads two policy results the way ``workload.compare`` does."""
    lengths = workload.scaled(workload.skewed_lengths(), 8)
    cost = {k: 0.01 + 0.002 * k for k in range(1, 9)}
    mine = comparison.ratios(workload.simulate("static", lengths, 8, cost), workload.simulate("continuous", lengths, 8, cost))
    theirs = workload.compare(lengths, 8, cost)
    for key in ("throughput_ratio", "latency_ratio", "service_latency_ratio", "static_steps", "continuous_steps"):
        assert mine[key] == theirs[key]  # one definition (workload.ratios) on the same simulations: the same bits


def test_table_has_a_row_per_ratio_and_says_not_run_for_a_missing_column():
    header, rows = comparison.comparison_table(
        {"simulation": {"throughput_ratio": 2.3, "latency_ratio": 3.6, "service_latency_ratio": 2.9, "static_steps": 97, "continuous_steps": 42}, "suite scheduler": None}
    )
    assert header == ["quantity", "simulation", "suite scheduler"]
    assert [r[0] for r in rows] == [label for _, label in comparison.TABLE_ROWS]
    assert rows[0][1:] == ["2.30x", "not run"] and rows[3][1:] == ["97", "not run"]


def test_median_ratios_take_the_median_round_and_keep_step_counts():
    rounds = [{"throughput_ratio": r, "static_steps": 97} for r in (2.0, 3.0, 2.5)]
    assert comparison.median_ratios(rounds) == {"throughput_ratio": 2.5, "static_steps": 97}


def test_paged_replay_counts_blocks_per_step_and_frees_them_on_departure():
    """Block size 4: request 0 holds 1..6 tokens (2 blocks at the end), request 1 holds 1..2 and leaves; request 2 takes its place."""
    held = [{0: 1, 1: 1}, {0: 2, 1: 2}, {0: 3, 2: 1}, {0: 4, 2: 2}, {0: 5, 2: 3}, {0: 6, 2: 4}]
    done = [[], [1], [], [], [], [0, 2]]
    assert engine.paged_replay(held, done, block_size=4) == [2, 2, 2, 2, 3, 3]
    prompts = [{0: 48}, {0: 49}]  # a 48-token prompt in its first step: 12 blocks of 4, then a 13th
    assert engine.paged_replay(prompts, [[], [0]], block_size=4) == [12, 13]


def test_step_costs_are_medians_by_occupancy_and_interpolate_a_gap():
    t = engine.Trace(seconds=[0.1, 0.3, 0.2, 0.5, 0.4], occupied=[1, 1, 1, 4, 4])
    cost, missing = engine.step_costs([t], slots=4)
    assert missing == [2, 3]
    # float64 (u = 2^-53) of numbers below 1: the median of 3 is one of them; the median of 2 a sum and
    # a halving (1 rounding), the literal 0.45 one; an interpolation 4 roundings (difference, slope,
    # product, sum) against the literal's 2
    u = 2.0**-53
    assert cost[1] == 0.2 and abs(cost[4] - 0.45) <= 2 * u
    assert abs(cost[2] - (0.2 + 0.25 / 3)) <= 6 * u and abs(cost[3] - (0.2 + 0.5 / 3)) <= 6 * u


def _run_cli(argv, capsys):
    code = main(["engine", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_engine_without_vllm_says_why_in_one_line_and_writes_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ModuleNotFoundError, as where it is not installed
    code, out, err = _run_cli(["--report-dir", str(tmp_path / "reports")], capsys)
    assert code == engine.EXIT_CANNOT_RUN
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "not run: vLLM is not installed" in err and "tox -e vllm" in err
    assert not (tmp_path / "reports").exists()


def test_engine_with_a_broken_vllm_says_why_in_one_line(monkeypatch, tmp_path, capsys):
    class Broken(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "vllm":
                raise OSError("Could not load this library: libtorchcodec_core.so")
            return None

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    code, out, err = _run_cli(["--report-dir", str(tmp_path)], capsys)
    assert code == engine.EXIT_CANNOT_RUN and out == ""
    assert err.strip() == "cheapinfer engine: not run: vLLM cannot be imported (OSError: Could not load this library: libtorchcodec_core.so)"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [(["--length-scale", "0"], "--length-scale must be >= 1"), (["--rounds", "0"], "--rounds must be >= 1")], ids=["length-scale=0", "rounds=0"])
def test_engine_rejects_bad_arguments_with_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["engine", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_report_lines_render_a_result_record():
    """The printed report is built from engine.json's record alone."""
    header, rows = comparison.comparison_table({"vLLM": {"throughput_ratio": 2.0, "latency_ratio": 3.0, "service_latency_ratio": 1.5, "static_steps": 50, "continuous_steps": 22}})
    record = {
        "workload": {"requests": 64, "slots": 8, "length_scale": 16, "median_len": 2, "max_len": 15, "total_len": 149},
        "vllm": {"version": "0.32.0", "rounds": 3},
        "model": {"dtype": "bfloat16"},
        "table": {"header": header, "rows": rows},
        "kv_blocks": {"block_size": 32, "pool_blocks": 1000, "runs": {"continuous": {"vllm_peak_blocks": 8, "suite_peak_blocks": 8, "same_every_step": True, "steps_that_differ": 0}}},
        "prefix_cache": {"shared_prefix_tokens": 72, "prompt_tokens": 80, "second_request_hits": 64, "second_request_queries": 80, "second_request_hit_rate": 0.8, "vllm_shared_blocks": 2.0, "suite_shared_full_blocks": 2, "same_tokens_as_alone": True},
    }
    text = "\n".join(comparison.report_lines(json.loads(json.dumps(record))))
    assert "| throughput, continuous / static | 2.00x |" in text
    assert "| continuous | 8 | 8 | yes |" in text
    assert "hit 64 of 80 prompt tokens (80%), 2 blocks; the suite's accounting shares 2 full blocks" in text


def test_prefix_accounting_shares_only_the_full_blocks_of_the_prefix():
    """72 shared tokens in 32-token blocks: two full blocks are shared; the partial third is not."""
    assert engine.prefix_accounting(72, 24, 32) == (2, 2)
    assert engine.prefix_accounting(31, 24, 32) == (0, 0), "a prefix shorter than a block shares nothing"
