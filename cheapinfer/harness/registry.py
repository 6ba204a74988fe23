"""The claim registry: the book's values, their tolerances, and the verdict function.

``registry.toml`` (next to this file) is the single source of truth for every number the book prints. Each claim holds:

- ``statement``: the book's sentence, paraphrased in English;
- ``book``: the book's values by name, ``units`` their units;
- ``runs_on``: the profiles the claim is measured on (``arithmetic``, ``twin``, ``stand-in``, ``book``);
- ``digits_on``: the profiles on which the book's digits are asserted (elsewhere they are reported);
- ``source``: for each book value, where it comes from: ``printed`` (the chapter's own text, e.g. ``"67 MB"``), ``reading`` (a
  printed text interpreted, with ``why``) or ``derived`` (a formula, with the printed values or architecture facts it uses in
  ``from``);
- ``checks``: a list of checks. A *digits* check compares a measured value with ``book[q]`` (``form`` = ``exact`` | ``rel`` |
  ``abs`` with ``tol``; ``bound`` with ``op``, for a printed bound such as "more than ten times"; ``one_of``, for a printed set
  such as "two or three"); a *shape* check compares a measured value with a ``bound`` (``op`` = ``>``, ``>=``, ``<``, ``<=``,
  ``==``) and holds on every profile. Every check says ``why`` its tolerance is what it is. A check may carry ``requires =
  "cuda"``: then it is asserted only on a CUDA device and reported elsewhere. A check may carry ``profiles``: then it is judged on
  those of the claim's profiles only (the book checked against itself on ``arithmetic``, from its own printed numbers, beside the
  measurement of a model). Two kinds of shape check can leave a claim *inconclusive* instead of failing it (:func:`judge`):

  - ``noise = "rounds"``: a quantity read from timing rounds. The measurement hands ``<q>`` with its standard error over the
    rounds, ``<q>_se``; the check decides only where the margin to the bound is at least :data:`NOISE_SIGMAS` standard errors (a
    two-sided z-test at level 0.27% under normal noise), pass or fail. A margin within the noise (after the measurement's extra
    rounds, up to its budget) decides nothing. ``noise = "steps"`` is the same test for a quantity read from one run of many
    single steps (a real scheduler's run), whose standard error is what that run's step-time noise explains (the measurement
    states how it propagates it).
  - ``searched = true`` on a boolean ``== true`` check: something the claim says exists, searched for over a range the measurement
    could afford (the range is in the measured values). Not found there decides nothing: the range, not the book, ran out. A check
    on what was searched for (the knee's gains) names that search with ``when_found = "<q>"``: where it was not found there is
    nothing to judge, and the check is reported, not asserted. A check that tests the claim only where its premise holds names the
    ``measurable`` check of that premise the same way (several, comma-separated, where it needs each: every timing check of a
    clocked claim names ``device_bound``, :mod:`cheapinfer.runtime.premise`).
  - ``limit = true`` on a noisy check: its bound is a physical limit. Within the noise it passes, beyond it fails.
  - ``measurable = true`` on a boolean ``== true`` check: this device could measure what the claim is about (its premise held in a
    probe independent of the measured system: a CPU kernel that is itself faster on more rows cannot show whether batching does).
    False decides nothing: the device, not the book, is the limit, and the measurement says why in ``<q>_why``.
- ``erratum`` (optional; ``[[ID.erratum]]`` for several, each with its own grade and failing checks): a confirmed erratum,
  recorded the way ``xfail(strict=True)`` records a known bug: what the book ``says``, what ``holds`` instead, the ``assumption``
  under which the book's number would hold, the digits checks that are documented to ``fail``, the printed values it
  ``stands_on``, and the ``profiles`` where it is confirmed, with its ``grade`` (:data:`GRADES`: what kind of fault in the text it
  is). An erratum about a library's API says in ``applies`` on which releases it holds (``{ transformers = ">=5" }``, PEP 440
  specifiers); elsewhere the claim is judged without it.
- ``timing``: ``"clocked"`` where the verdict reads a clock (implied by a ``noise`` check; measured alone on a quiet machine),
  ``"counted"`` where it counts tokens, bytes or operations; ``slow = true`` where its test takes more than a minute on a 2-core
  CPU. The plugin marks the tests from them (:func:`clocked_claims`).

The verdict on a claim's measurements is :mod:`cheapinfer.harness.verdict`.
"""

