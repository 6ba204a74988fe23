"""The records' faults: the suite's own bugs in the readers of run records, not the chapter's (as
:mod:`cheapinfer.faults.text`'s). Each wraps one function of ``compare`` or of the report's renderers at its narrowest
point, by a bug these readers could realistically have, and must turn its self-test red: ``compare``'s rules in each
direction (tests/test_compare_bounds.py), the report's snapshot (tests/test_report.py). A test that stays green under
its fault proves nothing.

:data:`RECORD_FAULTS`: fault name -> :class:`~cheapinfer.faults.base.SuiteFault` (the reader it breaks, the bug in one sentence, and the
context manager that holds it for as long as the block runs).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from ..harness import compare, errata, schema
from .base import patched, suite_faults

COMPARE, REPORT = "compare", "report"
READERS = (COMPARE, REPORT)


RECORD_FAULTS, _fault = suite_faults("record", READERS)


@contextlib.contextmanager
def _wrapping(module: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """``module.name`` replaced by ``wrap(module.name)`` for as long as the block runs: the fault around the real function."""
    with patched(module, name, wrap(getattr(module, name))):
        yield


def _rise_only(real: Callable[..., bool]) -> Callable[..., bool]:
    def moved(before: Any, after: Any, form: str, width: float) -> bool:
        a, b = schema.as_float(before), schema.as_float(after)
        return b - a > width if form == "abs" and a is not None and b is not None else real(before, after, form, width)

    return moved


def _first_per_claim(real: Callable[[Any], list]) -> Callable[[Any], list]:
    def first(record: Any) -> list:
        seen: set[str] = set()
        return [e for e in real(record) if not (e[0] in seen or seen.add(e[0]))]

    return first


@_fault("compare-every-bound-a-floor", COMPARE,
        "compare takes every bound for a lower one (a drop goes toward it): a value rising toward an upper bound, or "
        "across it, reads as moving away, with and without reruns")
def _():
    with _wrapping(compare, "_direction", lambda real: lambda bounds, a, b: real(tuple((">", x) for _, x in bounds), a, b)):
        yield


@_fault("compare-range-first-bound-only", COMPARE,
        "compare reads the first bound of a quantity's checks only: a range's other side (Q-NF4's block_share < 1) is never approached")
def _():
    with _wrapping(compare, "shape_bounds", lambda real: lambda q, claim, profile="": real(q, claim, profile)[:1]):
        yield


@_fault("compare-digits-rise-only", COMPARE,
        "compare measures a digits value's move as after - before, not its size: a value that drops beyond its tolerance has not moved")
def _():
    with _wrapping(compare, "_moved", _rise_only):
        yield


@_fault("report-first-erratum-only", REPORT,
        "the report renders the first erratum of a claim only (the record's one-erratum key read where a claim has several)")
def _():
    with _wrapping(errata, "confirmed_errata", _first_per_claim):
        yield
