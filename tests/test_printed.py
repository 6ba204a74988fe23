"""The registry says what the book prints: every book value has a source, every printed number is kept.

A book value is *printed* (the chapter's own text), a *reading* of a printed text (with the reason),
or *derived* (a formula over printed values or architecture facts, each named). The list of numbers
the chapter prints for each claim, with the quote each comes from, is kept in
``tests/data/printed-numbers.toml``; each of them must appear in its claim's entry.

That list was made by hand, so it is also checked against the chapter itself: ``printed_extract``
finds every numeral and number word of both copies (Dutch and Vietnamese), and each must be either a
claim's number there or an entry of ``tests/data/printed-unclaimed.toml`` that says why it is not.
"""

import re
import tomllib
from pathlib import Path

import pytest
from printed_extract import account, extract, guess_lang

from cheapinfer.harness import registry

ROOT = Path(__file__).resolve().parent.parent
PRINTED = ROOT / "tests" / "data" / "printed-numbers.toml"
UNCLAIMED = ROOT / "tests" / "data" / "printed-unclaimed.toml"
SEEDS = ROOT.parent / "shared" / "seeds"


def _printed() -> dict:
    return tomllib.loads(PRINTED.read_text(encoding="utf-8"))


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_the_printed_list_names_every_claim_once():
    assert list(_printed()) == list(registry.load()), "tests/data/printed-numbers.toml keeps the registry's IDs, in order"


@pytest.mark.parametrize("claim", registry.load().values(), ids=lambda c: c.id)
def test_every_book_value_has_a_printed_text_reading_or_derivation(claim):
    missing = [k for k in claim.book if k not in claim.source]
    assert not missing, f"{claim.id}: book values without a source (printed, reading or derived): {missing}"


@pytest.mark.parametrize("cid", list(registry.load()), ids=str)
def test_every_number_the_chapter_prints_for_a_claim_is_in_its_entry(cid):
    entry = _printed()[cid]
    numbers = entry.get("numbers", [])
    assert numbers or entry.get("none", "").strip(), f"{cid}: list its printed numbers, or say in `none` why there are none"
    claim = registry.get(cid)
    texts = {s.text for s in claim.source.values() if s.kind in ("printed", "reading")}
    for n in numbers:
        assert n["text"] in n["quote"], f"{cid}: {n['text']!r} is not in its own quote"
        assert n["text"] in texts, f"{cid}: the chapter prints {n['text']!r} ({n['quote']!r}), but no book value of the entry is that printed text"


def test_every_quote_is_in_the_chapter():
    seeds = sorted(SEEDS.glob("*.txt")) if SEEDS.is_dir() else []
    if not seeds:
        pytest.skip(f"the chapter's copies are not beside this checkout ({SEEDS}); the quotes were not checked")
    chapter = " ".join(_squash(p.read_text(encoding="utf-8")) for p in seeds)
    missing = [(cid, n["quote"]) for cid, e in _printed().items() for n in e.get("numbers", []) if _squash(n["quote"]) not in chapter]
    assert not missing, f"quotes not found verbatim in the chapter: {missing}"


def _unclaimed(lang: str) -> list[dict]:
    return [e for section in tomllib.loads(UNCLAIMED.read_text(encoding="utf-8")).values() for e in section.get(lang, [])]


def _copies() -> list[tuple[str, Path, str]]:
    """(lang, path, text) for each copy of the chapter beside this checkout; skips when there are none."""
    seeds = sorted(SEEDS.glob("*.txt")) if SEEDS.is_dir() else []
    if not seeds:
        pytest.skip(f"the chapter's copies are not beside this checkout ({SEEDS}); the numbers were not extracted")
    copies = []
    for p in seeds:
        text = p.read_text(encoding="utf-8")
        copies.append((guess_lang(text), p, text))
    assert {lang for lang, _, _ in copies} == {"nl", "vi"}, f"expected a Dutch and a Vietnamese copy in {SEEDS}"
    return copies


def _entries(lang: str) -> list[dict]:
    """The entries that account for a copy's numbers: the claims' (Dutch only) and the unclaimed ones."""
    claimed = [dict(n, claim=cid) for cid, e in _printed().items() for n in e.get("numbers", [])] if lang == "nl" else []
    return claimed + _unclaimed(lang)


def test_every_number_the_chapter_prints_is_accounted_for():
    """A number the hand-made list missed fails here: each one found must be a claim's number or an unclaimed entry."""
    problems = []
    for lang, path, text in _copies():
        unaccounted, _, ambiguous = account(text, extract(text, lang), _entries(lang))
        problems += [f"  {o.lang} line {o.line}: {o.text!r} in {o.context!r}" for o in unaccounted]
        problems += [
            f"  {lang}: quote found {n} times in {path.name}, it must be found exactly once: {e['quote']!r} ({e.get('claim', 'unclaimed')})"
            for e, n in ambiguous
        ]
    assert not problems, (
        "numbers the chapter prints that no entry accounts for: list each under its claim in tests/data/printed-numbers.toml "
        "or, with `why`, in tests/data/printed-unclaimed.toml:\n" + "\n".join(problems)
    )