from __future__ import annotations

import math
import operator
import tomllib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from .grades import GRADES
from .numbers import fmt, is_number
from .registry_fields import check_fields, check_guards, field_values
from .vocabulary import ID_MAX, valid_id

#: A noisy check decides only where its margin to the bound is at least this many standard errors.
NOISE_SIGMAS = 3.0
NOISE_KINDS = ("rounds", "steps")
#: How the inconclusive message names each kind of standard error.
NOISE_WORDS = {"rounds": "standard error over the rounds", "steps": "standard error from the run's step-time noise"}

PROFILES = ("arithmetic", "twin", "stand-in", "book")
#: The chapter's sections by their one name, also that of claims/test_<section>.py, chapter/<section>/ and
#: faults/catalogue/<section>.py (tests/test_layout.py), and their titles. Old records' keys: tables.section_key.
SECTIONS = {"kv_cache": "1. KV cache", "batching": "2. Batching", "quantization": "3. Weight quantization", "outliers": "4. Activation outliers",
            "evaluation": "5. Does quantization hurt?", "speculative": "6. Speculative decoding", "distillation": "7. Distillation",
            "budget": "8. The budget", "asides": "9. Asides"}
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq}
_FORMS = ("exact", "rel", "abs", "bound", "one_of")
SOURCE_KINDS = ("printed", "reading", "derived")
CLOCKED, COUNTED = "clocked", "counted"
TIMINGS = (CLOCKED, COUNTED)
#: The fields of a claim's table; any other name (a misspelt ``slow``) is refused, never ignored.
FIELDS = ("section", "statement", "book", "units", "source", "runs_on", "digits_on", "timing", "slow", "note", "checks", "erratum")


class RegistryError(ValueError):
    """The registry file is malformed."""



def outside_releases(applies: Mapping[str, str], versions: Mapping[str, str | None]) -> tuple[str, str, str] | None:
    """The first (library, specifier, version) of ``applies`` (library -> PEP 440 specifier) whose version in
    ``versions`` lies outside it; None where every one lies inside. A library without a version there, or with one
    that cannot be read ("not installed", a local build's name), counts as inside: judge as documented, and the
    record shows the version. Errata (:meth:`Erratum.applies_to`) and faults (``faults.base.inapplicable``) read it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    for library, spec in applies.items():
        version = versions.get(library)
        try:
            if version is not None and Version(str(version).split("+")[0]) not in SpecifierSet(spec):
                return library, spec, str(version)
        except InvalidVersion:
            continue
    return None

@dataclass(frozen=True)
class Check:
    """One assertion of a claim. ``kind`` is ``digits`` (against the book) or ``shape`` (against a bound)."""

    q: str
    kind: str
    why: str
    form: str = ""  # digits: exact | rel | abs
    tol: float = 0.0  # digits: relative or absolute tolerance
    op: str = ""  # shape: comparison operator
    bound: Any = None  # shape: the bound
    requires: str = ""  # "" or "cuda"
    noise: str = ""  # shape: "rounds" or "steps" (the measurement hands <q>_se, the standard error over timing rounds or a run's steps)
    searched: bool = False  # shape, bool == true: existence searched over an affordable range; not found decides nothing
    when_found: str = ""  # the searched (or measurable) checks (comma-separated) whose find (or premise) this check needs: asserted only where each holds
    measurable: bool = False  # shape, bool == true: the device could measure the claim; False decides nothing (<q>_why says why)
    limit: bool = False  # noisy shape: the bound is a physical limit; within the noise it passes, beyond it fails
    profiles: tuple[str, ...] = ()  # judged only on these of the claim's profiles (none: on every one)
    reads: str = ""  # a cross-check: the measured path (dotted name of a function) whose result it and its guards are read off
    guards: tuple[str, ...] = ()  # with reads: the quantities of the claim the cross-check vouches for
    draws: int = 0  # judged on the median over this many seeded draws of its workload (DRAWS_RULE); 0: on one measurement
    fault: str = ""  # the catalogue's fault under which this check fails (FAULT_RULE); "": none named

    def judged_on(self, profile: str) -> bool:
        return not self.profiles or profile in self.profiles

    @property
    def premises(self) -> tuple[str, ...]:
        """The checks named by ``when_found``, each of which must hold for this one to be asserted."""
        return tuple(w.strip() for w in self.when_found.split(",") if w.strip())

    @property
    def se_key(self) -> str:
        """The measured value that holds this check's standard error (``noise = "rounds"``)."""
        return f"{self.q}_se"

    def describe(self, book: Mapping[str, Any]) -> str:
        if self.kind == "shape":
            return f"{self.q} {self.op} {fmt(self.bound)}"
        if self.form == "exact":
            return f"{self.q} == {fmt(book[self.q])}"
        if self.form == "bound":
            return f"{self.q} {self.op} {fmt(book[self.q])}"
        if self.form == "one_of":
            return f"{self.q} in {{{', '.join(fmt(v) for v in book[self.q])}}}"
        if self.form == "rel":
            return f"{self.q} = {fmt(book[self.q])} ± {self.tol:.3g} (relative)"
        return f"{self.q} = {fmt(book[self.q])} ± {fmt(self.tol)}"


