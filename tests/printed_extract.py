"""Find every number the chapter prints, in both of its copies, so that none can go unaccounted.

``tests/data/printed-numbers.toml`` lists, per claim, the numbers the Dutch copy prints for it; it was
made by hand, and a list made by hand misses numbers. This module finds them mechanically: every
numeral and every number word of the Dutch copy (``nl``) and of the Vietnamese one (``vi``), each as
an :class:`Occurrence` (the copy, the matched text, its offsets, its line and the sentence around it).
:func:`account` then says which occurrences no entry accounts for, and which entries account for none.

What counts as a number (the rules are deliberate; ``tests/test_printed.py`` tests them):

Numerals (both copies)
    A run of digits, with the separators the copies use *between digits* kept inside it: ``4.096``,
    ``65.536``, ``1,98``, ``0.01386``, ``1.579,6``, ``365.416.000``, ``3,624,960`` and LaTeX's
    ``12{,}288``. A comma or point followed by a space ends it, so ``(1, 2, 295, 64)`` is four
    numerals. Letters glued to the digits belong to it: ``7B``, ``fp16``, ``int8``, ``NF4``, ``22x``,
    ``1,6x``, ``CS336`` (a name with a number in it is still a printed number; the accounting says
    what kind). Anything else ends it: ``%``, ``-`` (``16-bit`` gives ``16``), ``^`` and ``/`` (``$O(T^2)$``
    gives ``2``, ``16/128`` gives ``16`` and ``128``), ``.`` before a letter (``layers.12.mlp`` gives ``12``).
    Numerals inside code listings, the histogram and LaTeX count like any other. Superscript
    footnote markers (``¹``, ``¹⁰``) are numerals too.

A numeral or number word followed by a scale word is one occurrence: ``357,8 miljoen``,
``half miljard``, ``vijftien miljoen``, ``4,3 triệu``, ``nửa tỷ``, ``mười lăm triệu``.

Dutch number words (whole words, any case)
    Cardinals and their compounds: ``één``/``eén``, ``twee`` ... ``twaalf``, ``dertien`` ... ``negentien``,
    ``twintig`` ... ``negentig``, ``tweeëndertig``, ``vierenzestig``, ``zevenenveertig``, ``honderd``,
    ``tweehonderd``, ``honderdtwintig``, ``negenhonderd``, ``duizend``, ``zesduizend``, ``miljoen``,
    ``miljard``, ``nul``; ordinals (``eerste``, ``tweede``, ``derde``, ``vierde``, ``achtste``,
    ``negenennegentigste``); fractions (``helft``, ``helften``, ``half``, ``halve``, ``kwart``; ``derde`` and
    ``vijfde`` are the ordinals); multiplicatives (``negenvoudige``, ``zesvoudig``, ``twintigvoudig``,
    ``verdrievoudigd``, ``dubbel``, ``verdubbelt``) and ``ene`` (``die ene weight``: the inflected *one*).

    Ambiguity: the article ``een`` (no accents) is NOT a number: Dutch spells the numeral *one*
    ``één``/``eén``, and the copy does so throughout (``één token``, ``Eén weight``); a number the article
    introduces is caught by its own word (``een half miljard`` gives ``half miljard``, ``een vijfde`` gives
    ``vijfde``). ``geen`` (none), ``beide`` (both), ``enkele`` (single, some), ``paar`` and ``handvol`` are
    quantifiers, not numbers, and are not extracted; ``eerstvolgende`` (next) is not an ordinal.

Vietnamese number words (whole syllables, any case)
    ``một``, ``hai``, ``ba``, ``bốn``, ``năm``, ``sáu``, ``bảy``, ``tám``, ``chín``, ``mười``, ``trăm``,
    ``nghìn``/``ngàn``, ``triệu``, ``tỷ``/``tỉ``, ``nửa``, ``rưỡi``, ``đôi`` and ``thập kỷ`` (a decade);
    the compound-only syllables ``mươi``, ``mốt``, ``lăm``, ``tư``, ``linh``, ``lẻ`` only inside a compound
    (``tư`` also after ``phần`` and ``thứ``: ``một phần tư``, ``thứ tư``). Adjacent number syllables make
    one compound (``sáu mươi tư``, ``một trăm hai mươi tám``, ``mười lăm triệu``), except two digit
    words in a row (``bảng thứ hai hai lần`` is two occurrences); ``X phần Y`` with numbers on both sides
    is one fraction (``một phần năm``, ``một phần hai trăm``).

    Ambiguity: ``một`` is both the article *a* and the numeral *one*, and Vietnamese does not tell
    them apart in writing; ``năm`` is both *five* and *year*. Every occurrence of both is extracted, and
    the accounting says, per occurrence, which it is (``article, not a number`` or the Dutch ``één`` it
    translates). ``tỷ lệ`` (ratio) is a word, not a number; ``không`` (not; zero only inside a numeral
    such as ``không phẩy năm``, which the copy never prints) and ``nhất`` (the superlative) are not
    extracted; ``đơn`` (single) and ``cả hai`` are quantifiers, but ``hai`` in ``cả hai`` is extracted like
    every ``hai``.

English number words (both copies keep some English)
    ``zero`` ... ``ten``, ``hundred``, ``thousand``, ``million``, ``billion``, ``first``, ``second``,
    ``third``, ``half``, ``once``, ``twice``, ``double``; ``second`` is extracted also where it is the unit
    (``Tokens per second``), and the accounting says so.

Accounting: an entry ``{ text, quote }`` accounts for the occurrences that lie inside a match of
``text`` inside the match of ``quote`` in that copy (whitespace runs match any whitespace). A quote
must occur exactly once in its copy, so an entry accounts for one place in the chapter, and the same
number printed somewhere else is a new, unaccounted occurrence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

LANGS = ("nl", "vi")

_SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
_LETTER = rf"[^\W\d_{_SUPERSCRIPTS}]"

_NUMERAL = re.compile(rf"(?<![\w{_SUPERSCRIPTS}]){_LETTER}*\d+(?:(?:[.,]|\{{,\}})\d+)*{_LETTER}*")
_FOOTNOTE = re.compile(f"[{_SUPERSCRIPTS}]+")
_WORD = re.compile(rf"{_LETTER}+")

# Dutch cardinals, built as a grammar so that compounds are words of it.
_U = "(?:een|één|eén|twee|drie|vier|vijf|zes|zeven|acht|negen)"
_TEEN = "(?:tien|elf|twaalf|dertien|veertien|vijftien|zestien|zeventien|achttien|negentien)"
_TENS = "(?:twintig|dertig|veertig|vijftig|zestig|zeventig|tachtig|negentig)"
_B100 = rf"(?:(?:{_U}(?:en|ën))?{_TENS}|{_TEEN}|{_U})"
_B1000 = rf"(?:{_U}?honderd{_B100}?|{_B100})"
_CARD = rf"(?:{_B1000}?duizend{_B1000}?|{_B1000}|miljoen|miljard|nul)"
_NL_WORD = re.compile(
    rf"(?:{_CARD}|{_CARD}(?:de|ste)|eerste|derde|ene"
    rf"|(?:ver)?{_CARD}voudig(?:e|t|d|de|en)?|dubbele?|verdubbel(?:t|d|de|en)?"
    rf"|helft|helften|half|halve|kwart|kwarten|anderhalf)",
    re.IGNORECASE,
)
_NL_SCALE = {"honderd", "duizend", "miljoen", "miljard"}

_EN_WORD = re.compile(
    r"(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|hundred|thousand|million|billion"
    r"|first|second|third|half|once|twice|double)",
    re.IGNORECASE,
)

_VI_DIGIT = {"một", "hai", "ba", "bốn", "năm", "sáu", "bảy", "tám", "chín"}
_VI_SCALE = {"mười", "trăm", "nghìn", "ngàn", "triệu", "tỷ", "tỉ"}
_VI_HALF = {"nửa", "đôi"}
_VI_PART = {"mươi", "mốt", "lăm", "tư", "linh", "lẻ", "rưỡi"}  # only inside a compound


@dataclass(frozen=True)
class Occurrence:
    """One number printed in one copy: ``text`` at ``[start, end)`` of the copy, on ``line`` (1-based)."""

    lang: str
    text: str
    start: int
    end: int
    line: int
    context: str

    def __str__(self) -> str:
        return f"{self.lang} line {self.line}: {self.text!r} in {self.context!r}"


def guess_lang(text: str) -> str:
    """``vi`` for the Vietnamese copy (its letters ư ơ đ ă), ``nl`` otherwise."""
    vi = len(re.findall("[ươđăƯƠĐĂ]", text))
    return "vi" if vi > len(text) / 500 else "nl"


def _sentence(text: str, start: int, end: int) -> str:
    """The sentence around ``[start, end)``: within its line, between sentence ends (``. `` ``! `` ``? ``)."""
    ls = text.rfind("\n", 0, start) + 1
    le = text.find("\n", end)
    le = len(text) if le < 0 else le
    line = text[ls:le]
    s, e = start - ls, end - ls
    cut = [m.end() for m in re.finditer(r"[.!?:]\s+", line)]
    left = max([c for c in cut if c <= s], default=0)
    right = min([c for c in cut if c >= e], default=len(line))
    return line[left:right].strip()


def _raw_nl(text: str) -> list[tuple[int, int, str]]:
    items = []
    for m in _WORD.finditer(text):
        w = m.group()
        if w.lower() != "een" and (_NL_WORD.fullmatch(w) or _EN_WORD.fullmatch(w)):
            items.append((m.start(), m.end(), "scale" if w.lower() in _NL_SCALE else "word"))
    return items


def _raw_vi(text: str) -> list[tuple[int, int, str]]:
    """Number syllables with their role: digit, scale, half, part, phan (a fraction's ``phần``)."""
    words = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(text)]
    items: list[tuple[int, int, str]] = []
    for i, (s, e, w) in enumerate(words):
        lw = w.lower()
        prev = words[i - 1][2].lower() if i else ""
        nxt = words[i + 1][2].lower() if i + 1 < len(words) else ""
        adjacent_prev = i > 0 and text[words[i - 1][1]:s].strip() == ""
        prev_is_num = bool(items) and items[-1][1] == words[i - 1][1] and adjacent_prev
        if lw in _VI_DIGIT:
            items.append((s, e, "digit"))
        elif lw in ("tỷ", "tỉ") and nxt == "lệ":
            continue
        elif lw in _VI_SCALE:
            items.append((s, e, "scale"))
        elif lw in _VI_HALF:
            items.append((s, e, "half"))
        elif lw in _VI_PART and (prev_is_num or (lw == "tư" and prev in ("phần", "thứ"))):
            items.append((s, e, "part"))
        elif lw == "thập" and nxt == "kỷ":
            items.append((s, words[i + 1][1], "scale"))
        elif _EN_WORD.fullmatch(w):
            items.append((s, e, "word"))
    # A fraction: NUM phần NUM (the "phần" joins the two).
    phan = [
        (m.start(), m.end(), "phan")
        for m in re.finditer(r"(?<!\w)phần(?!\w)", text, re.IGNORECASE)
        if any(e2 <= m.start() and text[e2:m.start()].strip() == "" for _, e2, _ in items)
        and any(s2 >= m.end() and text[m.end():s2].strip() == "" for s2, _, _ in items)
    ]
    return sorted(items + phan)


