"""Markdown building blocks of the reports: verdict badges, values, cells and tables, the summary table
and a machine's label (used by the errata report, the matrix, ``compare``, ``merge`` and the fault runner).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..runtime.memory import gib
from . import registry
from .numbers import value_text
from .schema import CheckResult, ClaimEntry, RunRecord
from .vocabulary import DEVIATES, ERRATUM, INCONCLUSIVE, NO_TEST, NOT_RUN, REPRODUCED, SHAPE_HOLDS, VERDICTS

#: A verdict in a report's words; a stand-in's or twin's verdict says so first, so that nobody reads it as the book's digits confirmed.
BADGE = {REPRODUCED: "reproduced", SHAPE_HOLDS: "stand-in: shape holds, book digits not run", ERRATUM: "erratum (confirmed)", INCONCLUSIVE: "inconclusive",
          DEVIATES: "**DEVIATES**", NOT_RUN: "not run", NO_TEST: "no test yet"}


#: The summary table's column for a verdict, where the verdict's own name could be misread.
HEADER = {SHAPE_HOLDS: "stand-in: shape holds"}


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(value_text(c)) for c in row) + " |" for row in rows]
    return out


#: The keys records written before the sections had one name carry (run.json's ``section`` and ``sections``): read
#: through :func:`section_key`, so that an old record merges with a new one section by section.
OLD_SECTIONS = {"KV": "kv_cache", "BAT": "batching", "Q": "quantization", "OUT": "outliers", "EVAL": "evaluation",
                "SPEC": "speculative", "DIST": "distillation", "BUD": "budget", "ASIDE": "asides"}


def section_key(key: str) -> str:
    """A record's section key as the registry names it now (an old record's ``KV`` is ``kv_cache``); others unchanged."""
    return OLD_SECTIONS.get(key, key)


def section_titles(record: RunRecord) -> dict[str, str]:
    """Section key -> title, from the record (older records without it: the registry's titles, under old keys too)."""
    return record.get("sections") or {**registry.SECTIONS, **{old: registry.SECTIONS[new] for old, new in OLD_SECTIONS.items()}}


def summary_table(record: RunRecord) -> list[str]:
    counts: dict[str, Counter] = {}
    for c in record["claims"].values():
        counts.setdefault(c["section"], Counter())[c["verdict"]] += 1
    rows = []
    for key, title in section_titles(record).items():
        if key in counts:
            rows.append([title] + [counts[key].get(v, 0) for v in VERDICTS] + [sum(counts[key].values())])
    total = Counter(c["verdict"] for c in record["claims"].values())
    rows.append(["**all**"] + [total.get(v, 0) for v in VERDICTS] + [sum(total.values())])
    return markdown_table(["section", *(HEADER.get(v, v) for v in VERDICTS), "claims"], rows)


def machine_label(env: dict[str, Any]) -> str:
    """A run's machine in one line: GPU (or CPU) name and the library versions that decide verdicts."""
    hw = env.get("gpu") if env.get("gpu") not in (None, "", "none") else env.get("cpu", "unknown CPU")
    libs = ", ".join(f"{k} {env[k]}" for k in ("torch", "transformers", "bitsandbytes") if k in env)
    return f"{hw} ({libs})" if libs else str(hw)


def with_unit(value: Any, unit: str | None) -> str:
    if not unit:
        return value_text(value)
    return f"{value_text(value)}{unit}" if unit in ("x", "%") else f"{value_text(value)} {unit}"


def code_span(text: Any) -> str:
    """Inline code that survives backticks inside ``text``."""
    text = str(text)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def printed_text(claim: ClaimEntry, key: str) -> str:
    src = claim.get("source", {}).get(key)
    if not src:
        return ""
    if src["kind"] == "derived":
        return f"derived: {src['text']}"
    return f'{"printed" if src["kind"] == "printed" else "read from"} "{src["text"]}"'


def noise_words(chk: CheckResult) -> str:
    """How a noisy check's standard error was estimated, in words (a record without the kind: over the rounds)."""
    return registry.NOISE_WORDS.get(chk.get("noise") or "rounds", "standard error")


def check_mark(chk: CheckResult) -> str:
    """What the compact table adds to a check's tolerance: reported only (and whether it misses), a failure, or a check
    the measurement could not decide (an inconclusive verdict's: never read as a failure)."""
    if chk.get("decided") is False:
        return " **undecided**" if chk["asserted"] else " (reported, undecided)"
    if not chk["asserted"]:
        return " (reported)" if chk["passed"] else " (reported, misses)"
    return "" if chk["passed"] else " **fails**"


def memory_lines(record: RunRecord) -> list[str]:
    """The run's peak resident memory in one line, the claim that set it and the claims that raised it most
    (``run.memory``, :func:`cheapinfer.harness.record.run_peak`); nothing for a record without it."""
    mem = record.get("run", {}).get("memory") or {}
    if not mem.get("set_by"):
        return []
    by = mem["set_by"]
    line = f"peak resident memory: {gib(mem['peak_rss_bytes'])} (the process's maximum resident set), reached in {by['claim']} ({by['profile']})"
    if mem["peak_rss_bytes"] > by["peak_rss_bytes"]:
        line += f" at {gib(by['peak_rss_bytes'])}, and after the last claim"
    rises = [f"{r['claim']} ({r['profile']}) +{gib(r['rise_bytes'])}" for r in mem.get("rises", []) if r["rise_bytes"] >= 0.05 * 2**30]  # shown to 0.1 GiB
    return [line] + (["raised most by: " + ", ".join(rises)] if rises else [])