@dataclass(frozen=True)
class Source:
    """Where a book value comes from: the chapter's printed text, a reading of it, or a derivation."""

    kind: str  # printed | reading | derived
    text: str  # printed/reading: the chapter's text as printed; derived: the formula
    why: str = ""  # reading: how the text is read
    inputs: tuple[str, ...] = ()  # derived: the printed values or architecture facts it uses

    def describe(self) -> str:
        if self.kind == "printed":
            return f'printed "{self.text}"'
        if self.kind == "reading":
            return f'reading of "{self.text}" ({self.why})'
        return f"derived: {self.text}" + (f" (from {', '.join(self.inputs)})" if self.inputs else "")


@dataclass(frozen=True)
class Erratum:
    """A confirmed erratum: the book's digits fail as documented, CI stays green, and the day they
    reproduce the claim turns red (strict), so the entry is revisited."""

    says: str
    holds: str
    assumption: str
    fails: tuple[str, ...]  # the digits checks (by quantity) documented to fail
    stands_on: tuple[str, ...]  # the printed book values the erratum rests on
    profiles: tuple[str, ...]  # where it is confirmed; elsewhere (the book profile) a failure stays `deviates`
    grade: str = "erratum"  # one of GRADES
    reader: str = ""  # what a reader should do instead (e.g. the replacement call)
    applies: Mapping[str, str] = field(default_factory=dict)  # library -> PEP 440 specifier of the releases it holds on ({}: all)

    def applies_to(self, versions: Mapping[str, str] | None) -> bool:
        """Whether the erratum holds for these library versions (unknown versions: it does)."""
        return versions is None or outside_releases(self.applies, versions) is None


@dataclass(frozen=True)
class Claim:
    id: str
    section: str
    statement: str
    book: Mapping[str, Any]
    units: Mapping[str, str]
    runs_on: tuple[str, ...]
    digits_on: tuple[str, ...]
    checks: tuple[Check, ...]
    note: str = ""
    source: Mapping[str, Source] = field(default_factory=dict)
    errata: tuple[Erratum, ...] = ()  # each documents its own failing checks, with its own grade
    timing: str = COUNTED  # CLOCKED: the verdict reads a clock
    slow: bool = False  # its test takes more than a minute on a 2-core CPU

    @property
    def erratum(self) -> Erratum | None:
        """The first of :attr:`errata` (the record keeps it under ``erratum`` for readers of older records)."""
        return self.errata[0] if self.errata else None

    def errata_on(self, profile: str, versions: Mapping[str, str] | None = None) -> tuple[Erratum, ...]:
        """The errata confirmed on ``profile`` that hold for these library versions."""
        return tuple(e for e in self.errata if profile in e.profiles and e.applies_to(versions))

    def with_book(self, **values: Any) -> "Claim":
        return replace(self, book={**self.book, **values})


