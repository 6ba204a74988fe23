"""cheapinfer/errata.toml: every graded finding located in both translations, graded by the one rule, and applied as a patch."""

import copy
import shutil
import subprocess
import tomllib

import pytest

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


def test_a_quote_found_twice_or_not_at_all_is_refused_with_its_lines():
    text = "een\n768 MB hier\nen 768 MB daar\n"
    with pytest.raises(locate.LocateError, match=r"lines 2, 3"):
        locate.line_of(text, "768 MB")
    with pytest.raises(locate.LocateError, match="not found"):
        locate.line_of(text, "84 KB")
    assert locate.line_of(text, "768 MB daar") == 3


@pytest.mark.parametrize("stated, value, fold, whole, expected", [
    (6, 6.51, True, None, "imprecision"),  # zesvoudig: 6.51 is 7 to a whole fold
    (20, 20.85, True, None, "imprecision"),  # twintigvoudig
    (6000, 6298, False, None, None),  # zesduizend: to the thousand, 6,298 is 6,000
    (900, 856, False, 896, "inconsistency"),  # in its band, but more than the printed whole
    (900, 856, False, None, None),
    (10, None, False, None, None),  # bijna tien jaar: nothing measures it
])
def test_the_round_word_rule(stated, value, fold, whole, expected):
    assert grades.round_word_grade(stated, value, fold=fold, whole=whole) == expected


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


def test_the_byte_readings():
    assert textchecks.readings("768 MB", 65536 * 12288) == {"binary"}
    assert textchecks.readings("67 MB", 4096 * 4096 * 4) == {"decimal"}
    assert textchecks.readings("12 KB", 12288) == {"binary", "decimal"}
    assert textchecks.readings("13,0 GB", 14e9) == {"binary"}


def test_a_formula_in_the_prose_locale_is_no_finding():
    prose = "Een zin met 65.536 tokens en 4,25 bits per weight, lang genoeg om als proza te tellen, en nog wat woorden erbij.\n"
    assert textchecks.formula_findings(prose + "$4 + 16/128 = 4{,}125$\n$2 \\times 6 = 12$\n") == []
    assert [f["line"] for f in textchecks.formula_findings(prose + "$4 + 16/128 = 4.125$\n")] == [2]


@needs_seeds
@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_the_errata_command_writes_a_patch_that_git_apply_takes(seed, tmp_path, capsys):
    from cheapinfer.__main__ import main

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
    from cheapinfer.__main__ import main

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
