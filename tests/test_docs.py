"""The front doors: the command-line reference is the parsers themselves, the docs build strictly, the README
stays short and runs CI's command, and no count in the docs is typed by hand."""

from __future__ import annotations

import argparse

import pytest

from cheapinfer import __main__ as cli


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
