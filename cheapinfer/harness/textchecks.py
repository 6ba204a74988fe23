"""Checks of the chapter's text against itself: the numbers it prints, read from the text by code.

- round words ("zesvoudig", "zesduizend", "negenhonderd") against the value the chapter's printed numbers give,
  graded by :func:`cheapinfer.harness.grades.round_word_grade`;
- byte quantities: whether each printed size is decimal (10^3 steps) or binary (2^10 steps) for its byte count;
- formulas: a number inside ``$...$`` written in another locale than the prose around it (the formula's own
  arithmetic decides how its result must read).

Pure functions of a chapter's text (either translation); every quote is found exactly once or the check fails.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from typing import Any

from . import grades
from .locate import Entry, LocateError, line_of

EN, PROSE = "en", "prose"  # a listing's output prints English numbers; the prose, the translation's locale

#: Each round word: its words in each translation, the number it states, and the printed numbers that measure it
#: (a quote found exactly once per translation; its last number, read in its locale). ``value``: the expression.
ROUND_WORDS: tuple[dict[str, Any], ...] = (
    {"id": "prefill-sixfold", "nl": "een zesvoudig verschil", "vi": "chênh lệch sáu lần", "stated": 6, "fold": True,
     "inputs": {"step": ("decode,  47 steps         : 0.1665", EN), "prefill": ("prompt tokens : 1.0224", EN), "n": ("prefill, 40", EN)},
     "value": "step / (prefill / n)"},
    {"id": "budget-twentyfold", "nl": "een twintigvoudig verschil", "vi": "chênh lệch hai mươi lần", "stated": 20, "fold": True,
     "inputs": {"a": ({"nl": "De 7B krijgt 65.378", "vi": "7B có 65.378"}, PROSE), "b": ({"nl": "de 13B krijgt 3.136", "vi": "13B có 3.136"}, PROSE)},
     "value": "a / b"},
    {"id": "downproj-six-thousand", "nl": "Eén weight op zesduizend", "vi": "Một trọng số trong sáu nghìn", "stated": 6000, "fold": False,
     "inputs": {"n": ("692 of 4,358,144", EN), "k": ("weights beyond 6 sigma: 692", EN)}, "value": "n / k"},
    {"id": "histogram-900", "nl": "Negenhonderd dimensions", "vi": "Chín trăm chiều", "stated": 900, "fold": False,
     "inputs": {"a": ("| ######################################## 254", EN), "b": ("| ######################################## 283", EN),
                "c": ("| ######################################## 226", EN), "d": ("| ######################################## 93", EN),
                "whole": ({"nl": "Het histogram van die 896", "vi": "Histogram của 896"}, PROSE)},
     "value": "a + b + c + d"},
    {"id": "distillation-decade", "nl": "bijna tien jaar ouder", "vi": "gần một thập kỷ", "stated": 10, "fold": False,
     "inputs": {}, "value": ""},
)

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
#: Each locale's separators: (thousands, decimal).
SEPARATORS = {EN: (",", "."), PROSE: (".", ",")}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def number(text: str, locale: str) -> float:
    """The last number in ``text``, read in ``locale`` (EN: 4,358,144 and 0.1665; PROSE: 65.378 and 4,25)."""
    found = _NUMBER.findall(text)
    if not found:
        raise LocateError(f"no number in {text!r}")
    digits = found[-1]
    thousands, decimal = SEPARATORS[locale]
    return float(digits.replace(thousands, "").replace(decimal, "."))


def arithmetic(expr: str, names: dict[str, float] | None = None) -> float:
    """``expr`` evaluated: numbers, names, + - * / and parentheses only (never ``eval``)."""
    names = names or {}

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise LocateError(f"not plain arithmetic: {expr!r}")

    try:
        return ev(ast.parse(expr, mode="eval"))
    except SyntaxError:
        raise LocateError(f"not plain arithmetic: {expr!r}") from None


@dataclass(frozen=True)
class RoundWord:
    id: str
    line: int
    word: str
    stated: float
    value: float | None
    whole: float | None
    grade: str | None  # None: accepted (or not graded, value None)

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "not graded: no printed number measures it"
        return self.grade or "accepted: within its rounding band"


def round_words(text: str, lang: str) -> list[RoundWord]:
    """Every round word of :data:`ROUND_WORDS` in ``text`` (translation ``lang``), with its value and grade."""
    out = []
    for w in ROUND_WORDS:
        line = line_of(text, w[lang])
        names = {}
        for name, (quote, locale) in w["inputs"].items():
            q = quote[lang] if isinstance(quote, dict) else quote
            line_of(text, q)
            names[name] = number(q, locale)
        value = arithmetic(w["value"], names) if w["value"] else None
        whole = names.get("whole")
        out.append(RoundWord(w["id"], line, w[lang], w["stated"], value, whole,
                             grades.round_word_grade(w["stated"], value, fold=w["fold"], whole=whole)))
    return out


# ----------------------------------------------------------------------------------------------
# byte quantities
# ----------------------------------------------------------------------------------------------

_SIZE = re.compile(r"(\d+(?:,\d+)?)\s?([KMG])B\b")
_POWER = {"K": 1, "M": 2, "G": 3}
#: Each unit system's step: a kilo of it is BASES[name] bytes.
BASES = {"decimal": 10**3, "binary": 2**10}


def readings(printed: str, nbytes: float) -> set[str]:
    """Under which unit system ``printed`` ("768 MB", "13,0 GB") states ``nbytes`` to its printed digits:
    a subset of {"decimal", "binary"} (empty: neither)."""
    m = _SIZE.search(printed)
    if not m:
        raise LocateError(f"no size in KB, MB or GB in {printed!r}")
    digits, unit = m.groups()
    places = len(digits.split(",")[1]) if "," in digits else 0
    value = float(digits.replace(",", "."))
    out = set()
    for name, base in BASES.items():
        if round(nbytes / base ** _POWER[unit], places) == value:
            out.add(name)
    return out


def unit_findings(text: str, lang: str, entry: Entry) -> list[dict[str, Any]]:
    """Each occurrence of the units entry: its line, the first size it prints, and the readings its byte count allows."""
    out = []
    for o in entry.occurrences:
        quote = o.quotes[lang]
        out.append({"line": line_of(text, quote), "printed": _SIZE.search(quote).group(0), "bytes": arithmetic(o.bytes),
                    "readings": sorted(readings(quote, arithmetic(o.bytes))), "keep": not o.changes(lang)})
    return out


# ----------------------------------------------------------------------------------------------
# formulas
# ----------------------------------------------------------------------------------------------

_FORMULA = re.compile(r"\$([^$]*?)=\s*([\d.,{}]+)\s*\$")
_TEX_OPS = {r"\times": "*", r"\cdot": "*"}


def prose_locale(text: str) -> str:
    """"comma": the prose writes decimals with a comma (4,25) and thousands with a point (65.536); "point" otherwise.

    Read from the prose lines (a line with a formula or a listing's output is left out): the form that occurs more."""
    prose = [line for line in text.splitlines() if "$" not in line and len(line) > 80]
    comma = sum(len(re.findall(r"\d,\d{1,2}\b|\d{1,3}\.\d{3}\b", line)) for line in prose)
    point = sum(len(re.findall(r"\d\.\d{1,2}\b|\d{1,3},\d{3}\b", line)) for line in prose)
    return "comma" if comma >= point else "point"


def formula_findings(text: str) -> list[dict[str, Any]]:
    """Every ``$ arithmetic = number $`` whose result, read in the prose's locale, is not what its arithmetic gives,
    while read in the other locale it is: the formula writes its number in the other locale."""
    locale = prose_locale(text)
    out = []
    for m in _FORMULA.finditer(text):
        lhs = m.group(1)
        for tex, op in _TEX_OPS.items():
            lhs = lhs.replace(tex, op)
        try:
            want = arithmetic(lhs.strip())
        except LocateError:
            continue  # not a plain computation
        raw = m.group(2).replace("{,}", ",")
        here = number(raw, PROSE if locale == "comma" else EN)
        there = number(raw, EN if locale == "comma" else PROSE)
        if abs(here - want) > 1e-9 * max(1.0, abs(want)) and abs(there - want) <= 1e-9 * max(1.0, abs(want)):
            out.append({"line": text.count("\n", 0, m.start()) + 1, "formula": m.group(0), "computes": want, "reads_as": here})
    return out
