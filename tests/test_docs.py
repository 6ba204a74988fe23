"""The front doors: the command-line reference is the parsers themselves, the docs build strictly, the README
stays short and runs CI's command, and no count in the docs is typed by hand."""

from __future__ import annotations

import argparse

import pytest

from cheapinfer import cli


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings} | {a.dest for a in p._actions if not a.option_strings}


@pytest.mark.parametrize("name", cli.COMMANDS)
def test_command_parser_is_the_parser_the_command_parses_with(name, capsys):
    """The reference is generated from the parser a command builds: its --help text is that parser's help."""
    p = cli.command_parser(name)
    assert p.prog == f"cheapinfer {name}"
    try:
        code = cli.main([name, "--help"])  # budget hands --help's status back; the others exit through argparse
    except SystemExit as exit_:
        code = exit_.code
    assert code == 0
    assert capsys.readouterr().out == p.format_help()


def test_the_top_parser_has_every_command_main_dispatches():
    top = cli.parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    assert tuple(sub.choices) == cli.COMMANDS
    for name, p in sub.choices.items():
        assert _options(p) - {"help"} == _options(cli.command_parser(name)) - {"help"}
    assert cli.main(["no-such-command"]) == 2  # main still dispatches on its own


def test_command_parser_refuses_an_unknown_command():
    with pytest.raises(ValueError, match="unknown command"):
        cli.command_parser("verfy")


# --- the docs site -----------------------------------------------------------------------------------------

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
sys.path.insert(0, str(DOCS / "_ext"))
import counts  # noqa: E402  (docs/_ext/counts.py: the counts the pages state, computed)


def test_the_docs_build_strictly(tmp_path):
    """``sphinx-build -W --keep-going -n``: a warning, a broken cross-reference or a stale page fails the suite."""
    pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]')")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html", str(DOCS), str(tmp_path / "html")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    cli_page = (tmp_path / "html" / "cli.html").read_text(encoding="utf-8")
    for name in cli.COMMANDS:  # the reference holds every command's every option, from its own parser
        for option in _options(cli.command_parser(name)) - {"help"}:
            if option.startswith("-"):
                assert option in cli_page, f"docs/cli.md: {name} {option} missing from the generated reference"
    assert not re.search(r"\{\{\s*\w+\s*\}\}", "".join(p.read_text(encoding="utf-8") for p in (tmp_path / "html").glob("*.html"))), \
        "a count substitution was left unresolved"