def _check_from(claim_id: str, raw: Mapping[str, Any], book: Mapping[str, Any]) -> Check:
    kind = raw.get("kind", "digits")
    if not isinstance(raw.get("why"), str) or not raw["why"].strip():  # absent, or only spaces: says nothing
        raise RegistryError(f"{claim_id}: check {raw.get('q')!r}: 'why' says nothing about why its tolerance is what it is")
    if kind == "digits":
        if raw.get("q") not in book:
            raise RegistryError(f"{claim_id}: digits check {raw.get('q')!r} names no book value")
        if raw.get("form") not in _FORMS:
            raise RegistryError(f"{claim_id}: digits check form must be one of {_FORMS}")
        if raw["form"] in ("rel", "abs") and not (0 < float(raw.get("tol", 0)) < math.inf):
            raise RegistryError(f"{claim_id}: {raw['form']} check of {raw['q']!r} needs a finite tol > 0")
        if raw["form"] == "bound" and raw.get("op") not in OPS:
            raise RegistryError(f"{claim_id}: bound check of {raw['q']!r} needs op in {tuple(OPS)}")
        if raw["form"] == "one_of" and not isinstance(book[raw["q"]], list):
            raise RegistryError(f"{claim_id}: one_of check of {raw['q']!r} needs a list as its book value")
    elif kind == "shape":
        if raw.get("op") not in OPS or "bound" not in raw:
            raise RegistryError(f"{claim_id}: shape check {raw.get('q')!r} needs op in {tuple(OPS)} and a bound")
        if ("noise" in raw or raw.get("limit")) and (raw.get("noise") not in NOISE_KINDS or raw["op"] == "==" or not is_number(raw["bound"])):
            raise RegistryError(f"{claim_id}: noisy check {raw.get('q')!r} needs noise in {NOISE_KINDS}, a numeric bound and op < <= > >=")
        if raw.get("searched") and (raw["op"] != "==" or raw["bound"] is not True):
            raise RegistryError(f"{claim_id}: searched check {raw.get('q')!r} must be '== true' (found in the range searched)")
        if raw.get("measurable") and (raw["op"] != "==" or raw["bound"] is not True or raw.get("searched")):
            raise RegistryError(f"{claim_id}: measurable check {raw.get('q')!r} must be '== true' (this device could measure it), and not searched")
    else:
        raise RegistryError(f"{claim_id}: unknown check kind {kind!r}")
    check_fields(claim_id, raw, RegistryError)
    if kind == "digits" and ("noise" in raw or "searched" in raw or "when_found" in raw or "measurable" in raw or "limit" in raw):
        raise RegistryError(f"{claim_id}: digits check {raw.get('q')!r}: noise, searched, when_found, measurable and limit belong to shape checks")
    return Check(
        q=raw["q"],
        kind=kind,
        why=raw["why"],
        form=raw.get("form", ""),
        tol=float(raw.get("tol", 0.0)),
        op=raw.get("op", ""),
        bound=raw.get("bound"),
        requires=raw.get("requires", ""),
        noise=raw.get("noise", ""),
        searched=bool(raw.get("searched", False)),
        when_found=str(raw.get("when_found", "")),
        measurable=bool(raw.get("measurable", False)), limit=bool(raw.get("limit", False)),
        profiles=tuple(raw.get("profiles", ())),
        **field_values(raw),
    )


