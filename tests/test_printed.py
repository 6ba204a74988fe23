"""The registry says what the book prints: every book value has a source, every printed number is kept.

A book value is *printed* (the chapter's own text), a *reading* of a printed text (with the reason),
or *derived* (a formula over printed values or architecture facts, each named). The list of numbers
the chapter prints for each claim, with the quote each comes from, is kept in
``tests/data/printed-numbers.toml``; each of them must appear in its claim's entry.
"""

import re
import sys
from pathlib import Path

import pytest

from cheapinfer import registry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PRINTED = ROOT / "tests" / "data" / "printed-numbers.toml"
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