def _join_nl(prev: str, cur: str) -> bool:
    return cur == "scale"


def _join_vi(prev: str, cur: str) -> bool:
    if cur == "phan" or prev == "phan":
        return True
    if prev == "digit" and cur == "digit":
        return False  # "thứ hai hai lần": two numbers
    if cur in ("scale", "part"):
        return prev in ("digit", "scale", "part", "half", "numeral")
    if cur == "digit":
        return prev in ("scale", "part")
    return False  # "hai nửa" (two halves) is two numbers; "nửa tỷ" joins as half + scale


def extract(text: str, lang: str | None = None) -> list[Occurrence]:
    """Every numeral and number word of ``text`` (a copy of the chapter), in order."""
    lang = lang or guess_lang(text)
    if lang not in LANGS:
        raise ValueError(f"unknown copy {lang!r}: {LANGS}")
    raw = [(m.start(), m.end(), "numeral") for m in _NUMERAL.finditer(text)]
    raw += [(m.start(), m.end(), "footnote") for m in _FOOTNOTE.finditer(text)]
    raw += _raw_nl(text) if lang == "nl" else _raw_vi(text)
    raw.sort()
    join = _join_nl if lang == "nl" else _join_vi
    groups: list[list[tuple[int, int, str]]] = []
    for item in raw:
        if groups:
            ps, pe, prole = groups[-1][-1]
            gap = text[pe:item[0]]
            if gap.strip() == "" and "\n" not in gap and prole != "footnote" and item[2] != "footnote" and join(prole, item[2]):
                groups[-1].append(item)
                continue
        groups.append([item])
    out = []
    for g in groups:
        s, e = g[0][0], g[-1][1]
        out.append(Occurrence(lang, text[s:e], s, e, text.count("\n", 0, s) + 1, _sentence(text, s, e)))
    return out


