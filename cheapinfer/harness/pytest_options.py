"""The suite's pytest options (the ``cheapinfer`` group), added by its plugin (``fixtures/options.py``).

The plugin is the ``pytest11`` entry point ``cheapinfer`` (``pyproject.toml``), loaded before pytest reads the
command line to find the rootdir and the checkout's ``conftest.py``: ``pytest -m gpu --report-dir DIR`` parses DIR
as the option's value, wherever DIR is. An environment installed while this module was the entry point registers
it under that name: it then adds the options first, and :func:`ensure` adds none twice.

Nothing heavy is imported here (no torch).
"""

from __future__ import annotations

import pytest

#: ``--twin-dtype`` choices: the keys of ``cheapinfer.runtime.models.DTYPES`` (a self-test checks that they agree).
TWIN_DTYPES = ("fp32", "fp16", "bf16")
#: Options naming a path or a name: an empty value is a usage error, never the default.
NONEMPTY = ("--report-dir", "--corpus", "--book-model", "--fault")


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("cheapinfer", "chapter claims")
    if any("--book-model" in option.names() for option in g.options):  # added already (the plugin loaded first with -p)
        return
    g.addoption("--book-model", metavar="PATH", default=None, help="local copy of Qwen2.5-0.5B-Instruct (or base); default: the Hugging Face cache, offline")
    g.addoption("--book-variant", choices=("instruct", "base"), default="instruct", help="which book model to look up in the Hugging Face cache (default: instruct)")
    g.addoption("--device", default="auto", help="auto | cpu | cuda[:N] (default auto: CUDA when present)")
    g.addoption("--twin-dtype", choices=TWIN_DTYPES, default=None, help="dtype of the twin profile for timing claims (default: fp16 on CUDA, as in the book; fp32 on a CPU, the only dtype a CPU takes: its clocked bounds are derived for fp32)")
    g.addoption("--corpus", metavar="PATH", default=None, help="plain-text English prose for perplexity (default: the pinned public-domain corpus)")
    g.addoption("--report-dir", metavar="DIR", default=None, help="where run.json and errata.md are written (default: reports/ of the checkout)")
    g.addoption("--perturb", metavar="ID", action="append", default=[], help="move this claim's book values beyond tolerance, to see the comparator turn it red (repeatable)")
    g.addoption("--fault", metavar="NAME", default=None, help="run with this fault of the measured system injected (python -m cheapinfer faults --list); its claims should deviate")
    g.addoption("--claims", metavar="IDS", default=None, help="run only the tests of these claims (comma-separated registry IDs)")
    g.addoption("--stop-on-red", action="store_true", default=False,
                help="stop after the first claim test that deviates (the fault runner's sweep: one red claim catches the fault)")


def ensure(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Add the options unless they are there already (this module registered as a plugin of its own, in an environment
    installed while it was the entry point, added them first)."""
    pytest_addoption(parser)


def empty_option(config: pytest.Config) -> str | None:
    """The first of :data:`NONEMPTY` given with an empty value, if any."""
    for name in NONEMPTY:
        value = config.getoption(name)
        if value is not None and not value.strip():
            return name
    return None
