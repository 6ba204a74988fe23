"""The graded findings placed in the chapter's text: cheapinfer/errata.toml read and checked, every quote found in
a translation (its line computed, never typed), and the unified diff of every replacement.

Pure functions of the data file and a chapter's text; no registry run, no model.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import grades

DATA = Path(__file__).resolve().parent.parent / "errata.toml"
LANGUAGES = ("nl", "vi")
#: The seed translations, one file each, beside a checkout (absent outside one: tests skip with this reason).
SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"


class LocateError(ValueError):
    """A quote found other than exactly once, or a data entry that lacks what it must give; one line."""


@dataclass(frozen=True)
class Occurrence:
    quotes: dict[str, str]  # language -> the exact printed words
    replacements: dict[str, str]  # language -> the words that replace them (equal to the quote where nothing changes)
    bytes: str = ""  # units entries: the byte count, as an arithmetic expression of printed numbers

    def changes(self, lang: str) -> bool:
        return self.replacements[lang] != self.quotes[lang]


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    basis: str
    finding: str
    occurrences: tuple[Occurrence, ...]
    claim: str = ""
    erratum: int | None = None  # index among the claim's registry errata
    round_word: str = ""

    @property
    def grade(self) -> str:
        return grades.grade(self.basis)


def _occurrence(eid: str, i: int, raw: dict[str, Any]) -> Occurrence:
    quotes, new = {}, {}
    for lang in LANGUAGES:
        for key, into in ((lang, quotes), (f"{lang}_new", new)):
            text = raw.get(key)
            if not isinstance(text, str) or not text.strip():
                raise LocateError(f"{eid}: occurrence {i + 1} has no {key!r} (every occurrence gives the printed words and their replacement in each language)")
            into[lang] = text
        keep = raw.get("keep", False) or raw.get(f"keep_{lang}", False)
        if keep and new[lang] != quotes[lang]:
            raise LocateError(f"{eid}: occurrence {i + 1} keeps its {lang} text but gives another")
        if not keep and new[lang] == quotes[lang]:
            raise LocateError(f"{eid}: occurrence {i + 1}'s {lang} replacement is its quote (mark keep = true where nothing changes)")
    return Occurrence(quotes, new, str(raw.get("bytes", "")))


def entries(raw: dict[str, Any] | None = None) -> list[Entry]:
    """The entries of cheapinfer/errata.toml (or of ``raw``, its parsed form), checked: LocateError on the first fault."""
    if raw is None:
        raw = tomllib.loads(DATA.read_text(encoding="utf-8"))
    out, seen = [], set()
    for e in raw.get("entry", []):
        eid = e.get("id", "?")
        for key in ("id", "title", "basis", "finding"):
            if not e.get(key):
                raise LocateError(f"{eid}: entry needs {key!r}")
        if eid in seen:
            raise LocateError(f"{eid}: two entries with this id")
        seen.add(eid)
        try:
            grades.grade(e["basis"])
        except ValueError as exc:
            raise LocateError(f"{eid}: {exc}") from None
        occ = tuple(_occurrence(eid, i, o) for i, o in enumerate(e.get("occurrence", [])))
        if not occ:
            raise LocateError(f"{eid}: entry has no occurrence (its place in the chapter)")
        out.append(Entry(eid, e["title"], e["basis"], e["finding"], occ, e.get("claim", ""), e.get("erratum"), e.get("round_word", "")))
    return out


def line_of(text: str, quote: str) -> int:
    """The 1-based line where ``quote`` starts in ``text``; LocateError unless it is found exactly once."""
    first = text.find(quote)
    if first < 0:
        raise LocateError(f"not found: {quote!r}")
    second = text.find(quote, first + 1)
    if second >= 0:
        lines = sorted({text.count("\n", 0, first) + 1, text.count("\n", 0, second) + 1})
        raise LocateError(f"found more than once (lines {', '.join(map(str, lines))}; first two shown): {quote!r}")
    return text.count("\n", 0, first) + 1


def language_of(text: str, found: list[Entry] | None = None) -> str:
    """Which translation ``text`` is: the language whose quotes it holds most of; LocateError when it holds none."""
    found = entries() if found is None else found
    counts = {lang: sum(o.quotes[lang] in text for e in found for o in e.occurrences) for lang in LANGUAGES}
    best = max(counts, key=counts.get)
    if not counts[best]:
        raise LocateError("the text holds none of the quotes of either translation: is it the chapter?")
    return best


def locations(text: str, lang: str, found: list[Entry] | None = None) -> dict[str, list[int]]:
    """Entry id -> the line of each occurrence in ``text`` (LocateError naming the entry and quote otherwise)."""
    out = {}
    for e in entries() if found is None else found:
        lines = []
        for i, o in enumerate(e.occurrences):
            try:
                lines.append(line_of(text, o.quotes[lang]))
            except LocateError as exc:
                raise LocateError(f"{e.id}, occurrence {i + 1} ({lang}): {exc}") from None
        out[e.id] = lines
    return out


def patched(text: str, lang: str, found: list[Entry] | None = None) -> str:
    """``text`` with every replacement applied once; LocateError (with its line) for a quote not found exactly once
    or for two replacements that overlap."""
    spans = []
    for e in entries() if found is None else found:
        for i, o in enumerate(e.occurrences):
            try:
                line_of(text, o.quotes[lang])
            except LocateError as exc:
                raise LocateError(f"{e.id}, occurrence {i + 1} ({lang}): {exc}") from None
            if o.changes(lang):
                start = text.find(o.quotes[lang])
                spans.append((start, start + len(o.quotes[lang]), o.replacements[lang], e.id))
    spans.sort()
    for (s1, e1, _, a), (s2, _, _, b) in zip(spans, spans[1:]):
        if s2 < e1:
            raise LocateError(f"{a} and {b} replace overlapping text at line {text.count(chr(10), 0, s2) + 1}")
    return splice(text, spans)


def splice(text: str, spans: list[tuple[int, int, str, str]]) -> str:
    """``text`` with each ``(start, end, new, entry)`` span of the original text (sorted, disjoint) replaced by ``new``:
    each replacement once, at its own place, so that a replacement's words are never replaced again."""
    out, at = [], 0
    for start, end, new, _ in spans:
        out += [text[at:start], new]
        at = end
    return "".join(out) + text[at:]


def _diff_lines(lines: list[str]) -> list[str]:
    """difflib's lines, with git's marker after a line that has no newline at the end of the file."""
    return [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines]


def unified_diff(text: str, name: str, lang: str | None = None, found: list[Entry] | None = None) -> str:
    """The unified diff (``a/NAME`` -> ``b/NAME``, for ``patch -p1`` or ``git apply`` beside the file) of every replacement."""
    found = entries() if found is None else found
    lang = lang or language_of(text, found)
    new = patched(text, lang, found)
    diff = difflib.unified_diff(text.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}", n=1)
    return "".join(_diff_lines(list(diff)))
