"""The one written rule that grades a finding about the chapter's text (:data:`GRADE_RULE`), applied by code.

A finding names its *basis*, the rule's question that decides it (cheapinfer/errata.toml); :func:`grade`
maps it to a grade of :data:`GRADES`. A round word ("zesvoudig",
"zesduizend", "negenhonderd") is graded by :func:`round_word_grade` from the numbers the chapter prints.
Pure functions: no registry, no chapter file.
"""

from __future__ import annotations

import math

#: The grades of a confirmed erratum, the kind of fault in the text an editor would name (the report counts each):
GRADES = {
    "erratum": "a printed number that does not follow from the chapter's stated inputs, or fails on measurement",
    "inconsistency": "printed numbers that contradict each other (sums, totals, a value quoted differently in two places, "
                     "a statement a later section contradicts)",
    "listing defect": "a listing that does not run as printed, warns, or does something other than what the text says",
    "imprecision": "rounding against truncation, mixed units, a round number that overshoots the data",
    "translation": "the two translations differ in substance",
    "note": "a printed value the evidence does not show wrong (it lies inside the spread the chapter's own premises allow): "
            "documented, listed apart, never counted as an erratum",
}

#: The rule, in the order its questions are asked: the first that applies gives the grade.
GRADE_RULE = (
    ("not shown wrong", "note",
     "the evidence does not show the printed value wrong (it lies inside the spread of what the chapter's own premises allow, "
     "or no measurement bears on it): a note, never an erratum"),
    ("listing", "listing defect", "a listing that does not run as printed, warns, or does something other than its text says"),
    ("translations differ", "translation", "the two translations say different things; the one that agrees with the evidence is the reference"),
    ("contradicts the chapter", "inconsistency",
     "a printed number contradicts another printed number of the chapter (a part larger than its printed whole, a result "
     "that does not follow from the inputs the same passage states)"),
    ("imprecise words", "imprecision",
     "the digits follow from the data but the words around them do not: a unit's name, truncation where the chapter rounds, "
     "an unstated assumption the number needs, a round word outside its rounding band (round_word_grade)"),
    ("wrong", "erratum", "a printed value that the measurement or the chapter's stated inputs do not give"),
)
BASES = {basis: grade for basis, grade, _ in GRADE_RULE}
#: The round-word rule, in words (the report prints it beside GRADE_RULE).
ROUND_WORD_RULE = (
    "A round word states its number to the place of its last nonzero digit (a fold, '-voudig' or 'keer', to a whole fold): "
    "it is accepted when the value the chapter's printed numbers give rounds to it there (half away from zero); otherwise it "
    "is an imprecision, and an inconsistency where the word exceeds a whole the chapter prints. A round word no printed "
    "number measures ('bijna tien jaar') is not graded."
)


def grade(basis: str) -> str:
    """The grade :data:`GRADE_RULE` gives a finding on ``basis``; ValueError for a basis the rule does not have."""
    try:
        return BASES[basis]
    except KeyError:
        raise ValueError(f"no grade rule for basis {basis!r} (bases: {', '.join(BASES)})") from None


def step_of(stated: float, fold: bool) -> float:
    """The place a round word states its number to: 1 for a fold, else the place of its last nonzero digit."""
    if fold or stated == 0:
        return 1.0
    step = 10.0 ** math.floor(math.log10(abs(stated)))
    while step >= 10 and (stated / step) % 1:
        step /= 10
    while (stated / (step * 10)) % 1 == 0:
        step *= 10
    return step


def rounds_to(value: float, step: float) -> float:
    """``value`` rounded to a multiple of ``step``, half away from zero."""
    return math.copysign(math.floor(abs(value) / step + 0.5) * step, value)


def round_word_grade(stated: float, value: float | None, *, fold: bool, whole: float | None = None) -> str | None:
    """The grade of a round word stating ``stated`` for ``value`` (None: accepted, or not graded when ``value`` is None).

    ``whole``: a total the chapter prints that the word's count is part of (a count above it contradicts the chapter).
    """
    if value is None:
        return None
    if whole is not None and stated > whole:
        return grade("contradicts the chapter")
    if rounds_to(value, step_of(stated, fold)) == stated:
        return None
    return grade("imprecise words")
