"""cheapinfer/errata.toml: every graded finding located in both translations, graded by the one rule, and applied as a patch."""

import copy
import shutil
import subprocess
import tomllib
from collections import Counter

import pytest

from cheapinfer.faults.text import CHECKS, FORMULAS, LISTINGS, LOCATE, PATCH, ROUND_WORDS, TEXT_FAULTS, UNITS
from cheapinfer.harness import grades, locate, registry, textchecks

SEEDS = sorted(locate.SEEDS.glob("*.txt")) if locate.SEEDS.is_dir() else []
needs_seeds = pytest.mark.skipif(not SEEDS, reason=f"the chapter's translations are not beside this checkout ({locate.SEEDS})")


def _raw():
    return tomllib.loads(locate.DATA.read_text(encoding="utf-8"))


def test_every_registry_erratum_is_one_entry_and_its_grade_is_the_rules():
    placed = {(e.claim, e.erratum): e for e in locate.entries() if e.erratum is not None}
    for cid, claim in registry.load().items():
        for i, erratum in enumerate(claim.errata):
            entry = placed.pop((cid, i), None)
            assert entry is not None, f"{cid}'s erratum {i} ({erratum.grade}) has no entry in errata.toml: no location, quote or replacement"
            assert entry.grade == erratum.grade, f"{entry.id}: the rule grades basis {entry.basis!r} {entry.grade}, the registry says {erratum.grade}"
    assert not placed, f"entries place errata the registry does not have: {sorted(placed)}"


@pytest.mark.parametrize("key", ["nl", "vi", "nl_new", "vi_new"])
def test_an_entry_without_a_quote_or_replacement_is_refused(key):
    raw = _raw()
    del raw["entry"][0]["occurrence"][0][key]
    with pytest.raises(locate.LocateError, match=f"no '{key}'"):
        locate.entries(raw)


def test_an_entry_without_a_place_or_with_an_unknown_basis_is_refused():
    raw = _raw()
    bare = copy.deepcopy(raw)
    bare["entry"][0]["occurrence"] = []
    with pytest.raises(locate.LocateError, match="no occurrence"):
        locate.entries(bare)
    raw["entry"][0]["basis"] = "looks wrong"
    with pytest.raises(locate.LocateError, match="no grade rule"):
        locate.entries(raw)


def test_a_replacement_equal_to_its_quote_must_say_it_keeps_the_text():
    raw = _raw()
    occ = raw["entry"][0]["occurrence"][0]
    occ["nl_new"] = occ["nl"]
    with pytest.raises(locate.LocateError, match="mark keep"):
        locate.entries(raw)


ROUND_WORD_CASES = [
    (6, 6.51, True, None, "imprecision"),  # zesvoudig: 6.51 is 7 to a whole fold
    (20, 20.85, True, None, "imprecision"),  # twintigvoudig
    (6000, 6298, False, None, None),  # zesduizend: to the thousand, 6,298 is 6,000
    (900, 856, False, 896, "inconsistency"),  # in its band, but more than the printed whole
    (900, 856, False, None, None),
    (10, None, False, None, None),  # bijna tien jaar: nothing measures it
    (7, 6.5, True, None, None),  # exactly half a fold rounds away from zero: 6.5 is 7
    (6, 6.5, True, None, "imprecision"),
    (6000, 5500, False, None, None),  # half a thousand: 5,500 is 6,000
    (6000, 6500, False, None, "imprecision"),  # and 6,500 is 7,000
]


@needs_seeds
@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_every_quote_is_found_exactly_once_in_each_translation(seed):
    text = seed.read_text(encoding="utf-8")
    lang = locate.language_of(text)
    found = locate.locations(text, lang)
    assert set(found) == {e.id for e in locate.entries()}
    assert all(lines and all(n >= 1 for n in lines) for lines in found.values())