def test_every_unclaimed_entry_still_matches_a_number_of_the_chapter():
    """An unclaimed entry whose number is gone (the chapter changed, or a typo) would otherwise stay forever."""
    stale = []
    for lang, path, text in _copies():
        unclaimed = _unclaimed(lang)
        _, no_hit, ambiguous = account(text, extract(text, lang), unclaimed)
        stale += [f"  {lang}: {e['text']!r} in {e['quote']!r}: no number found there" for e in no_hit]
        stale += [f"  {lang}: {e['text']!r}: quote found {n} times in {path.name}: {e['quote']!r}" for e, n in ambiguous]
    assert not stale, "stale entries in tests/data/printed-unclaimed.toml:\n" + "\n".join(stale)


def test_every_unclaimed_entry_says_why():
    """`why` is the point of the unclaimed list: a number without a reason is only hidden."""
    for lang in ("nl", "vi"):
        for e in _unclaimed(lang):
            assert set(e) == {"text", "quote", "why"}, f"{lang}: entry with fields {sorted(e)}, expected text, quote, why: {e}"
            assert e["text"] in e["quote"] or re.sub(r"\s+", " ", e["text"]) in _squash(e["quote"]), f"{lang}: {e['text']!r} is not in its own quote"
            assert e["why"].strip(), f"{lang}: {e['text']!r} ({e['quote']!r}) has no `why`"


def test_belongs_to_names_a_claim():
    """An unclaimed number said to belong to a claim must name a real one, so the reason can be followed."""
    ids = set(registry.load())
    for lang in ("nl", "vi"):
        for e in _unclaimed(lang):
            for cid in re.findall(r"(?:belongs to|under) ([A-Z0-9][A-Z0-9.-]*[A-Z0-9])", e["why"]):
                assert cid in ids, f"{lang}: {e['text']!r} ({e['quote']!r}) names {cid}, which is not a claim of the registry"


def _texts(s: str, lang: str) -> list[str]:
    return [o.text for o in extract(s, lang)]


def test_the_extractor_keeps_separators_inside_a_numeral():
    assert _texts("bij 4.096 tokens, 67 MB; 1,98 GB en 0,01386 en 1.579,6.", "nl") == ["4.096", "67", "1,98", "0,01386", "1.579,6"]
    assert _texts("(1, 2, 295, 64) float16", "nl") == ["1", "2", "295", "64", "float16"]
    assert _texts("een 7B-model in fp16, 1,6x sneller, 9 %", "nl") == ["7B", "fp16", "1,6x", "9"]
    assert _texts("model.layers.12.mlp, 16-bit, group-128", "nl") == ["12", "16", "128"]


def test_the_extractor_reads_latex():
    assert _texts("$d = 64$ en $O(T^2)$", "nl") == ["64", "2"]
    assert _texts("$2 \\times 24 = 12{,}288$ en $4 + 16/128 = 4.125$", "nl") == ["2", "24", "12{,}288", "4", "16", "128", "4.125"]


def test_the_extractor_finds_dutch_number_words_but_not_the_article():
    s = "Een half miljard weights, een vijfde van de target, één token, Eén weight op zesduizend, tweeëndertig, honderdtwintig plus acht"
    assert _texts(s, "nl") == ["half miljard", "vijfde", "één", "Eén", "zesduizend", "tweeëndertig", "honderdtwintig", "acht"]
    assert _texts("een negenvoudige, zesvoudig verschil, verdrievoudigd, de helft, een kwart, negenennegentigste", "nl") == [
        "negenvoudige", "zesvoudig", "verdrievoudigd", "helft", "kwart", "negenennegentigste"]
    assert _texts("een token, geen enkele, beide, dezelfde, steeds, eens, alleen", "nl") == []
    assert _texts("357,8 miljoen parameters, een factor vijftien miljoen", "nl") == ["357,8 miljoen", "vijftien miljoen"]


def test_the_extractor_finds_vietnamese_number_words():
    assert _texts("một trăm hai mươi tám với 512, sáu mươi tư lần", "vi") == ["một trăm hai mươi tám", "512", "sáu mươi tư"]
    assert _texts("bảng thứ hai hai lần", "vi") == ["hai", "hai"]
    assert _texts("một phần năm target, nửa tỷ trọng số, mười lăm triệu lần, 4,3 triệu", "vi") == [
        "một phần năm", "nửa tỷ", "mười lăm triệu", "4,3 triệu"]
    # "một" (a / one) and "năm" (five / year) are always extracted: the accounting decides which they are.
    assert _texts("một token, năm forward pass", "vi") == ["một", "năm"]
    assert _texts("tỷ lệ, không có, lớn nhất", "vi") == []


def test_the_extractor_finds_footnote_markers_and_gives_line_and_sentence():
    occ = extract("Titel\n\nMulti-query attention¹ voert dit. Hoofdstuk 9 introduceerde het.", "nl")
    assert [(o.text, o.line) for o in occ] == [("¹", 3), ("9", 3)]
    assert occ[1].context == "Hoofdstuk 9 introduceerde het."


def test_an_entry_accounts_for_its_place_only():
    """The same number printed a second time is a new occurrence: a quote found twice accounts for nothing."""
    text = "Van 16 naar 32. Later weer 16 tokens."
    occ = extract(text, "nl")
    unaccounted, stale, ambiguous = account(text, occ, [{"text": "16", "quote": "Van 16 naar"}, {"text": "32", "quote": "32"}])
    assert [o.text for o in unaccounted] == ["16"] and unaccounted[0].start == text.rindex("16")
    assert not stale and not ambiguous
    _, _, ambiguous = account(text, occ, [{"text": "16", "quote": "16"}])
    assert ambiguous
