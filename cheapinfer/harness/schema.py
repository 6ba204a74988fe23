"""The records this suite writes and reads, as types: the run record (``run.json``) and the fault record
(``faults.json``), each with a version. One schema, one reader, one validator.

The TypedDicts below are what the writers produce (``record.build``, ``record.Result``, the fault runner) and
what the readers (``report``, ``errata``, ``compare``, ``merge``, the matrix, the fault runner) may rely on. A
key marked ``NotRequired`` is written by this version but absent from records of earlier ones, so no reader may
assume it. :func:`check_record` and :func:`check_fault_record` hold a record to these types (every required key
present, every present key of its type), and to what types cannot say: the suite and schema version, the
verdicts it knows, and values that can be compared and printed. A record that is not the shape this
suite writes is a :class:`RecordError` with one line naming the place, never a traceback.
"""

# No ``from __future__ import annotations`` here: TypedDict reads NotRequired from evaluated annotations only.
import functools
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from ..runtime.files import read_json
from . import vocabulary

#: The files: the latest run record in a report directory (every run's own in ``runs/``), and the last fault run.
RECORD_NAME = "run.json"
FAULTS_NAME = "faults.json"
#: The run record's schema: written by this version, and the versions it reads (:func:`upgrade` reads 1 as 2). Schema 2
#: dropped a claim's ``erratum`` (its first erratum, beside ``errata``) and says a harness error in ``harness_error``
#: only, not in a reason's first words.
RUN_SCHEMA = 2
SCHEMAS = (1, RUN_SCHEMA)
#: The fault record's schema (``faults.json``); records written before it had one are read as this version,
#: whose shape they have.
FAULT_SCHEMA = 1
FAULT_SCHEMAS = (FAULT_SCHEMA,)


# ------------------------------------------------------------------------------------------------
# the run record
# ------------------------------------------------------------------------------------------------


class CheckSpec(TypedDict):
    """A registry check as the record states it: what ``compare`` needs to tell a real move from noise."""

    q: str
    kind: Literal["digits", "shape"]
    why: NotRequired[str]
    form: NotRequired[Literal["exact", "rel", "abs", "bound", "one_of"]]  # digits checks
    tol: NotRequired[Any]  # a number, for every form but exact
    op: NotRequired[str]
    bound: NotRequired[Any]
    requires: NotRequired[str]
    profiles: NotRequired[list[str]]


class CheckResult(TypedDict):
    """One check of one measurement: its expected value in words, the measured value, and how it was judged."""

    q: str
    measured: Any
    asserted: bool
    passed: bool
    kind: NotRequired[str]
    expected: NotRequired[str]
    documented: NotRequired[bool]
    decided: NotRequired[bool]
    why: NotRequired[str]
    noise: NotRequired[str]  # a noisy check: its noise, standard error, bound and the sigmas that decide
    se: NotRequired[Any]
    bound: NotRequired[Any]
    sigmas: NotRequired[float]
    searched: NotRequired[bool]
    measurable: NotRequired[bool]


class ResultEntry(TypedDict):
    """One measurement of a claim on one profile (``record.Result``), or why there is none (*not run*)."""

    profile: str  # "-": the claim's test was not selected in this run
    verdict: str
    claim: NotRequired[str]
    device: NotRequired[str]
    measured: NotRequired[dict[str, Any]]
    checks: NotRequired[list[CheckResult]]
    tables: NotRequired[list[dict[str, Any]]]
    figures: NotRequired[list[str]]
    notes: NotRequired[list[str]]
    warnings: NotRequired[list[str]]
    reason: NotRequired[str]
    test: NotRequired[str]  # the test's node ID; none for an unselected test
    seconds: NotRequired[float]
    perturbed: NotRequired[bool]
    harness_error: NotRequired[bool]  # not run because the test raised before a verdict (vocabulary.is_harness_error; schema 1: a reason's prefix)
    load: NotRequired[dict[str, Any]]
    # After the test (its fixtures' setup included): ``peak_rss_bytes``, the process's maximum resident set so far (it
    # never falls: the result after which it last rose set the run's peak); ``rss_bytes``, the resident set then; on a
    # GPU ``device_peak_bytes``, torch's peak allocation during the test. Records before it have none.
    memory: NotRequired[dict[str, int]]


