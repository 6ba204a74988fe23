"""The one reader of the claim tests' source (``claims/test_*.py``): which claims have a test, which read
a clock, which are marked slow. Read as text and syntax trees, never imported (no torch)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Any

from .. import CHECKOUT

_CLAIM_MARK = re.compile(r"""mark\.claim\(\s*["']([A-Z][A-Z0-9.\-]+)["']""")


def tested_ids(claims_dir: Path) -> dict[str, list[str]]:
    """Claim IDs that have a test under ``claims_dir``, with the files naming them."""
    found: dict[str, list[str]] = {}
    for path in sorted(Path(claims_dir).glob("test_*.py")):
        for claim_id in _CLAIM_MARK.findall(path.read_text(encoding="utf-8")):
            found.setdefault(claim_id, []).append(path.name)
    return found


#: What marks a claim test as reading a clock: a timing fixture it asks for, or a clock it calls
#: (``timing.cpu_threads`` only sets a thread count, and reads no clock).
_CLOCK_FIXTURES = {"timed", "step_times", "benchmark"}
_CLOCK_CALLS = ("perf_counter", "time.time(", "monotonic", "interleaved(", "Samples(")


def _claim_tests(claims_dir: Path | None = None) -> list[tuple[list[str], Any, str]]:
    """Each claim test in ``claims/test_*.py``: (its claim IDs, its function node, its source).

    Parsed once per version of the files (their paths and modification times): the sweep asks for the
    clocked and the slow claims of every fault, and a parse of all modules takes a second."""
    paths = sorted(Path(claims_dir or CHECKOUT / "claims").glob("test_*.py"))
    return _parsed_claim_tests(tuple((str(p), p.stat().st_mtime_ns) for p in paths))


@functools.lru_cache(maxsize=8)
def _parsed_claim_tests(files: tuple[tuple[str, int], ...]) -> list[tuple[list[str], Any, str]]:
    out = []
    for path, _ in files:
        source = Path(path).read_text(encoding="utf-8")
        lines = source.splitlines(keepends=True)
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef):
                continue
            ids = [d.args[0].value for d in node.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                   and d.func.attr == "claim" and d.args and isinstance(d.args[0], ast.Constant)]
            if ids:  # the function's lines (ast.get_source_segment re-splits the whole module on every call)
                out.append((ids, node, "".join(lines[node.lineno - 1 : node.end_lineno])))
    return out


def clocked_claims(claims_dir: Path | None = None) -> set[str]:
    """Claims whose test reads a clock: their verdict can depend on the machine's load.

    Found in the tests' source (``claims/test_*.py``): a test marked ``@pytest.mark.claim(ID)`` that asks
    for a timing fixture or calls a clock. These claims are run on a quiet machine (:func:`run`); the
    others run two at a time, since what they measure is a count, a token or a byte, not a time.
    """
    return {cid for ids, node, body in _claim_tests(claims_dir)
            if {a.arg for a in node.args.args} & _CLOCK_FIXTURES or any(c in body for c in _CLOCK_CALLS) for cid in ids}


def slow_claims(claims_dir: Path | None = None) -> set[str]:
    """Claims whose test is marked ``@pytest.mark.slow`` (more than a minute on a 2-core CPU)."""
    return {cid for ids, node, _ in _claim_tests(claims_dir)
            if any(isinstance(d, ast.Attribute) and d.attr == "slow" for d in node.decorator_list) for cid in ids}
