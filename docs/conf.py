"""Sphinx configuration of the suite's docs (``sphinx-build -W --keep-going -n docs docs/_build``)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

project = "cheapinfer"
author = "the cheapinfer developers"
copyright = "the cheapinfer developers"

extensions = ["myst_parser", "sphinxarg.ext", "counts"]
myst_enable_extensions = ["substitution", "colon_fence"]
myst_heading_anchors = 3
myst_substitutions: dict[str, str] = {}  # filled by _ext/counts.py from the registry, the claim tests and the catalogue
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "cheapinfer"
