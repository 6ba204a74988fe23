"""The chapter checked against itself: cheapinfer/explanations.toml, every sentence that explains a result and every
statistical word, with the registry checks that judge it and the verdict they give, read and checked.

Pure functions of the data file, the registry's claims, the errata data and a chapter's text; no run, no model.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from . import locate

DATA = Path(__file__).resolve().parent.parent / "explanations.toml"
KINDS = ("explanation", "statistical")
VERDICTS = ("holds", "contradicted", "not measured", "not testable")


@dataclass(frozen=True)
class Sentence:
    id: str
    kind: str
    quotes: dict[str, str]  # language -> the exact printed words
    checks: tuple[tuple[str, str], ...]  # (claim, q)
    verdict: str
    why: str = ""
    assumption: str = ""
    errata: str = ""  # the errata.toml entry that places a contradiction

    @property
    def claims(self) -> list[str]:
        return sorted({c for c, _ in self.checks})


def sentences(raw: dict[str, Any] | None = None) -> list[Sentence]:
    """The inventory, read; ValueError with one line on an entry that lacks what it must give."""
    if raw is None:
        raw = tomllib.loads(DATA.read_text(encoding="utf-8"))
    out, seen = [], set()
    for s in raw.get("sentence", []):
        sid = s.get("id", "?")
        if sid in seen:
            raise ValueError(f"{sid}: two sentences with this id")
        seen.add(sid)
        if s.get("kind") not in KINDS:
            raise ValueError(f"{sid}: kind must be one of {KINDS}")
        if s.get("verdict") not in VERDICTS or (s["verdict"] == "not testable" and s["kind"] != "statistical"):
            raise ValueError(f"{sid}: verdict must be one of {VERDICTS} ('not testable' for a statistical word only)")
        quotes = {lang: s.get(lang, "") for lang in locate.LANGUAGES}
        if not all(q.strip() for q in quotes.values()):
            raise ValueError(f"{sid}: needs the printed words in each of {locate.LANGUAGES}")
        checks = []
        for c in s.get("checks", []):
            claim, sep, q = c.rpartition(":")
            if not sep or not claim or not q:
                raise ValueError(f"{sid}: check {c!r} is not CLAIM:q")
            checks.append((claim, q))
        out.append(Sentence(sid, s["kind"], quotes, tuple(checks), s["verdict"], s.get("why", ""), s.get("assumption", ""), s.get("errata", "")))
    return out


def problems(found: Iterable[Sentence], claim_checks: Mapping[str, set[str]], errata_ids: set[str]) -> list[str]:
    """Each way the inventory fails to judge its sentences, one line each (empty when it is complete).

    ``claim_checks``: claim id -> the q of its checks (the registry); ``errata_ids``: the ids of errata.toml's entries.
    """
    out = []
    for s in found:
        for claim, q in s.checks:
            if q not in claim_checks.get(claim, set()):
                out.append(f"{s.id}: {claim}:{q} is not a check of the registry")
        if s.verdict in ("holds", "contradicted") and not s.checks:
            out.append(f"{s.id}: verdict {s.verdict!r} names no check that gives it")
        if s.verdict in ("not measured", "not testable") and not s.why:
            out.append(f"{s.id}: verdict {s.verdict!r} without a why")
        if s.verdict == "contradicted" and s.errata not in errata_ids:
            out.append(f"{s.id}: contradicted, but its erratum {s.errata!r} is not an entry of errata.toml")
        if s.kind == "statistical" and not s.assumption:
            out.append(f"{s.id}: a statistical word without its test's assumption named")
    return out


def located(found: Iterable[Sentence], text: str, lang: str) -> dict[str, int]:
    """Sentence id -> its line in ``text`` (LocateError naming the sentence for a quote not found exactly once)."""
    out = {}
    for s in found:
        try:
            out[s.id] = locate.line_of(text, s.quotes[lang])
        except locate.LocateError as exc:
            raise locate.LocateError(f"{s.id} ({lang}): {exc}") from None
    return out
