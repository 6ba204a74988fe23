"""Properties of the evaluation section's code that are not claims of the book: the battery's scoring."""

from __future__ import annotations

from cheapinfer.chapter.evaluation import battery


def test_the_battery_scores_whole_words_only():
    """An accepted answer counts as a word of its own: '100' is not '0', 'marshal' is not 'mars', and case and punctuation do not matter."""
    assert battery.is_correct("Water boils at 100 degrees.", ("100", "one hundred"))
    assert battery.is_correct("It's MARS!", ("mars",))
    assert not battery.is_correct("About 100 of them", ("0", "zero"))
    assert not battery.is_correct("The marshal said so", ("mars",))
    assert not battery.is_correct("In 1848", ("8",))
