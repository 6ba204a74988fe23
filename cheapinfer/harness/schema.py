"""What a run record (``run.json``) must hold to be read: the one validator of records, used by
``compare``, ``merge`` and ``verify --stress``. A record that is not the shape this suite writes is a
:class:`RecordError` with one line naming the place, never a traceback.
"""

from __future__ import annotations

import math
from typing import Any

from . import registry
from .report import SCHEMA

#: The record schemas this version reads.
SCHEMAS = (SCHEMA,)


def as_float(value: Any) -> float | None:
    """``value`` as a float, or None when it is no number (or an integer beyond the range of a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


class RecordError(ValueError):
    """A run record that cannot be read or is not the shape this suite writes."""


def _expect(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise RecordError(f"{where}: expected {what}")


def _name(key: str) -> str:
    """A key of the record as it can be printed."""
    try:
        key.encode("utf-8")
        return key
    except UnicodeEncodeError:
        return ascii(key)


def _readable(record: Any) -> None:
    """RecordError naming the first value no reader of the record can use: an integer beyond the range of a
    float (it overflows every comparison), or text that is not Unicode (a lone surrogate: it cannot be printed)."""
    stack: list[tuple[str, Any]] = [("", record)]
    while stack:  # iterative: a deep record is judged here, not by the interpreter's recursion limit
        where, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                at = f"{where}.{_name(k)}" if where else _name(k)
                stack += [(f"{at} (its name)", k), (at, v)]
        elif isinstance(value, list):
            stack += [(f"{where}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, str) and _name(value) != value:
            raise RecordError(f"{where or 'the record'}: text that is not Unicode ({_name(value)[:60]})")
        elif isinstance(value, int) and not isinstance(value, bool) and as_float(value) is None:
            raise RecordError(f"{where or 'the record'}: an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits, beyond the range of a float")


def check_record(record: Any) -> None:
    """RecordError naming the first entry of ``record`` that is not what ``compare`` and ``merge`` read.

    A run record of this suite (``suite`` "cheapinfer <version>") in a schema this version reads, with the
    verdicts of ``registry.VERDICTS`` only, and only values that can be compared and printed.
    """
    _expect(isinstance(record, dict), "the record", "a JSON object")
    suite = record.get("suite")
    _expect(isinstance(suite, str) and suite.split(" ")[0] == "cheapinfer", "'suite'",
            f"'cheapinfer <version>', not {suite!r}" if "suite" in record else "'cheapinfer <version>', and the record has none")
    schema = record.get("schema")
    _expect(type(schema) is int and schema in SCHEMAS, "'schema'",
            f"{' or '.join(map(str, SCHEMAS))} (the schemas this version reads), not {schema!r}" if "schema" in record
            else f"{' or '.join(map(str, SCHEMAS))}, and the record has none")
    _readable(record)  # before any message quotes a claim ID
    _expect(isinstance(record.get("claims"), dict), "'claims'", "an object of claims by ID")
    for key in ("environment", "run"):
        _expect(isinstance(record.get(key, {}), dict), f"'{key}'", "an object")
    verdicts = registry.VERDICTS  # read now: a verdict added to the registry is known here at once
    known = ", ".join(verdicts)
    for cid, claim in record["claims"].items():
        where = f"claim {cid}"
        _expect(isinstance(claim, dict), where, "an object")
        _expect(isinstance(claim.get("verdict"), str), f"{where}: 'verdict'", "a string")
        _expect(claim["verdict"] in verdicts, f"{where}: 'verdict'", f"one of {known}, not {claim['verdict']!r}")
        _expect(isinstance(claim.get("section"), str) and isinstance(claim.get("statement"), str), where, "a text 'section' and 'statement'")
        _expect(isinstance(claim.get("book", {}), dict), f"{where}: 'book'", "an object")
        _expect(isinstance(claim.get("checks", []), list), f"{where}: 'checks'", "a list")
        for i, spec in enumerate(claim.get("checks", [])):
            at = f"{where}: checks[{i}]"
            _expect(isinstance(spec, dict) and isinstance(spec.get("q"), str) and spec.get("kind") in ("digits", "shape"), at, "an object with 'q' and 'kind' digits|shape")
            if spec["kind"] == "digits":
                _expect(spec.get("form") in ("exact", "rel", "abs", "bound", "one_of"), f"{at}: 'form'", "exact, rel, abs, bound or one_of")
                _expect(spec["form"] == "exact" or (as_float(spec.get("tol")) is not None), f"{at}: 'tol'", "a number")
        _expect(isinstance(claim.get("results", []), list), f"{where}: 'results'", "a list")
        for i, r in enumerate(claim.get("results", [])):
            at = f"{where}: results[{i}]"
            _expect(isinstance(r, dict) and isinstance(r.get("profile"), str) and isinstance(r.get("verdict"), str), at, "an object with a 'profile' and a 'verdict'")
            _expect(r["verdict"] in verdicts, f"{at}: 'verdict'", f"one of {known}, not {r['verdict']!r}")
            _expect(isinstance(r.get("reason", ""), str), f"{at}: 'reason'", "a string")
            _expect(isinstance(r.get("checks", []), list), f"{at}: 'checks'", "a list")
            for j, chk in enumerate(r.get("checks", [])):
                _expect(
                    isinstance(chk, dict) and isinstance(chk.get("q"), str) and "measured" in chk
                    and isinstance(chk.get("asserted"), bool) and isinstance(chk.get("passed"), bool),
                    f"{at}: checks[{j}]", "an object with 'q', 'measured', and true/false 'asserted' and 'passed'",
                )