def _source_from(claim_id: str, key: str, raw: Any) -> Source:
    if not isinstance(raw, Mapping):
        raise RegistryError(f"{claim_id}: source of {key!r} must be a table with one of {SOURCE_KINDS}")
    kinds = [k for k in SOURCE_KINDS if k in raw]
    if len(kinds) != 1:
        raise RegistryError(f"{claim_id}: source of {key!r} must name exactly one of {SOURCE_KINDS}")
    kind = kinds[0]
    if kind == "reading" and not str(raw.get("why", "")).strip():
        raise RegistryError(f"{claim_id}: reading of {key!r} says nothing about why it is read so")
    if kind == "derived" and not raw.get("from"):
        raise RegistryError(f"{claim_id}: derivation of {key!r} names no printed value or architecture fact it uses ('from')")
    return Source(kind, str(raw[kind]), str(raw.get("why", "")), tuple(raw.get("from", ())))


def _erratum_from(claim_id: str, raw: Mapping[str, Any], checks: tuple[Check, ...], source: Mapping[str, Source]) -> Erratum:
    for key in ("says", "holds", "assumption", "fails", "stands_on", "profiles", "grade"):
        if not raw.get(key):
            raise RegistryError(f"{claim_id}: erratum needs {key!r}")
    if raw["grade"] not in GRADES:
        raise RegistryError(f"{claim_id}: erratum grade {raw['grade']!r} is none of {', '.join(GRADES)}")
    digits = {c.q for c in checks if c.kind == "digits"}
    unknown = set(raw["fails"]) - digits
    if unknown:
        raise RegistryError(f"{claim_id}: erratum fails {sorted(unknown)}, which no digits check names")
    printed = [k for k in raw["stands_on"] if k in source and source[k].kind == "printed"]
    if not printed:
        raise RegistryError(f"{claim_id}: an erratum must stand on a printed book value, not only on readings or derivations")
    for p in raw["profiles"]:
        if p not in PROFILES:
            raise RegistryError(f"{claim_id}: erratum names unknown profile {p!r}")
    applies = raw.get("applies", {})
    if not isinstance(applies, Mapping) or not all(isinstance(v, str) for v in applies.values()):
        raise RegistryError(f"{claim_id}: erratum 'applies' must map library names to version specifiers")
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    for library, spec in applies.items():
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise RegistryError(f"{claim_id}: erratum applies to {library} {spec!r}, which is no version specifier") from None
    return Erratum(
        says=raw["says"], holds=raw["holds"], assumption=raw["assumption"], fails=tuple(raw["fails"]),
        stands_on=tuple(raw["stands_on"]), profiles=tuple(raw["profiles"]), grade=raw["grade"], reader=raw.get("reader", ""), applies=dict(applies),
    )


def _errata_from(claim_id: str, raw: Mapping[str, Any] | list, checks: tuple[Check, ...], source: Mapping[str, Source]) -> tuple[Erratum, ...]:
    """``[ID.erratum]`` (one) or ``[[ID.erratum]]`` (several, each with its own grade); no check documented by two."""
    errata = tuple(_erratum_from(claim_id, r, checks, source) for r in ([raw] if isinstance(raw, Mapping) else raw))
    fails = [q for e in errata for q in e.fails]
    twice = sorted({q for q in fails if fails.count(q) > 1})
    if twice:
        raise RegistryError(f"{claim_id}: {twice} documented as failing by more than one erratum")
    return errata


def _timing_from(claim_id: str, raw: Mapping[str, Any], checks: tuple[Check, ...]) -> str:
    """``timing``, which a noise check implies (``clocked``) and which is stated everywhere else."""
    noisy = [c.q for c in checks if c.noise]
    timing = raw.get("timing", CLOCKED if noisy else None)
    if timing is None:
        raise RegistryError(f"{claim_id}: timing is missing: \"clocked\" (its verdict reads a clock) or \"counted\" (it counts)")
    if timing not in TIMINGS:
        raise RegistryError(f"{claim_id}: timing {timing!r} is none of {', '.join(TIMINGS)}")
    if noisy and timing != CLOCKED:
        raise RegistryError(f"{claim_id}: timing {timing!r}, but its check {noisy[0]!r} is read from timing rounds: it is clocked")
    if not isinstance(raw.get("slow", False), bool):
        raise RegistryError(f"{claim_id}: slow {raw['slow']!r} is not true or false")
    return timing