class ClaimEntry(TypedDict):
    """One claim of the registry, as this run saw it: the book's values, the checks, every result and the verdict."""

    section: str
    statement: str
    verdict: str
    book: NotRequired[dict[str, Any]]
    source: NotRequired[dict[str, dict[str, Any]]]
    units: NotRequired[dict[str, Any]]
    errata: NotRequired[list[dict[str, Any]]]  # schema 1 had ``erratum`` too, the first of them: read_record drops it
    faults: NotRequired[list[str]]
    note: NotRequired[str | None]
    has_test: NotRequired[bool]
    runs_on: NotRequired[list[str]]
    digits_on: NotRequired[list[str]]
    checks: NotRequired[list[CheckSpec]]
    results: NotRequired[list[ResultEntry]]


# ------------------------------------------------------------------------------------------------
# the fault record
# ------------------------------------------------------------------------------------------------


class FaultEntry(TypedDict):
    """One fault of the catalogue over the runs: per run, each target claim's verdict (``vocabulary.RED`` when it caught it)."""

    targets: list[str]
    runs: list[dict[str, str]]
    section: NotRequired[str]
    kind: NotRequired[str]
    what: NotRequired[str]
    clocked: NotRequired[bool]
    caught: NotRequired[int]
    seconds: NotRequired[float]
    checks: NotRequired[list[dict[str, dict[str, list[str]]]]]  # per run, per claim run: the checks that "failed" and "held"


class FaultRecord(TypedDict):
    """A ``python -m cheapinfer faults`` run: every fault, how often it was caught, and the claims no fault names."""

    runs: int
    faults: dict[str, FaultEntry]
    schema: NotRequired[int]
    suite: NotRequired[str]
    created: NotRequired[str]
    mode: NotRequired[str]
    seconds: NotRequired[float]
    uncovered: NotRequired[list[str]]
    toothless: NotRequired[list[dict[str, Any]]]  # checks that held, or went unjudged, under the fault they name (FAULT_RULE)
    not_applicable: NotRequired[dict[str, str]]  # faults not run: the installed libraries are outside the releases they model


class RunHead(TypedDict):
    """The run record less its claims: who wrote it, when, where, and the last fault run."""

    schema: int
    suite: str
    created: NotRequired[str]
    run: NotRequired[dict[str, Any]]
    environment: NotRequired[dict[str, Any]]
    summary: NotRequired[dict[str, int]]
    sections: NotRequired[dict[str, str]]
    fault_run: NotRequired[FaultRecord]
    errata: NotRequired[list[dict[str, Any]]]
    text: NotRequired[dict[str, Any]]  # the graded findings placed in the chapter's translations (harness.author.text_record)


class RunRecord(RunHead):
    """A run of the claims: the record ``record.build`` makes and ``store`` and ``report`` write to ``runs/`` and ``run.json``."""

    claims: dict[str, ClaimEntry]


# ------------------------------------------------------------------------------------------------
# the validator
# ------------------------------------------------------------------------------------------------


def as_float(value: Any) -> float | None:
    """``value`` as a float, or None when it is no number (or an integer beyond the range of a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


class RecordError(ValueError):
    """A run record that cannot be read or is not the shape this suite writes."""


def _expect(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise RecordError(f"{where}: expected {what}")


def _name(key: str) -> str:
    """A key of the record as it can be printed."""
    try:
        key.encode("utf-8")
        return key
    except UnicodeEncodeError:
        return ascii(key)


def _readable(record: Any) -> None:
    """RecordError naming the first value no reader of the record can use: an integer beyond the range of a
    float (it overflows every comparison), or text that is not Unicode (a lone surrogate: it cannot be printed)."""
    stack: list[tuple[str, Any]] = [("", record)]
    while stack:  # iterative: a deep record is judged here, not by the interpreter's recursion limit
        where, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                at = f"{where}.{_name(k)}" if where else _name(k)
                stack += [(f"{at} (its name)", k), (at, v)]
        elif isinstance(value, list):
            stack += [(f"{where}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, str) and _name(value) != value:
            raise RecordError(f"{where or 'the record'}: text that is not Unicode ({_name(value)[:60]})")
        elif isinstance(value, int) and not isinstance(value, bool) and as_float(value) is None:
            raise RecordError(f"{where or 'the record'}: an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits, beyond the range of a float")


def _words(tp: Any) -> str:
    """A type of the schema in the words of an error message."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if typing.is_typeddict(tp):
        required = sorted(tp.__required_keys__)
        return "an object" + (f" with {', '.join(repr(k) for k in required)}" if required else "")
    if origin is Literal:
        return " or ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_words(a) for a in args)
    if origin is list:
        return "a list"
    if origin is dict:
        return "an object"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}.get(tp, "a value")


