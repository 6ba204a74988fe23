"""The KV claims' clocked quantities, as functions of one set of times: their values from the medians, their noise round by round."""

import pytest
import torch

from cheapinfer.chapter.kv_cache import kv
from cheapinfer.runtime import evidence, timing
from cheapinfer.runtime.timing import Samples


def test_speedup_quantities_read_the_marks_of_the_same_generations():
    t = {"uncached@12": 6.0, "cached@12": 2.0, "uncached@48": 40.0, "cached@48": 8.0, "uncached": 40.1, "cached": 8.1}
    q = kv.speedup_quantities(t)
    assert q == pytest.approx({"speedup": 5.0, "speedup_growth": 5.0 / 3.0})
    assert kv.speedup_at(t, 12) == pytest.approx(3.0)
    assert kv.speedup_quantities(t, short=12, long=12)["speedup_growth"] == pytest.approx(1.0)


def test_speedup_estimates_are_ratios_of_medians_with_the_noise_of_each_rounds_ratio():
    samples = {"uncached@12": Samples("u12", [6.0, 6.6, 5.4]), "cached@12": Samples("c12", [2.0, 2.0, 2.0]),
               "uncached@48": Samples("u48", [40.0, 44.0, 36.0]), "cached@48": Samples("c48", [8.0, 8.0, 8.0])}
    est = timing.estimates(samples, kv.speedup_quantities)
    assert est["speedup"].value == pytest.approx(5.0) and est["speedup"].per_round == pytest.approx((5.0, 5.5, 4.5))
    assert est["speedup_growth"].value == pytest.approx(5.0 / 3.0)
    assert est["speedup_growth"].per_round == pytest.approx((5.0 / 3.0, 5.5 / 3.3, 4.5 / 2.7))  # the load of a round hits both marks of it
    assert est["speedup"].se == pytest.approx(timing.robust_se([5.0, 5.5, 4.5]))


def test_prefill_growth_is_last_over_first_and_the_worst_relative_drop_between_neighbours():
    assert kv.prefill_growth([1.0, 2.0, 1.6, 3.0]) == pytest.approx({"growth": 3.0, "worst_drop": 0.2})
    # every step grew: the worst drop is negative, the smallest step's growth (here 1.5x: -0.5)
    assert kv.prefill_growth([1.0, 1.5, 3.0, 6.0]) == pytest.approx({"growth": 6.0, "worst_drop": -0.5})
    with pytest.raises(ValueError):
        kv.prefill_growth([1.0])


def test_prefill_worst_drop_per_round_is_that_rounds_worst_pair():
    # round 2 dips at P=128 (a neighbour's burst); the medians see no drop, that round's value says 0.25
    samples = {"P=8": Samples("8", [1.0, 1.0, 1.0]), "P=32": Samples("32", [2.0, 2.0, 2.1]), "P=128": Samples("128", [3.0, 1.5, 3.2])}
    est = timing.estimates(samples, lambda t: kv.prefill_growth([t[f"P={P}"] for P in (8, 32, 128)]))["worst_drop"]
    assert est.value == pytest.approx(1 - 3.0 / 2.0) and est.per_round == pytest.approx((-0.5, 0.25, 1 - 3.2 / 2.1))
    assert est.se > 0


def test_marked_generation_returns_the_seconds_to_each_marked_token():
    seen = []

    def generate(model, ids, new_tokens, on_step):
        for k in range(1, new_tokens + 1):
            seen.append(k)
            on_step(k)

    marks = kv.marked_generation(generate, None, None, 6, (1, 3, 6), "cpu")()
    assert isinstance(marks, timing.Marks) and list(marks) == [1, 3, 6] and seen == [1, 2, 3, 4, 5, 6]
    assert 0 <= marks[1] <= marks[3] <= marks[6]


def test_each_timed_call_counts_the_forwards_it_ran_and_a_replayed_step_counts_none():
    model, probed = torch.nn.Sequential(torch.nn.Linear(2, 2)), []
    kept = []

    def step():  # runs the model on its first call only, then replays (a step cached by its arguments)
        if not kept:
            kept.append(model(torch.zeros(2)))
        return kept[0]

    counts: dict[str, list[int]] = {}
    probe = lambda: probed.append(1)  # noqa: E731  a probe beside the steps, running no model
    variants = evidence.counted(model, {"twice": lambda: (model(torch.zeros(2)), model(torch.ones(2))), "replayed": step, "copy": probe},
                                counts, uncounted=("copy",))
    for _ in range(3):
        for fn in variants.values():
            fn()
    assert counts == {"twice": [2, 2, 2], "replayed": [1, 0, 0]} and probed == [1, 1, 1]
    model(torch.zeros(2))  # outside a timed call: not counted, the hook is gone
    assert counts["twice"] == [2, 2, 2] and not model._forward_pre_hooks
    samples = {name: Samples(name, [0.1] * 3, c) for name, c in counts.items()} | {"copy": Samples("copy", [0.1] * 3)}
    assert evidence.timed_forwards(samples) == {"timed_forwards": 0, "timed_forwards_max": 2}
