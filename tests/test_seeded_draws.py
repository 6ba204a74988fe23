"""The rule for claims whose number comes from one seeded workload (issue 43; registry_fields.DRAWS_RULE): measured on
many seeded draws of the workload, judged on the median, with the 5th-95th percentiles and the share of draws holding in
the record. Tested here on a few draws, without a model."""

import pytest

from cheapinfer.chapter import stats
from cheapinfer.chapter.batching import paged_scheduler, workload
from cheapinfer.faults.core import activate
from cheapinfer.harness import registry, registry_fields, verdict, vocabulary

CLAIM = registry.parse('''[X-1]
section = "batching"
statement = "s"
book = { ratio = 1.6 }
runs_on = ["twin"]
digits_on = ["twin"]
timing = "counted"
checks = [
  { q = "ratio", form = "abs", tol = 0.05, draws = 100, why = "printed to one decimal" },
]
''')["X-1"]


def test_the_rule_judges_the_median_and_reports_the_band_and_the_share_holding():
    values = [1.005 + i / 100 for i in range(101)]  # 1.005 .. 2.005, none on a tolerance's edge
    got = verdict.over_draws(CLAIM, "ratio", values)
    assert got == pytest.approx({"ratio": 1.505, "ratio_p05": 1.055, "ratio_p95": 1.955, "ratio_draws": 101, "ratio_share_holding": 10 / 101})
    assert verdict.judge(CLAIM, got, "twin").verdict == vocabulary.DEVIATES  # 1.505 is not 1.6 +- 0.05, though 10 draws are
    assert "at the median of 100 seeded draws" in verdict.judge(CLAIM, got, "twin").messages()[0]
    shifted = verdict.over_draws(CLAIM, "ratio", [v + 0.1 for v in values])
    assert verdict.judge(CLAIM, shifted, "twin").verdict == vocabulary.REPRODUCED


@pytest.mark.parametrize("drop", ["ratio_p05", "ratio_p95", "ratio_draws", "ratio_share_holding"])
def test_a_median_without_its_distribution_fails(drop):
    got = verdict.over_draws(CLAIM, "ratio", [1.6] * 100)
    assert verdict.judge(CLAIM, got, "twin").verdict == vocabulary.REPRODUCED
    assert verdict.judge(CLAIM, {k: v for k, v in got.items() if k != drop}, "twin").verdict == vocabulary.DEVIATES


def test_fewer_draws_than_the_registry_asks_fail():
    got = verdict.over_draws(CLAIM, "ratio", [1.6] * 99)
    assert verdict.judge(CLAIM, got, "twin").verdict == vocabulary.DEVIATES


def test_every_seeded_claim_asks_for_at_least_100_draws():
    seeded = {cid: [c.draws for c in claim.checks if c.draws] for cid, claim in registry.load().items()}
    assert {cid for cid, d in seeded.items() if d} >= {"BAT-STATIC-CONT", "PAGE-WASTE"}
    assert all(d >= registry_fields.DRAWS_MIN for ds in seeded.values() for d in ds)


def test_static_and_continuous_over_a_few_draws_give_the_rules_numbers():
    cost = {k: 0.01 * (1 + 0.05 * k) for k in range(1, 9)}
    sens = workload.sensitivity(workload.skewed_lengths(), 8, cost, draws=20)
    got = verdict.over_draws(registry.get("BAT-STATIC-CONT"), "throughput_ratio", sens.throughput)
    assert got["throughput_ratio_draws"] == 21 and got["throughput_ratio_p05"] <= got["throughput_ratio"] <= got["throughput_ratio_p95"]
    assert got["throughput_ratio_share_holding"] == stats.share(sens.throughput, 1.55, 1.65)
    assert sens.repeated_workloads() == 0


def test_the_pool_without_the_model_holds_what_its_sequences_need_on_every_draw():
    draws = paged_scheduler.waste_draws(4, 8, 8, 512 // 16, 16, scale=16)
    assert [d["blocks_held_over_needed"] for d in draws] == [[1.0, 1.0]] * 4
    assert all(d["waste"].max_unused_per_sequence_paged < 16 and d["blocks_in_use_after"] == 0 and d["tables_consistent"] for d in draws)
    assert len({d["waste"].used_tokens for d in draws}) > 1  # the draws are other workloads
    got = verdict.over_draws(registry.get("PAGE-WASTE"), "max_unused_slots_per_sequence_paged", [d["waste"].max_unused_per_sequence_paged for d in draws])
    assert got["max_unused_slots_per_sequence_paged_share_holding"] == 1.0


def test_a_pool_that_takes_blocks_ahead_fails_on_the_draws_median():
    with activate("paging-block-reserved-ahead"):
        draws = paged_scheduler.waste_draws(3, 8, 8, 512 // 16, 16, scale=16)
    values = [d["waste"].max_unused_per_sequence_paged for d in draws]
    got = verdict.over_draws(registry.get("PAGE-WASTE"), "max_unused_slots_per_sequence_paged", values)
    assert got["max_unused_slots_per_sequence_paged"] >= 16 and got["max_unused_slots_per_sequence_paged_share_holding"] == 0


def test_the_pool_run_counts_a_tiny_workload_by_hand():
    """Two requests of 1 and 2 tokens, one slot, 4-token prompts, blocks of 4: the first holds 3 prompt tokens, steps once
    (4 tokens, one full block) and leaves; the second is admitted (3), steps twice (4, then 5: a second block)."""
    run = paged_scheduler.pool_run([1, 2], 1, 4, 4, 4)
    w = run["waste"]
    assert run["steps"] == 3 and w.used_tokens == 4 + 4 + 5 and w.reserved_paged == 4 * (1 + 1 + 2)
    assert w.reserved_max_context == 3 * 8 and w.max_unused_per_sequence_paged == 3 and run["blocks_held_over_needed"] == [1.0, 1.0]


def test_the_pool_without_the_model_is_the_real_runs_pool():
    """draws_simulate_the_run on a tiny model: the scheduler on the paged cache inside the model and the pool run
    without it give the same waste and the same blocks held over needed, step by step."""
    import math

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from cheapinfer.chapter.batching.paging import run_waste

    torch.manual_seed(0)
    config = Qwen2Config(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=16, intermediate_size=32, vocab_size=64)
    model = Qwen2ForCausalLM(config).eval()
    lengths, slots, prompt, max_new, block = workload.scaled(workload.skewed_lengths(16, 6, 40, 150), 4), 3, 5, 10, 4
    prompts = torch.randint(0, 64, (len(lengths), prompt), generator=torch.Generator().manual_seed(1)).tolist()
    run = paged_scheduler.run_paged(model, lengths, slots, prompts, slots * math.ceil((prompt + max_new) / block), block)
    real = run_waste(run.batch.snapshots, prompt + max_new, block)
    alone = paged_scheduler.pool_run(lengths, slots, prompt, max_new, block)
    assert alone["waste"] == real and alone["steps"] == run.result.steps
    assert alone["blocks_held_over_needed"] == paged_scheduler.held_over_needed(run.batch.snapshots)