def _conforms(value: Any, tp: Any) -> bool:
    """Whether ``value`` has the type ``tp`` at its top level (its members are walked by :func:`_conform`)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True
    if typing.is_typeddict(tp) or origin is dict:
        return isinstance(value, dict)
    if origin is list:
        return isinstance(value, list)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return as_float(value) is not None
    if tp is type(None):
        return value is None
    return isinstance(value, tp)


@functools.lru_cache(maxsize=None)
def _fields(tp: Any) -> dict[str, Any]:
    """A TypedDict's keys and their types, with ``NotRequired`` taken off."""
    hints = typing.get_type_hints(tp)
    return {k: (typing.get_args(t)[0] if typing.get_origin(t) is NotRequired else t) for k, t in hints.items()}


def _key(key: str, tp: Any) -> str:
    """A key in a message: a container bare (``results[0]``), a value quoted (``'verdict'``)."""
    container = typing.is_typeddict(tp) or typing.get_origin(tp) in (list, dict)
    return key if container else f"'{key}'"


def _conform(value: Any, tp: Any, where: str) -> None:
    """RecordError at the first place where ``value`` is not of the type ``tp``: every required key of an object
    present, every present key of its type (keys the schema does not name are left to newer writers)."""
    stack = [(value, tp, where)]
    while stack:
        value, tp, where = stack.pop()
        _expect(_conforms(value, tp), where, _words(tp))
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            tp = next(a for a in args if _conforms(value, a))
            origin, args = typing.get_origin(tp), typing.get_args(tp)
        if typing.is_typeddict(tp):
            missing = [k for k in sorted(tp.__required_keys__) if k not in value]
            _expect(not missing, where, f"{_words(tp)}; it has no {', '.join(repr(k) for k in missing)}")
            stack += [(value[k], t, f"{where}: {_key(k, t)}") for k, t in reversed(_fields(tp).items()) if k in value]
        elif origin is list:
            stack += [(v, args[0], f"{where}[{i}]") for i, v in reversed(list(enumerate(value)))]
        elif origin is dict:
            stack += [(v, args[1], f"{where}: {_name(k)}") for k, v in reversed(list(value.items())) if args[1] is not Any]


def _header(record: Any, kind: str, schemas: tuple[int, ...], required: bool, at: str = "") -> None:
    """The suite that wrote ``record`` and its schema version (``required``: a record without one is refused).
    ``at``: where the record sits inside another, as messages name it."""
    _expect(isinstance(record, dict), at.removesuffix(": ") or f"the {kind}", "a JSON object")
    suite = record.get("suite")
    if required or "suite" in record:
        _expect(isinstance(suite, str) and suite.split(" ")[0] == "cheapinfer", f"{at}'suite'",
                f"'cheapinfer <version>', not {suite!r}" if "suite" in record else "'cheapinfer <version>', and the record has none")
    if required or "schema" in record:
        schema = record.get("schema")
        _expect(type(schema) is int and schema in schemas, f"{at}'schema'",
                f"{' or '.join(map(str, schemas))} (the schemas this version reads), not {schema!r}" if "schema" in record
                else f"{' or '.join(map(str, schemas))}, and the record has none")


