"""The arithmetic the registry's text states, recomputed: every ``expression = number`` in a ``why``, a note, an
erratum or a source reading, where the expression is numbers and operators only.

An expression is the longest run of numbers (``1,320`` and ``2^-24`` included), operators (``+ - x * / ^``),
parentheses and ``sqrt`` that ends at the ``=``; a unit word between a number and the next operator (``40 layers x``)
is skipped. Expressions with a symbol (``48 D + 51 p``) are not arithmetic and are left alone. The stated number is
matched to its own printed precision: half a unit of its last digit (``2.56`` within 0.005, ``3.9e-3`` within 5e-5,
``98.6%`` read as 0.986 within 0.0005).
"""

from __future__ import annotations

import math
import re
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:e-?\d+)?"
_EQUATION = re.compile(r"(?P<lhs>[^=;:]{0,160}?)\s=\s(?P<rhs>" + NUMBER + r")(?P<pct>%?)(?:\s(?P<unit>[KMG]i?B)\b)?(?!\d|[.,]\d|\^|\s?[x*/+^]\s?\d)")
_TOKEN = re.compile(r"sqrt|" + NUMBER + r"|\^|x(?![A-Za-z])|[*/+\-()]|[A-Za-z]+|\S")
_OPERATORS = set("x*/+-^")
_UNIT = r"[KMGT]?i?B|bits?|bytes?"
_BYTES = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@dataclass(frozen=True)
class Stated:
    where: str  # claim and field
    expression: str  # as evaluated (Python syntax)
    stated: float
    computed: float
    tolerance: float

    @property
    def holds(self) -> bool:
        return abs(self.computed - self.stated) <= self.tolerance

    def describe(self) -> str:
        return f"{self.where}: {self.expression} = {self.computed:.6g}, stated {self.stated:g} (within {self.tolerance:g})"


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def precision(text: str) -> float:
    """Half a unit of the last digit of a printed number."""
    mantissa, _, exponent = text.replace(",", "").partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 0.5 * 10.0 ** (-decimals) * 10.0 ** int(exponent or 0)


def expression(lhs: str) -> str | None:
    """The arithmetic that ends ``lhs``, in Python syntax; None where it is not arithmetic (no operator, a symbol)."""
    tokens = _TOKEN.findall(lhs)
    out: list[str] = []
    i = len(tokens) - 1
    while i >= 0:
        t = tokens[i]
        if re.fullmatch(NUMBER, t) or t in _OPERATORS or t in "()" or t == "sqrt":
            out.append(t)
        elif (out and out[-1] in _OPERATORS and re.fullmatch(r"[A-Za-z]+", t)) or (not out and re.fullmatch(_UNIT, t)):
            j = i  # unit words between a number and an operator ("8 KV heads x") or before the "=" ("2 B =")
            while j > 0 and re.fullmatch(r"[A-Za-z]+", tokens[j - 1]) and tokens[j - 1] != "x":
                j -= 1
            if j == 0 or not re.fullmatch(NUMBER, tokens[j - 1]):
                if out:
                    return None  # a symbol is a factor ("x K and V x"): not arithmetic
                break
            i = j - 1  # the number before the words
            continue
        else:
            break
        i -= 1
    out.reverse()
    while out and (out[0] in _OPERATORS - {"-"} or out[0] == ")"):
        out.pop(0)
    if not any(t in _OPERATORS for t in out[1:]) or not any(re.fullmatch(NUMBER, t) for t in out):
        return None
    while out and out[0] == "(" and out.count("(") > out.count(")"):
        out.pop(0)  # a parenthesis opened before the arithmetic: "(0.01 / 2^-8 = 2.56)"
    if out.count("(") != out.count(")"):
        return None
    spelled = {"x": "*", "^": "**", "sqrt": "math.sqrt"}
    return " ".join(spelled.get(t, t.replace(",", "")) for t in out)


def equations(text: str, where: str = "") -> Iterator[Stated]:
    """Every ``arithmetic = number`` ``text`` states, recomputed."""
    for m in _EQUATION.finditer(text):
        expr = expression(m["lhs"])
        if expr is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            try:
                value = eval(expr, {"__builtins__": {}, "math": math})  # numbers and operators only (expression())
            except (SyntaxError, TypeError, ZeroDivisionError):
                continue
        scale = 100.0 if m["pct"] else 1.0
        if m["unit"] and re.search(r"\bB\s*$", m["lhs"]):  # bytes stated in another unit: "7e9 x 2 B = 13.04 GiB"
            scale = 1 / _BYTES[m["unit"]]
        yield Stated(where, expr, _number(m["rhs"]), value * scale, precision(m["rhs"]) * (1 + 1e-9))


def strings(node, where: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a parsed registry, with where it sits (claim, field)."""
    if isinstance(node, str):
        yield where, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from strings(v, f"{where}.{k}" if where else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            label = v.get("q", i) if isinstance(v, dict) else i
            yield from strings(v, f"{where}[{label}]")


def registry_equations(path: Path) -> list[Stated]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return [s for where, text in strings(data) for s in equations(text, where)]