def test_the_readme_is_a_front_door():
    """At most 150 lines; the two commands come first, the verdicts and the docs link within the first screen or so."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines (at most 150; the reference belongs in docs/)"
    text = "\n".join(lines)
    blocks = re.findall(r"```sh\n(.*?)\n```", text, re.S)
    assert blocks[0].strip() == "pip install -e '.[test]' && python -m cheapinfer verify"
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert blocks[1].strip() == ci[-1], "the README's test command is not the command CI runs"
    first_screen = "\n".join(lines[:50])
    assert blocks[1] in first_screen and "## Verdicts" in first_screen and "| deviates |" in first_screen, \
        "the two commands and the verdicts must be on the first screen (50 lines)"
    assert "](docs/index.md)" in "\n".join(lines[:10]), "the first lines name no link into the docs"


def _relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", ["README.md", "CHANGELOG.md"])
def test_every_link_of_the_root_pages_resolves(page):
    links = _relative_links(ROOT / page)
    missing = [t for t in links if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"{page} links to what does not exist: {missing}"


def test_every_path_the_docs_name_exists():
    """A path of the repository named in a page (`cheapinfer/...`, `tests/...`) exists: a moved module fails here."""
    named = {m for p in [*DOCS.glob("*.md"), README] for m in re.findall(r"`((?:cheapinfer|tests|claims|fixtures|docs|\.github|\.ci)/[\w./-]*)`", p.read_text(encoding="utf-8"))}
    assert named
    missing = sorted(n for n in named if "<" not in n and not (ROOT / n).exists())
    assert not missing, f"the docs name paths that do not exist: {missing}"


def _exists(dotted: str) -> bool:
    """Whether ``cheapinfer.a.b`` is a module, or an attribute of one defined there (not imported from where it moved)."""
    import importlib

    module, _, attr = dotted.rpartition(".")
    for name, attribute in ((module, attr), (dotted, None)):
        try:
            imported = importlib.import_module(name)
        except ImportError:
            continue
        if attribute is None:
            return True
        if hasattr(imported, attribute):
            return getattr(getattr(imported, attribute), "__module__", name) == name
    return False


def test_every_dotted_name_the_docs_give_exists():
    """`cheapinfer.x.y.name` in a page names a module or attribute that exists (three names once pointed at moved functions)."""
    named = {m for p in [*DOCS.glob("*.md"), README] for m in re.findall(r"`(cheapinfer(?:\.\w+)+)`", p.read_text(encoding="utf-8"))}
    named = {n for n in named if not n.endswith(".json")}  # cheapinfer.json: a file the conversion writes
    assert named
    stale = sorted(n for n in named if not _exists(n))
    assert not stale, f"the docs name what does not exist: {stale}"
    assert not _exists("cheapinfer.faults.runner.clocked_claims") and not _exists("cheapinfer.runtime.device.device_dependent")


#: A count stated in prose: "61 claims", "13 clocked claims", "94 faults", "43 of the 61 claims".
_COUNT = re.compile(r"\b(\d[\d,]*) (?:of the \d[\d,]* )?(?:clocked |device-dependent |kernel-dependent )?(claims|faults)\b")


def test_no_count_in_the_docs_is_typed_by_hand():
    """The docs state counts through the substitutions of docs/_ext/counts.py, never as typed numbers; the README,
    which GitHub renders raw, may state only counts equal to the computed ones."""
    typed = [(p.name, m.group(0)) for p in DOCS.glob("*.md") for m in _COUNT.finditer(re.sub(r"```.*?```", "", p.read_text(encoding="utf-8"), flags=re.S))]
    assert not typed, f"counts typed by hand in docs/ (use {{{{ claims }}}}, {{{{ faults }}}}, ...): {typed}"
    computed = counts.counts()
    allowed = {computed[k] for k in ("claims", "gpu_claims", "arithmetic_claims", "clocked_claims", "isa_claims", "faults")}
    wrong = [m.group(0) for m in _COUNT.finditer(README.read_text(encoding="utf-8")) if int(m.group(1).replace(",", "")) not in allowed]
    assert not wrong, f"README.md states counts the code does not have: {wrong}"


def test_the_count_check_would_catch_a_typed_count():
    assert _COUNT.search("the registry's 61 claims") and _COUNT.search("(43 of the 61 claims;") and _COUNT.search("holds 94 faults")
    assert not _COUNT.search("{{ claims }} claims")


def test_the_counts_are_the_codes():
    from cheapinfer.harness import registry

    c = counts.counts()
    assert c["claims"] == len(registry.load()) and c["clocked_claims"] == len(registry.clocked_claims())
    assert c["gpu_claims"] + c["arithmetic_claims"] == c["claims"]


# --- the workflows -----------------------------------------------------------------------------------------

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def test_the_workflows_pass_actionlint():
    exe = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("actionlint is not installed (pip install -e '.[docs]')")
    assert WORKFLOWS
    run = subprocess.run([exe, *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_ci_workflow_runs_the_readmes_test_command():
    """ci.yml runs .ci/run, whose last line is the README's test command (checked above)."""
    ci = (ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s*run: \./\.ci/run\s*$", ci, re.M)
    assert "pull_request" in ci and "push" in ci


def test_library_updates_runs_oldest_pinned_latest_then_compare_and_merge():
    text = (ROOT / ".github" / "workflows" / "library-updates.yml").read_text(encoding="utf-8")
    assert "schedule:" in text and "workflow_dispatch:" in text
    assert re.search(r"env: \[oldest, pinned, latest\]", text)
    assert text.index("cheapinfer compare") < text.index("cheapinfer merge")
    assert "--before-reruns" in text and "--after-reruns" in text
    tox = (ROOT / "tox.ini").read_text(encoding="utf-8")
    for env in ("oldest", "latest"):
        assert f"[testenv:{env}]" in tox
    assert "env_list = pinned" in tox


def test_the_records_page_names_the_run_records_keys():
    """docs/records.md's table of run.json keys is the schema's: a key added or removed there fails here."""
    from typing import get_type_hints

    from cheapinfer.harness import schema

    page = (DOCS / "records.md").read_text(encoding="utf-8")
    table = page[page.index("## The run.json schema"):page.index("## compare")]
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    declared = set(get_type_hints(schema.RunRecord))
    assert documented == declared
