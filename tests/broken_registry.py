"""A pytest plugin (``-p broken_registry``, with ``tests/`` on ``PYTHONPATH``): the registry as a maintainer might break
it, chosen by ``BROKEN_REGISTRY``: ``duplicate`` (a claim declared twice: not valid TOML), ``bad-timing`` (a timing
that is neither clocked nor counted) or ``nan-tolerance`` (a relative check whose tolerance is NaN). Loaded before the
suite's own plugin configures, so its one-line refusal is what a pytest run meets."""

from __future__ import annotations

import os
import re
from importlib import resources

from cheapinfer.harness import registry

TEXT = resources.files("cheapinfer").joinpath("registry.toml").read_text(encoding="utf-8")


def _broken() -> str:
    case = os.environ["BROKEN_REGISTRY"]
    if case == "duplicate":
        first = re.search(r"^\[([A-Z0-9.-]+)\]\n", TEXT, re.M)
        return TEXT + f"\n[{first.group(1)}]\nsection = \"kv_cache\"\n"
    if case == "bad-timing":
        return TEXT.replace('timing = "counted"', 'timing = "sometimes"', 1)
    if case == "nan-tolerance":
        return re.sub(r"form = \"rel\", tol = [0-9.]+", 'form = "rel", tol = nan', TEXT, count=1)
    raise ValueError(f"BROKEN_REGISTRY={case!r}: duplicate, bad-timing or nan-tolerance")


registry.load = lambda: registry.parse(_broken())
