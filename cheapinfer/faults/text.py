"""The text checks' faults: the suite's own bugs, not the chapter's. Each patches one value or function of the checks
that read the chapter's text (:mod:`cheapinfer.harness.textchecks`, :mod:`~cheapinfer.harness.grades`,
:mod:`~cheapinfer.harness.locate`) at its narrowest point, by a bug these checks could realistically have, and must
turn that check red (tests/test_errata_text.py; the listings' check in tests/test_listings.py, reading
:mod:`~cheapinfer.harness.explanations`): a check that stays green under its fault proves nothing.

:data:`TEXT_FAULTS`: fault name -> :class:`~cheapinfer.faults.base.SuiteFault` (the check it must turn red, the bug in one sentence, and the
context manager that holds it for as long as the block runs).
"""

from __future__ import annotations

import math
from typing import ContextManager
from unittest import mock

from ..harness import explanations, grades, locate, textchecks
from .base import patched, suite_faults

UNITS, FORMULAS, ROUND_WORDS, LOCATE, PATCH = "units classification", "formula locale", "round-word grading", "locate by quote", "patch writer"
LISTINGS = "listings"
CHECKS = (UNITS, FORMULAS, ROUND_WORDS, LOCATE, PATCH, LISTINGS)


TEXT_FAULTS, _fault = suite_faults("text", CHECKS)


def _dict_entry(target: dict, key: str, value: object) -> ContextManager[object]:
    """``target[key]`` replaced for the duration; the key must exist (a renamed key must not leave the fault inert)."""
    if key not in target:
        raise KeyError(f"text fault patches the key {key!r}, which does not exist")
    return mock.patch.dict(target, {key: value})


@_fault("binary-step-10^3", UNITS, "the binary unit system's step is 10^3 instead of 2^10: a binary size never reads as binary")
def _():
    with _dict_entry(textchecks.BASES, "binary", 10**3):
        yield


@_fault("comma-read-as-thousands", FORMULAS,
        "a number in the prose's locale is read with the comma as thousands separator and the point as decimal (the English reading)")
def _():
    with _dict_entry(textchecks.SEPARATORS, textchecks.PROSE, textchecks.SEPARATORS[textchecks.EN]):
        yield


@_fault("prose-locale-assumed-english", FORMULAS, "the prose's locale is not read from the prose but assumed English (point decimals)")
def _():
    with patched(textchecks, "prose_locale", lambda text: "point"):
        yield


def _truncated(value: float, step: float) -> float:
    return math.copysign(math.floor(abs(value) / step) * step, value)


def _half_down(value: float, step: float) -> float:
    return math.copysign(math.ceil(abs(value) / step - 0.5) * step, value)


def _half_even(value: float, step: float) -> float:
    return round(value / step) * step  # Python's round: a half goes to the even neighbour


@_fault("round-word-truncated", ROUND_WORDS, "a round word's value is truncated to its place instead of rounded")
def _():
    with patched(grades, "rounds_to", _truncated):
        yield


@_fault("round-word-half-down", ROUND_WORDS, "a round word's value is rounded half down instead of half away from zero")
def _():
    with patched(grades, "rounds_to", _half_down):
        yield


@_fault("round-word-half-even", ROUND_WORDS, "a round word's value is rounded by Python's round(), half to even, instead of half away from zero")
def _():
    with patched(grades, "rounds_to", _half_even):
        yield


def _first_match(text: str, quote: str) -> int:
    first = text.find(quote)
    if first < 0:
        raise locate.LocateError(f"not found: {quote!r}")
    return text.count("\n", 0, first) + 1


@_fault("locate-first-match", LOCATE, "a quote found more than once is placed at its first match instead of refused")
def _():
    with patched(locate, "line_of", _first_match):
        yield


def _replace_every(text: str, spans: list[tuple[int, int, str, str]]) -> str:
    quotes = [(text[start:end], new) for start, end, new, _ in spans]
    for quote, new in quotes:
        text = text.replace(quote, new)
    return text


@_fault("patch-replaces-every-occurrence", PATCH,
        "the patch writer replaces each quote by str.replace on the text as it changes: every occurrence, those an earlier replacement wrote included")
def _():
    with patched(locate, "splice", _replace_every):
        yield


@_fault("listing-split-at-blank-lines", LISTINGS, "a listing is cut at each blank line: the cached loop's prefill and loop read as two listings")
def _():
    with patched(explanations, "JOIN", 0):
        yield


@_fault("statements-compared-by-kind", LISTINGS,
        "a listing's statements are compared by kind only (an assignment is an assignment): a changed bound or name still reads as verbatim")
def _():
    with patched(explanations, "statement_key", lambda node: type(node).__name__):
        yield
