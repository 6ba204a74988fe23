"""The chapter checked against itself: cheapinfer/explanations.toml, every sentence that explains a result, every
statistical word and every side effect a listing's text promises, with the registry checks that judge it and the
verdict they give, read and checked; and the chapter's listings, each with the claim that runs it and whether it
runs the printed statements verbatim (:func:`code_listings` finds them in the text, :func:`same_statements` compares).

Pure functions of the data file, the registry's claims, the errata data and a chapter's text; no run, no model.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from . import locate

DATA = Path(__file__).resolve().parent.parent / "explanations.toml"
ROOT = DATA.parent.parent
KINDS = ("explanation", "statistical", "listing")  # listing: a side effect (memory, warnings, state kept between steps) a listing's text promises
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
    listing: str = ""  # kind "listing": the id of the [[listing]] whose side effect it promises

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
        if (s["kind"] == "listing") != bool(s.get("listing")):
            raise ValueError(f"{sid}: a sentence of kind 'listing' names its listing, and only such a sentence does")
        out.append(Sentence(sid, s["kind"], quotes, tuple(checks), s["verdict"], s.get("why", ""), s.get("assumption", ""), s.get("errata", ""),
                            s.get("listing", "")))
    return out


@dataclass(frozen=True)
class Listing:
    id: str
    first: str  # its first line, as printed (the same in both translations)
    claim: str  # the claim that runs it
    runs: str  # "path:function", the function the claim runs it as
    verbatim: bool  # whether that function's statements are the printed ones (same_statements)
    why: str = ""


def listings(raw: dict[str, Any] | None = None) -> list[Listing]:
    """The chapter's listings, read; ValueError with one line on an entry that lacks what it must give."""
    if raw is None:
        raw = tomllib.loads(DATA.read_text(encoding="utf-8"))
    out = []
    for item in raw.get("listing", []):
        lid = item.get("id", "?")
        missing = [k for k in ("id", "first", "claim", "runs", "verbatim") if item.get(k) in (None, "")]
        if missing or ":" not in item["runs"]:
            raise ValueError(f"listing {lid}: needs {', '.join(missing) or 'runs as path:function'}")
        if not item["verbatim"] and not item.get("why"):
            raise ValueError(f"listing {lid}: not run verbatim, and no why")
        out.append(Listing(lid, item["first"], item["claim"], item["runs"], bool(item["verbatim"]), item.get("why", "")))
    return out


def _is_code(block: str) -> bool:
    try:
        tree = ast.parse(block)
    except SyntaxError:
        return False
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, (ast.Constant, ast.Name))) for n in tree.body)


#: Blank lines between two paragraphs of one listing (the cached loop's prefill and loop are one listing).
JOIN = 1


def code_listings(text: str) -> list[tuple[int, str]]:
    """Every listing of the chapter's ``text``: (its first line, its source), a run of paragraphs that parse as Python
    statements (a bare word or string is prose); paragraphs only a blank line apart are one listing."""
    out: list[tuple[int, str]] = []
    previous_end = -1
    for m in re.finditer(r"(?:[^\n]*\S[^\n]*(?:\n|$))+", text):
        start = text.count("\n", 0, m.start()) + 1
        block = m.group(0).rstrip("\n")
        if _is_code(block):
            if out and previous_end == start - 1 - JOIN:
                out[-1] = (out[-1][0], out[-1][1] + "\n\n" + block)
            else:
                out.append((start, block))
            previous_end = start + block.count("\n")
    return out


def _function_body(path: str, function: str) -> list[ast.stmt]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function), None)
    if fn is None:
        raise ValueError(f"{path} has no function {function}")
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    return body[:-1] if body and isinstance(body[-1], ast.Return) else body


def same_statements(source: str, runs: str) -> bool:
    """Whether the function ``runs`` ("path:function") executes the printed ``source``'s statements, no more, no fewer
    (compared as syntax trees: spacing and comments aside, a changed name, argument or bound differs), before it returns."""
    path, _, function = runs.partition(":")
    return [statement_key(n) for n in ast.parse(source).body] == [statement_key(n) for n in _function_body(path, function)]


def statement_key(node: ast.stmt) -> str:
    """What two statements must share to be the same: their whole syntax tree (no positions, so no spacing or comments)."""
    return ast.dump(node)


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
