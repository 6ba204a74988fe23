"""The run record (JSON) and the errata report (Markdown) written after every run.

``build`` turns recorded results into a record: per claim ID its statement, book values, checks
(with their tolerances), the result on each profile, and the claim's overall verdict; plus the
environment, the run and the candidate errata. ``markdown`` renders a record; it is a pure function
of the record (no clock, no registry, no machine), so a checked-in record pins the format
(tests/data/run-record.json -> tests/data/errata-snapshot.md).
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .. import __version__
from ..runtime.files import why_not_a_directory
from . import author, errata, errata_sections, registry, tables
from .numbers import fmt, value_text
from .record import overall
from .schema import RECORD_NAME, RUN_SCHEMA, ClaimEntry, ResultEntry, RunRecord
from .vocabulary import KEY_ENVIRONMENT, NO_TEST, NOT_RUN, SHAPE_HOLDS

ERRATA_NAME = "errata.md"
#: Why a selected claim has no result in an interrupted run.
INTERRUPTED_REASON = "interrupted: the run was stopped before its test finished"
#: Every run's own record, ``<report dir>/runs/<UTC stamp>-<run id>.json``, beside the latest ``run.json``.
RUNS_DIR = "runs"
#: A run's pytest-benchmark JSON beside its own record: ``runs/<UTC stamp>-<run id>.benchmarks.json``.
BENCHMARKS_SUFFIX = ".benchmarks.json"
#: The run id ``python -m cheapinfer verify`` gives its pytest, which names that run's record with it.
RUN_ID_VARIABLE = "CHEAPINFER_RUN_ID"


def _check_spec(check: registry.Check) -> dict[str, Any]:
    """A registry check as JSON: what ``compare`` needs to tell a real move from noise."""
    spec: dict[str, Any] = {"q": check.q, "kind": check.kind, "why": check.why}
    if check.kind == "shape":
        spec.update(op=check.op, bound=check.bound)
    else:
        spec.update(form=check.form, tol=check.tol)
        if check.form == "bound":
            spec["op"] = check.op
    if check.requires:
        spec["requires"] = check.requires
    if check.profiles:
        spec["profiles"] = list(check.profiles)
    return spec


def _source_spec(src: registry.Source) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": src.kind, "text": src.text}
    if src.why:
        spec["why"] = src.why
    if src.inputs:
        spec["from"] = list(src.inputs)
    return spec


def _erratum_spec(e: registry.Erratum) -> dict[str, Any]:
    spec = {"says": e.says, "holds": e.holds, "assumption": e.assumption, "fails": list(e.fails),
            "stands_on": list(e.stands_on), "profiles": list(e.profiles), "grade": e.grade, "reader": e.reader}
    if e.applies:
        spec["applies"] = dict(e.applies)
    return spec


def build(
    results: list[dict[str, Any]],
    environment: dict[str, str],
    run: dict[str, Any],
    tested: dict[str, list[str]],
    faults: dict[str, list[str]] | None = None,
    fault_run: dict[str, Any] | None = None,
    unfinished: frozenset[str] | set[str] = frozenset(),
) -> RunRecord:
    """The run record. ``faults``: claim ID -> the known faults that turn it red (the catalogue);
    ``fault_run``: the last ``python -m cheapinfer faults`` result, if there is one; ``unfinished``: the claims
    whose tests were selected but not finished when the run was interrupted (not "not selected")."""
    claims: dict[str, ClaimEntry] = {}
    for claim_id, claim in registry.load().items():
        mine = [r for r in results if r["claim"] == claim_id]
        if not mine and claim_id in tested:
            reason = INTERRUPTED_REASON if claim_id in unfinished else "its test was not selected in this run"
            mine = [{"claim": claim_id, "profile": "-", "device": "-", "verdict": NOT_RUN, "reason": reason, "measured": {}, "checks": []}]
        claims[claim_id] = {
            "section": claim.section,
            "statement": claim.statement,
            "book": dict(claim.book),
            "source": {k: _source_spec(v) for k, v in claim.source.items()},
            "units": dict(claim.units),
            "errata": [_erratum_spec(e) for e in claim.errata],
            "faults": list((faults or {}).get(claim_id, [])),
            "note": claim.note,
            "has_test": claim_id in tested,
            "verdict": overall(mine),
            "runs_on": list(claim.runs_on),
            "digits_on": list(claim.digits_on),
            "checks": [_check_spec(c) for c in claim.checks],
            "results": mine,
        }
    record: RunRecord = {
        "schema": RUN_SCHEMA,
        "suite": f"cheapinfer {__version__}",
        "created": run.get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run": run,
        "environment": environment,
        "summary": dict(Counter(c["verdict"] for c in claims.values())),
        "sections": {k: t for k, t in registry.SECTIONS.items() if any(c["section"] == k for c in claims.values())},
        "claims": claims,
    }
    if fault_run:
        record["fault_run"] = fault_run
    record["errata"] = errata.candidate_errata(record)
    record["text"] = author.text_record()
    return record


def writable_dir(path: Path) -> Path:
    """``path``, created if needed, once a file could be written in it; ValueError with the reason otherwise."""
    path = Path(path)
    if str(path) == "":
        raise ValueError("an empty path names no directory (it is not the current one)")
    refusal = why_not_a_directory(path)
    if refusal:
        raise ValueError(refusal)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the directory ({exc.strerror or exc})") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ValueError(f"cannot write in the directory ({exc.strerror or exc})") from None
    return path


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to the file descriptor ``fd`` (an OSError such as ENOSPC propagates)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _staged(path: Path, data: str | bytes) -> Path:
    """``data`` in a new temporary file beside ``path`` (removed again if writing it fails), ready to be renamed over it.

    The file gets the mode any file the user writes gets: 0666 less the umask (``open(..., "w")`` does the same).
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        try:
            _write_all(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


class PartlyWritten(OSError):
    """:func:`atomic_write` renamed some of its files into place, then failed: which were replaced, which were not."""

    def __init__(self, written: list[Path], unwritten: list[Path], cause: OSError):
        self.written, self.unwritten = written, unwritten
        super().__init__(cause.errno, f"{', '.join(map(str, written))} replaced, but {', '.join(map(str, unwritten))} not "
                                      f"({cause.strerror or cause}): the files no longer belong to one run")


def check_slots(outdir: Path) -> None:
    """ValueError unless every file a run writes into ``outdir`` can go where it goes: ``runs/`` a directory (or
    absent), ``run.json`` and ``errata.md`` regular files (or absent). Checked before any test runs."""
    from ..runtime.files import kind_of

    outdir = Path(outdir)
    runs = outdir / RUNS_DIR
    refusal = why_not_a_directory(runs) if runs.exists() or runs.is_symlink() else ""
    if refusal:
        raise ValueError(f"{runs}: {refusal}; this run's record could not be kept there")
    for name in (RECORD_NAME, ERRATA_NAME):
        kind = kind_of(outdir / name)
        if kind:
            raise ValueError(f"{outdir / name} is {kind}: the latest {name} could not be written there")


def atomic_write(*files: tuple[Path, str | bytes]) -> None:
    """Write each ``(path, data)`` to a temporary file beside ``path``, then rename them over their paths: readers
    see the old files or the new ones, never a part. On any failure (a full disk, an interrupt) before the
    renames, every temporary file is removed and no path is touched."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files:
            staged.append((_staged(Path(path), data), Path(path)))
        for i, (tmp, path) in enumerate(staged):
            try:
                os.replace(tmp, path)
            except OSError as exc:
                if i:
                    raise PartlyWritten([p for _, p in staged[:i]], [p for _, p in staged[i:]], exc) from None
                raise
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)  # already renamed, unless something failed


def _json(record: RunRecord) -> str:
    return json.dumps(record, indent=1, sort_keys=False, default=str) + "\n"


def _stamp(record: RunRecord) -> str:
    return str(record.get("created", "")).replace("-", "").replace(":", "") or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def new_run_id() -> str:
    """A run's identity: unique across processes, machines and PID namespaces (a pid repeats; this does not)."""
    return secrets.token_hex(6)


def keep(record: RunRecord, outdir: Path, benchmarks: Path | None = None) -> Path:
    """This run's own copy of the record, ``runs/<UTC stamp>-<run id>.json``: concurrent and repeated runs lose nothing.

    The run id is ``record["run"]["id"]`` (:func:`new_run_id` when there is none). ``benchmarks``: this run's
    pytest-benchmark JSON, copied beside the record (``runs/<same name>.benchmarks.json``, which the next run
    does not overwrite); ``record["run"]["benchmarks"]`` then names the copy, relative to ``outdir``.
    """
    outdir = Path(outdir)
    runs = outdir / RUNS_DIR
    runs.mkdir(parents=True, exist_ok=True)
    base = f"{_stamp(record)}-{record.get('run', {}).get('id') or new_run_id()}"
    path, n = runs / f"{base}.json", 1
    while path.exists():  # the same run id twice in one second (a record kept again)
        n += 1
        path = runs / f"{base}-{n}.json"
    if benchmarks is not None:
        copy = path.with_name(f"{path.stem}{BENCHMARKS_SUFFIX}")
        atomic_write((copy, Path(benchmarks).read_bytes()))
        record.setdefault("run", {})["benchmarks"] = str(copy.relative_to(outdir))
    atomic_write((path, _json(record)))
    return path


def own_record(outdir: Path, run_id: str) -> Path | None:
    """The record the run ``run_id`` kept in ``outdir`` (:func:`keep`; the last, if it was kept twice), or None."""
    runs = Path(outdir) / RUNS_DIR
    mine = [p for p in sorted(runs.glob(f"*-{run_id}.json")) + sorted(runs.glob(f"*-{run_id}-*.json")) if not p.name.endswith(BENCHMARKS_SUFFIX)]
    return mine[-1] if mine else None


def write(record: RunRecord, outdir: Path) -> tuple[Path, Path]:
    """The latest record and reports (``run.json``; ``errata.md``, the author's list; ``evidence.md``; ``errata.json``),
    replaced together: all are written in full before any is renamed into place, so a failure (a full disk) leaves
    the previous set as it was."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    rec, md = outdir / RECORD_NAME, outdir / ERRATA_NAME
    atomic_write((rec, _json(record)), (md, markdown(record)), (outdir / author.EVIDENCE_NAME, evidence_markdown(record)),
                 (outdir / author.JSON_NAME, json.dumps(author.json_entries(record), indent=1, ensure_ascii=False, default=str) + "\n"))
    return rec, md


# ----------------------------------------------------------------------------------------------
# per section and per claim
# ----------------------------------------------------------------------------------------------


def _book_cell(claim: ClaimEntry) -> str:
    units = claim.get("units", {})
    return "; ".join(f"{k} {tables.with_unit(v, units.get(k))}" for k, v in claim["book"].items()) or "—"


def _compact_rows(cid: str, claim: ClaimEntry) -> list[list[Any]]:
    if claim["verdict"] == NO_TEST or not claim["results"]:
        return [[cid, _book_cell(claim), "—", "—", tables.BADGE[NO_TEST], "—"]]
    rows = []
    for r in claim["results"]:
        where = "—" if r["profile"] == "-" else r["profile"] if r["device"] in ("-", "") else f"{r['profile']} ({r['device']})"
        checks = r.get("checks", [])
        if r["verdict"] == NOT_RUN or not checks:
            rows.append([cid, _book_cell(claim), "—", "—", tables.BADGE[r["verdict"]], where])
            continue
        seen: dict[str, Any] = {}
        for chk in checks:
            seen.setdefault(chk["q"], chk["measured"])
        measured = "; ".join(f"{q} {tables.with_unit(v, claim.get('units', {}).get(q))}" for q, v in seen.items())
        tolerance = "; ".join(chk["expected"] + tables.check_mark(chk) for chk in checks)
        verdict = tables.BADGE[r["verdict"]] + (" (perturbed)" if r.get("perturbed") else "")
        rows.append([cid, _book_cell(claim), measured, tolerance, verdict, where])
    # One claim, several profiles: name the claim and its book values once.
    return [row if i == 0 else ["", "", *row[2:]] for i, row in enumerate(rows)]


def _result_lines(claim_id: str, claim: ClaimEntry, r: ResultEntry) -> list[str]:
    head = f"- **{r['profile']}** on {r['device']}: {tables.BADGE[r['verdict']]}" if r["profile"] != "-" else f"- {tables.BADGE[r['verdict']]}"
    if r.get("perturbed"):
        head += " (book values perturbed on purpose with --perturb)"
    lines = [head]
    if r["verdict"] == NOT_RUN:
        lines.append(f"  - why: {r.get('reason') or 'unknown'}")
        return lines
    for chk in r.get("checks", []):
        status = "undecided" if chk.get("decided") is False else "ok" if chk["passed"] else "FAILS"
        role = "asserted" if chk["asserted"] else "reported"
        noise = f" ± {value_text(chk['se'])} ({tables.noise_words(chk)})" if chk.get("se") is not None else ""
        lines.append(f"  - `{chk['q']}`: measured {value_text(chk['measured'])}{noise}; expected {chk['expected']} — {status}, {role} ({chk['why']})")
    checked = {chk["q"] for chk in r.get("checks", [])}
    others = {k: v for k, v in r.get("measured", {}).items() if k not in checked}
    if others:
        lines.append("  - also measured: " + "; ".join(f"`{k}` {value_text(v)}" for k, v in others.items()))
    for note in r.get("notes", []):
        lines.append(f"  - note: {note}")
    for w in r.get("warnings", []):
        lines.append(f"  - library warning: {tables.code_span(w)}")
    if r.get("test"):
        lines.append(f"  - test: `{r['test']}`" + (f" ({fmt(r['seconds'])} s)" if r.get("seconds") else ""))
    for t in r.get("tables", []):
        lines.append("")
        lines.append(f"  *{t['title']}*")
        lines.append("")
        lines += ["  " + row for row in tables.markdown_table(t["header"], t["rows"])]
        lines.append("")
    for fig in r.get("figures", []):
        if lines[-1]:
            lines.append("")
        lines.append(f"  ![{claim_id} on {r['profile']}: {Path(fig).stem}]({fig})")
    return lines


def _figures(record: RunRecord) -> list[tuple[str, str, str]]:
    out = []
    for cid, c in record["claims"].items():
        for r in c["results"]:
            for fig in r.get("figures", []):
                out.append((fig, cid, r["profile"]))
    return out


def _head(record: RunRecord, title: str) -> list[str]:
    env = record["environment"]
    versions = ", ".join(f"{k} {env[k]}" for k in KEY_ENVIRONMENT[4:] if k in env)
    return [
        f"# {title}: Making inference cheap",
        "",
        f"Generated by {record['suite']} on {record['created']}. "
        f"Device: {record['run'].get('device', '?')}; CPU: {env.get('cpu', '?')}; GPU: {env.get('gpu', '?')}"
        f" (driver {env.get('driver', '?')}, CUDA {env.get('cuda', '?')}); {versions}.",
        "",
        "Verdicts: *reproduced* — the book's digits hold within the stated tolerance; *" + tables.BADGE[SHAPE_HOLDS] + "* — on a "
        "stand-in or twin model, where the book's digits cannot be expected, the claim's invariant holds: the book's measured numbers "
        "were not run and are not confirmed; *erratum* — a confirmed erratum: the book's digits fail as the registry documents, with "
        "evidence; *inconclusive* — the measurement could not decide (a margin within its noise, or a range it could not search "
        "further), never an erratum; *deviates* — a candidate erratum, or a regression of the libraries; *not run* — with "
        "the reason and what to do; *no test yet*.",
        "",
    ]


def _not_run_lines(record: RunRecord) -> list[str]:
    by_reason: dict[str, list[str]] = {}  # one line per reason: the claims that need the book's weights are one line
    for cid, c in record["claims"].items():
        for why in dict.fromkeys(r.get("reason") or "no reason recorded" for r in c.get("results", []) if r["verdict"] == NOT_RUN):
            by_reason.setdefault(why, []).append(cid)
    rows = [f"- **{', '.join(ids)}**{f' ({len(ids)} claims)' if len(ids) > 1 else ''}: {why}" for why, ids in by_reason.items()]
    untested = [cid for cid, c in record["claims"].items() if c["verdict"] == NO_TEST]
    rows += [f"- No test yet: {', '.join(untested)}."] if untested else []
    return ["## Not run", "", *rows, ""] if rows else []


def markdown(record: RunRecord) -> str:
    """errata.md, the author's list: summary, graded entries with their places, candidate errata, inconclusive, not run."""
    lines = [*_head(record, "Errata report"), "## Summary", "", *tables.summary_table(record), ""]
    lines += author.author_lines(record)
    lines += errata_sections.errata_lines(record)
    lines += errata_sections.inconclusive_lines(record)
    lines += _not_run_lines(record)
    lines += errata_sections.fault_lines(record) if record.get("fault_run") else [
        "## Fault coverage", "", "No faults run is recorded: `python -m cheapinfer faults` measures which claims each known fault turns red.", ""]
    lines += author.closing_lines(record)
    return "\n".join(lines)


def evidence_markdown(record: RunRecord) -> str:
    """evidence.md: each claim's evidence (anchored by its ID, lower case), the confirmed errata's, figures, environment."""
    env = record["environment"]
    lines = [*_head(record, "Evidence"), f"The author's list is in [{ERRATA_NAME}]({ERRATA_NAME}).", ""]
    lines += errata_sections.confirmed_lines(record)
    figures = _figures(record)
    if figures:
        lines += ["## Figures", ""]
        lines += [f"- [{Path(fig).name}]({fig}): {cid} on {profile}" for fig, cid, profile in figures]
        lines.append("")
    sections = tables.section_titles(record)
    by_section: dict[str, list[str]] = {}
    for cid, c in record["claims"].items():
        by_section.setdefault(c["section"], []).append(cid)
    for key in [*sections, *(k for k in by_section if k not in sections)]:
        if key not in by_section:
            continue
        ids = by_section[key]
        lines += [f"## {sections.get(key, key)}", ""]
        rows = [row for cid in ids for row in _compact_rows(cid, record["claims"][cid])]
        lines += [*tables.markdown_table(["claim", "book", "measured", "tolerance", "verdict", "profile"], rows), ""]
        untested = [cid for cid in ids if record["claims"][cid]["verdict"] == NO_TEST]
        for cid in ids:
            c = record["claims"][cid]
            if cid in untested:
                continue
            lines += [f'<a id="{author.anchor(cid)}"></a>', ""]
            lines.append(f"### {cid} — {tables.BADGE[c['verdict']]}")
            lines.append("")
            lines.append(f"> {c['statement']}")
            lines.append("")
            if c["book"]:
                units = c.get("units", {})
                lines.append("Book: " + "; ".join(
                    f"`{k}` = {tables.with_unit(v, units.get(k))}" + (f" ({tables.printed_text(c, k)})" if tables.printed_text(c, k) else "")
                    for k, v in c["book"].items()))
                lines.append("")
            if c.get("note"):
                lines += [c["note"], ""]
            for r in c["results"]:
                lines += _result_lines(cid, c, r)
            lines.append("")
        if untested:
            lines += ["No test yet:", ""]
            lines += [f"- **{cid}**: {record['claims'][cid]['statement']}" for cid in untested]
            lines.append("")
    lines += ["## Environment", "", *tables.markdown_table(["what", "value"], [[k, str(v)] for k, v in env.items()]), ""]
    lines += ["## Run", "", *tables.markdown_table(["what", "value"], [[k, str(v)] for k, v in record["run"].items()]), ""]
    return "\n".join(lines)