def loose(fragment: str) -> re.Pattern:
    """A pattern for ``fragment`` in which every run of whitespace matches any run of whitespace."""
    return re.compile(r"\s+".join(re.escape(p) for p in fragment.split()))


def quote_spans(text: str, quote: str) -> list[tuple[int, int]]:
    """Where ``quote`` stands in ``text`` (whitespace-insensitive)."""
    return [m.span() for m in loose(quote).finditer(text)]


def covered(text: str, occurrences: Iterable[Occurrence], number: str, quote: str) -> list[Occurrence]:
    """The occurrences that lie inside a match of ``number`` inside the (one) match of ``quote``."""
    spans = quote_spans(text, quote)
    if len(spans) != 1:
        return []
    qs, qe = spans[0]
    inner = [(qs + m.start(), qs + m.end()) for m in loose(number).finditer(text[qs:qe])]
    return [o for o in occurrences if any(s <= o.start and o.end <= e for s, e in inner)]


def account(text: str, occurrences: list[Occurrence], entries: Iterable[dict]):
    """Match ``entries`` (dicts with ``text`` and ``quote``) against the occurrences of one copy.

    Returns ``(unaccounted, stale, ambiguous)``: the occurrences no entry covers, the entries that cover
    none, and the entries whose quote is not found exactly once in the copy (a quote found twice could
    hide a second, unaccounted place; one not found accounts for nothing).
    """
    seen: set[Occurrence] = set()
    stale, ambiguous = [], []
    for entry in entries:
        n = len(quote_spans(text, entry["quote"]))
        if n != 1:
            ambiguous.append((entry, n))
            continue
        hit = covered(text, occurrences, entry["text"], entry["quote"])
        if not hit:
            stale.append(entry)
        seen.update(hit)
    return [o for o in occurrences if o not in seen], stale, ambiguous