def parse(text: str) -> dict[str, Claim]:
    data = tomllib.loads(text)
    claims = {}
    for claim_id, raw in data.items():
        if not valid_id(claim_id):
            raise RegistryError(f"{ascii(claim_id)}: not a claim ID (upper-case letters, digits and '.' joined by '-', at most {ID_MAX} characters)")
        unknown = sorted(set(raw) - set(FIELDS))
        if unknown:
            raise RegistryError(f"{claim_id}: unknown field {', '.join(map(ascii, unknown))} (fields: {', '.join(FIELDS)})")
        section = raw.get("section")
        if section not in SECTIONS:
            raise RegistryError(f"{claim_id}: section {section!r} not in {tuple(SECTIONS)}")
        book = raw.get("book", {})
        runs_on = tuple(raw.get("runs_on", ()))
        digits_on = tuple(raw.get("digits_on", ()))
        for p in runs_on + digits_on:
            if p not in PROFILES:
                raise RegistryError(f"{claim_id}: unknown profile {p!r}")
        unknown = set(raw.get("source", {})) - set(book)
        if unknown:
            raise RegistryError(f"{claim_id}: source names no book value: {sorted(unknown)}")
        source = {k: _source_from(claim_id, k, v) for k, v in raw.get("source", {}).items()}
        checks = tuple(_check_from(claim_id, c, book) for c in raw.get("checks", ()))
        for c in checks:
            if set(c.profiles) - set(runs_on):
                raise RegistryError(f"{claim_id}: check {c.q!r} names profiles the claim does not run on: {sorted(set(c.profiles) - set(runs_on))}")
        check_guards(claim_id, checks, RegistryError)
        conditions = {c.q for c in checks if c.searched or c.measurable}
        for c in checks:
            for w in c.premises:
                if w not in conditions:
                    raise RegistryError(f"{claim_id}: check {c.q!r} is measured when {w!r} holds, which no searched or measurable check of this claim names")
        claims[claim_id] = Claim(
            id=claim_id, section=section, statement=raw["statement"], book=book, units=raw.get("units", {}), runs_on=runs_on,
            digits_on=digits_on, checks=checks, note=raw.get("note", ""), source=source,
            errata=_errata_from(claim_id, raw.get("erratum", ()), checks, source),
            timing=_timing_from(claim_id, raw, checks), slow=raw.get("slow", False),
        )
    return claims


@lru_cache(maxsize=1)
def load() -> dict[str, Claim]:
    """All claims of the chapter, keyed by ID, in the book's order."""
    return parse(resources.files("cheapinfer").joinpath("registry.toml").read_text(encoding="utf-8"))


def clocked_claims() -> set[str]:
    """Claims whose verdict reads a clock (``timing = "clocked"``): it can depend on the machine's load, so they are
    measured alone on a quiet machine; the others count tokens, bytes or operations and may run two at a time."""
    return {cid for cid, c in load().items() if c.timing == CLOCKED}


def slow_claims() -> set[str]:
    """Claims whose test takes more than a minute on a 2-core CPU (``slow = true``)."""
    return {cid for cid, c in load().items() if c.slow}


#: The exit status of a command, and of pytest (its usage error), when the registry itself is broken.
REGISTRY_EXIT = 4


def problem() -> str:
    """"" when the registry loads; else its error as one line: the file, then the claim, field and problem."""
    try:
        load()
    except RegistryError as exc:
        return f"the registry {resources.files('cheapinfer').joinpath('registry.toml')} is broken: {' '.join(str(exc).split())}"
    except ValueError as exc:  # not TOML (tomllib.TOMLDecodeError is a ValueError)
        return f"the registry {resources.files('cheapinfer').joinpath('registry.toml')} is not valid TOML: {' '.join(str(exc).split())}"
    return ""


def get(claim_id: str) -> Claim:
    try:
        return load()[claim_id]
    except KeyError:
        raise KeyError(f"claim {claim_id!r} is not in the registry") from None