def check_record(record: Any) -> RunRecord:
    """``record`` as a :class:`RunRecord`, or RecordError naming the first entry that is not what the readers read.

    A run record of this suite (``suite`` "cheapinfer <version>") in a schema this version reads, of the types
    above, with the verdicts of ``vocabulary.VERDICTS`` only, and only values that can be compared and printed.
    """
    _header(record, "record", SCHEMAS, required=True)
    _readable(record)  # before any message quotes a claim ID
    _expect(isinstance(record.get("claims"), dict), "'claims'", "an object of claims by ID")
    verdicts = vocabulary.VERDICTS  # read now: a verdict added to the vocabulary is known here at once
    known = ", ".join(verdicts)
    for cid, claim in record["claims"].items():
        _expect(vocabulary.valid_id(cid), f"claim {ascii(cid)[:60]}", "a claim ID (upper-case letters and digits joined by '-'): "
                "text a terminal would obey (a newline, an ANSI escape) is no claim")
        where = f"claim {cid}"
        _conform(claim, ClaimEntry, where)
        _expect(claim["verdict"] in verdicts, f"{where}: 'verdict'", f"one of {known}, not {claim['verdict']!r}")
        for i, spec in enumerate(claim.get("checks", [])):
            if spec["kind"] == "digits":
                _expect(spec.get("form") in typing.get_args(_fields(CheckSpec)["form"]), f"{where}: checks[{i}]: 'form'", "exact, rel, abs, bound or one_of")
                _expect(spec["form"] == "exact" or as_float(spec.get("tol")) is not None, f"{where}: checks[{i}]: 'tol'", "a number")
        for i, r in enumerate(claim.get("results", [])):
            _expect(r["verdict"] in verdicts, f"{where}: results[{i}]: 'verdict'", f"one of {known}, not {r['verdict']!r}")
    _conform({k: v for k, v in record.items() if k != "claims"}, RunHead, "the record")  # the claims: above, each message naming its ID
    if "fault_run" in record:
        _header(record["fault_run"], "fault record", FAULT_SCHEMAS, required=False, at="the record: fault_run: ")
    return record


def check_fault_record(record: Any) -> FaultRecord:
    """``record`` as a :class:`FaultRecord`, or RecordError naming the first entry that is not one."""
    _header(record, "fault record", FAULT_SCHEMAS, required=False)
    _readable(record)
    _conform(record, FaultRecord, "the fault record")
    return record


def record_path(path: Path, name: str = RECORD_NAME) -> Path:
    """The file a record argument names: ``path`` itself, or the ``name`` inside it where it is a report directory."""
    path = Path(path)
    return path / name if path.is_dir() else path


def _json_at(path: Path, name: str) -> Any:
    """The JSON at ``path`` (or ``name`` inside it), bounded and strict (:func:`cheapinfer.runtime.files.read_json`)."""
    return read_json(record_path(path, name))


#: How a record of schema 1 marks a *not run* whose test raised before a verdict: its reason begins with these words
#: (schema 2 says it in the result's ``harness_error``). Frozen: it is what those records hold, whatever a writer says now.
SCHEMA_1_ERROR_PREFIX = "error before a verdict"


def upgrade(record: RunRecord) -> RunRecord:
    """A checked record of an earlier schema in the shape of this one, in place (its ``schema`` still says which it was
    written in), so that every reader reads one shape. Schema 1: a claim's ``erratum`` (its first erratum, the only one
    of records before several) becomes ``errata`` where that is absent, and goes; a *not run* whose reason begins with
    :data:`SCHEMA_1_ERROR_PREFIX` gets ``harness_error``."""
    if record["schema"] != 1:
        return record
    for cid, claim in record["claims"].items():
        first = claim.pop("erratum", None)
        _expect(first is None or isinstance(first, dict), f"claim {cid}: 'erratum'", "an object or null")
        claim.setdefault("errata", [first] if first else [])
        for r in claim.get("results", []):
            if r["verdict"] == vocabulary.NOT_RUN and str(r.get("reason", "")).startswith(SCHEMA_1_ERROR_PREFIX):
                r["harness_error"] = True
    return record


def read_record(path: Path) -> RunRecord:
    """The run record at ``path`` (``run.json``, or the report directory holding it), checked, and read in this
    version's shape whatever schema it was written in (:func:`upgrade`). OSError or ValueError (not UTF-8, not JSON)
    when it cannot be read; RecordError (a ValueError) when it is not a record of this suite."""
    return upgrade(check_record(_json_at(path, RECORD_NAME)))


def read_fault_record(path: Path) -> FaultRecord:
    """The fault record at ``path`` (``faults.json``, or the report directory holding it), checked; errors as
    :func:`read_record`'s."""
    return check_fault_record(_json_at(path, FAULTS_NAME))
