"""What a battery of 16 questions can resolve: theorems about the suite's statistics (cheapinfer.chapter.evaluation.battery), not
about the book or a model, so they are checked here and not as a claim (EVAL-NOISE asserts the measured NF4 /
group-128 pair of a model instead). Each is also run under the faults of cheapinfer.faults.statistics, where it must
fail: a statistic that stays right under its fault proves nothing."""

import pytest

from cheapinfer.chapter import stats
from cheapinfer.faults.statistics import STAT_FAULTS

N = 16  # the book's battery (EVAL-NOISE's book value 'questions')


def test_the_exact_interval_covers_at_least_its_level():
    assert stats.resolution(N).interval_coverage >= stats.CONFIDENCE


def test_one_question_in_sixteen_parts_no_intervals():
    res = stats.resolution(N)
    assert not res.one_question_intervals_disjoint
    assert all(stats.intervals_overlap(k, k + 1, N) for k in range(N))


def test_intervals_part_only_eight_questions_apart():
    assert stats.resolution(N).smallest_disjoint_gap == 8
    assert not stats.intervals_overlap(0, 8, N) and stats.intervals_overlap(0, 7, N)


def test_mcnemar_needs_six_one_way_changes_and_one_is_nothing():
    res = stats.resolution(N)
    assert res.one_question_p == 1.0
    assert res.smallest_significant_change == 6
    assert stats.mcnemar_exact([True] * 6, [False] * 6).p_value == pytest.approx(0.03125)
    assert stats.mcnemar_exact([True] * 5, [False] * 5).p_value == pytest.approx(0.0625)


def test_the_registry_states_what_the_statistics_give():
    from cheapinfer.harness import registry

    claim = registry.get("EVAL-NOISE")
    assert claim.book["questions"] == N
    res = stats.resolution(N)
    for stated in (f"at least {res.smallest_disjoint_gap} questions apart", f"at least {res.smallest_significant_change} answers changed one way"):
        assert stated in claim.note, stated
    assert "arithmetic" not in claim.runs_on, "the theorems about n = 16 are no claim: they are checked here"


THEOREMS = (test_the_exact_interval_covers_at_least_its_level, test_one_question_in_sixteen_parts_no_intervals,
            test_intervals_part_only_eight_questions_apart, test_mcnemar_needs_six_one_way_changes_and_one_is_nothing)


@pytest.mark.parametrize("name", sorted(STAT_FAULTS))
def test_each_statistics_fault_breaks_a_theorem(name):
    activate = STAT_FAULTS[name].activate
    failed = []
    with activate():
        for theorem in THEOREMS:
            try:
                theorem()
            except AssertionError:
                failed.append(theorem.__name__)
    assert failed, f"{name} leaves every theorem about n = {N} true"