@needs_seeds
@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_the_patch_applies_once_and_the_patched_chapter_still_parses(seed, tmp_path):
    tool = shutil.which("patch")
    if tool is None:
        pytest.skip("no patch program on this machine")
    text = seed.read_text(encoding="utf-8")
    lang = locate.language_of(text)
    work = tmp_path / seed.name
    shutil.copy(seed, work)
    diff = tmp_path / "errata.patch"
    diff.write_text(locate.unified_diff(text, seed.name), encoding="utf-8")
    done = subprocess.run([tool, "-p1", "--forward", "-i", str(diff)], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    after = work.read_text(encoding="utf-8")
    assert after == locate.patched(text, lang)
    # read from the patched text, not from the writer: each replacement stands once more than before it was applied
    added = Counter(o.replacements[lang] for e in locate.entries() for o in e.occurrences if o.changes(lang))
    assert {new: after.count(new) - text.count(new) for new in added} == dict(added)
    assert after.count("\n") == text.count("\n")
    # the patched chapter still parses: it is the same translation, and each replacement stands in it exactly once
    assert locate.language_of(after) == lang
    for e in locate.entries():
        for o in e.occurrences:
            assert locate.line_of(after, o.replacements[lang]) >= 1
    # applied once: the changed quotes are gone, so a second application is refused, not guessed
    with pytest.raises(locate.LocateError, match="not found"):
        locate.patched(after, lang)
    assert textchecks.formula_findings(after) == []



@needs_seeds
@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_the_text_checks_find_what_the_entries_list(seed):
    text = seed.read_text(encoding="utf-8")
    lang = locate.language_of(text)
    entries = {e.id: e for e in locate.entries()}
    for w in textchecks.round_words(text, lang):
        if w.grade:
            assert w.id in entries and entries[w.id].grade == w.grade, (w.id, w.grade)
        else:
            assert w.id not in entries, f"{w.id} is {w.verdict}, yet listed as a finding"
    for u in textchecks.unit_findings(text, lang, entries["units"]):
        assert u["readings"] == (["decimal"] if u["keep"] else ["binary"]), u
    lines = [f["line"] for f in textchecks.formula_findings(text)]
    assert lines == locate.locations(text, lang)["formula-locale"]


@needs_seeds
@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_the_errata_command_writes_a_patch_that_git_apply_takes(seed, tmp_path, capsys):
    from cheapinfer.cli import main

    work = tmp_path / seed.name
    shutil.copy(seed, work)
    assert main(["errata", "--chapter", str(work), "-o", str(tmp_path / "errata.patch")]) == 0
    assert "errata.patch" in capsys.readouterr().out
    git = shutil.which("git")
    if git is None:
        pytest.skip("no git on this machine")
    done = subprocess.run([git, "apply", "errata.patch"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = seed.read_text(encoding="utf-8")
    assert work.read_text(encoding="utf-8") == locate.patched(text, locate.language_of(text))
    # applied: the command refuses the patched chapter (its quotes are gone), and writes nothing
    assert main(["errata", "--chapter", str(work), "-o", str(tmp_path / "again.patch")]) == 1
    assert "refused, no patch written" in capsys.readouterr().err and not (tmp_path / "again.patch").exists()


def test_the_errata_command_refuses_a_doubled_quote_and_bad_files_in_one_line(tmp_path, capsys):
    from cheapinfer.cli import main

    quotes = "\n".join(o.quotes["nl"] for e in locate.entries() for o in e.occurrences)
    doubled = tmp_path / "doubled.txt"
    doubled.write_text(quotes + "\n" + "de cache is telkens 768 MB\n", encoding="utf-8")
    assert main(["errata", "--chapter", str(doubled), "-o", str(tmp_path / "x.patch")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "found more than once (lines 1, " in err and "768 MB" in err
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\xff\xfe\x00")
    for path in (tmp_path / "absent.txt", binary, tmp_path):
        assert main(["errata", "--chapter", str(path), "-o", str(tmp_path / "x.patch")]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "x.patch").exists()


# ----------------------------------------------------------------------------------------------
# the text checks, each also run under the faults of cheapinfer.faults.text (it must turn red there)
# ----------------------------------------------------------------------------------------------

def _units_check():
    assert textchecks.readings("768 MB", 65536 * 12288) == {"binary"}
    assert textchecks.readings("67 MB", 4096 * 4096 * 4) == {"decimal"}
    assert textchecks.readings("12 KB", 12288) == {"binary", "decimal"}
    assert textchecks.readings("13,0 GB", 14e9) == {"binary"}


def _formula_check():
    prose = "Een zin met 65.536 tokens en 4,25 bits per weight, lang genoeg om als proza te tellen, en nog wat woorden erbij.\n"
    english = "A sentence with 65,536 tokens and 4.25 bits per weight, long enough to count as prose, and a few more words.\n"
    assert (textchecks.prose_locale(prose), textchecks.prose_locale(english)) == ("comma", "point")
    assert textchecks.formula_findings(prose + "$4 + 16/128 = 4{,}125$\n$2 \\times 6 = 12$\n") == []
    assert [f["line"] for f in textchecks.formula_findings(prose + "$4 + 16/128 = 4.125$\n")] == [2]
    assert [f["line"] for f in textchecks.formula_findings(english + "$4 + 16/128 = 4{,}125$\n")] == [2]


def _round_word_check():
    for stated, value, fold, whole, expected in ROUND_WORD_CASES:
        assert grades.round_word_grade(stated, value, fold=fold, whole=whole) == expected, (stated, value)


def _entries(*pairs):
    """Entries of one occurrence each, the same words in both languages."""
    return locate.entries({"entry": [{"id": f"e{i}", "title": "t", "basis": "wrong", "finding": "f",
                                      "occurrence": [{"nl": q, "vi": q, "nl_new": new, "vi_new": new}]} for i, (q, new) in enumerate(pairs)]})


def _locate_check():
    text = "een\n768 MB hier\nen 768 MB daar\n"
    with pytest.raises(locate.LocateError, match=r"lines 2, 3"):
        locate.line_of(text, "768 MB")
    with pytest.raises(locate.LocateError, match="not found"):
        locate.line_of(text, "84 KB")
    assert locate.line_of(text, "768 MB daar") == 3
    with pytest.raises(locate.LocateError, match=r"e0, occurrence 1 \(nl\): found more than once \(lines 2, 3"):
        locate.patched(text, "nl", _entries(("768 MB", "768 MiB")))


def _patch_check():
    """Each replacement applies exactly once, at its place, even where another's replacement prints its quote."""
    text = "de cache is 768 MB\nen 805 MB daar\n"
    found = _entries(("is 768 MB", "is 768 MiB, niet 805 MB"), ("805 MB", "805 MB (decimaal)"))
    after = locate.patched(text, "nl", found)
    assert after == "de cache is 768 MiB, niet 805 MB\nen 805 MB (decimaal) daar\n"
    for e in found:
        new = e.occurrences[0].replacements["nl"]
        assert after.count(new) == text.count(new) + 1, new


TEXT_CHECKS = {UNITS: _units_check, FORMULAS: _formula_check, ROUND_WORDS: _round_word_check, LOCATE: _locate_check, PATCH: _patch_check}


@pytest.mark.parametrize("check", list(TEXT_CHECKS))
def test_the_text_check(check):
    TEXT_CHECKS[check]()


@pytest.mark.parametrize("name", [n for n, f in TEXT_FAULTS.items() if f.check in TEXT_CHECKS])
def test_each_text_fault_turns_its_check_red(name):
    """The checks above are not true by construction: under each fault of cheapinfer.faults.text its check fails."""
    fault = TEXT_FAULTS[name]
    with fault.activate(), pytest.raises((AssertionError, pytest.fail.Exception)):
        TEXT_CHECKS[fault.check]()


def test_every_text_check_has_a_fault():
    """The listings' check and its faults: tests/test_listings.py."""
    assert set(TEXT_CHECKS) | {LISTINGS} == set(CHECKS) == {f.check for f in TEXT_FAULTS.values()}
