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
from . import registry
from .record import ALL_TARGETS, NOT_REACHED, RED
from .record import overall
from .registry import DEVIATES, ERRATUM, INCONCLUSIVE, NO_TEST, NOT_RUN, REPRODUCED, SHAPE_HOLDS, VERDICTS, fmt

RECORD_NAME = "run.json"
ERRATA_NAME = "errata.md"
#: Every run's own record, ``<report dir>/runs/<UTC stamp>-<run id>.json``, beside the latest ``run.json``.
RUNS_DIR = "runs"
#: A run's pytest-benchmark JSON beside its own record: ``runs/<UTC stamp>-<run id>.benchmarks.json``.
BENCHMARKS_SUFFIX = ".benchmarks.json"
#: The run id ``python -m cheapinfer verify`` gives its pytest, which names that run's record with it.
RUN_ID_VARIABLE = "CHEAPINFER_RUN_ID"
SCHEMA = 1
#: The environment entries a reader needs to compare two runs, in the order the report shows them.
KEY_ENVIRONMENT = ("cpu", "gpu", "driver", "cuda", "torch", "transformers", "bitsandbytes", "gguf")


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


def _erratum_spec(e: registry.Erratum | None) -> dict[str, Any] | None:
    if e is None:
        return None
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
) -> dict[str, Any]:
    """The run record. ``faults``: claim ID -> the known faults that turn it red (the catalogue);
    ``fault_run``: the last ``python -m cheapinfer faults`` result, if there is one."""
    claims = {}
    for claim_id, claim in registry.load().items():
        mine = [r for r in results if r["claim"] == claim_id]
        if not mine and claim_id in tested:
            mine = [{"claim": claim_id, "profile": "-", "device": "-", "verdict": NOT_RUN, "reason": "its test was not selected in this run", "measured": {}, "checks": []}]
        claims[claim_id] = {
            "section": claim.section,
            "statement": claim.statement,
            "book": dict(claim.book),
            "source": {k: _source_spec(v) for k, v in claim.source.items()},
            "units": dict(claim.units),
            "erratum": _erratum_spec(claim.erratum),  # the first of errata, as records before several per claim had it
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
    record = {
        "schema": SCHEMA,
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
    record["errata"] = candidate_errata(record)
    return record


def writable_dir(path: Path) -> Path:
    """``path``, created if needed, once a file could be written in it; ValueError with the reason otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError("it is a file, not a directory")
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


def atomic_write(*files: tuple[Path, str | bytes]) -> None:
    """Write each ``(path, data)`` to a temporary file beside ``path``, then rename them over their paths: readers
    see the old files or the new ones, never a part. On any failure (a full disk, an interrupt) before the
    renames, every temporary file is removed and no path is touched."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files:
            staged.append((_staged(Path(path), data), Path(path)))
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)  # already renamed, unless something failed


def _json(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=1, sort_keys=False, default=str) + "\n"


def _stamp(record: dict[str, Any]) -> str:
    return str(record.get("created", "")).replace("-", "").replace(":", "") or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def new_run_id() -> str:
    """A run's identity: unique across processes, machines and PID namespaces (a pid repeats; this does not)."""
    return secrets.token_hex(6)


def keep(record: dict[str, Any], outdir: Path, benchmarks: Path | None = None) -> Path:
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


def write(record: dict[str, Any], outdir: Path) -> tuple[Path, Path]:
    """The latest record and errata report (``run.json``, ``errata.md``), replaced together: both are written in
    full before either is renamed into place, so a failure (a full disk) leaves the previous pair as it was."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    rec, md = outdir / RECORD_NAME, outdir / ERRATA_NAME
    atomic_write((rec, _json(record)), (md, markdown(record)))
    return rec, md


def load(path: Path) -> dict[str, Any]:
    """A run record from ``run.json`` or from the report directory holding it."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_NAME
    return json.loads(path.read_text(encoding="utf-8"))


_BADGE = {REPRODUCED: "reproduced", SHAPE_HOLDS: "shape holds", ERRATUM: "erratum (confirmed)", INCONCLUSIVE: "inconclusive",
          DEVIATES: "**DEVIATES**", NOT_RUN: "not run", NO_TEST: "no test yet"}


def _value(v: Any) -> str:
    return fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(_value(c)) for c in row) + " |" for row in rows]
    return out


def _sections(record: dict[str, Any]) -> dict[str, str]:
    """Section key -> title, from the record (older records without it: the registry's titles)."""
    return record.get("sections") or dict(registry.SECTIONS)


def summary_table(record: dict[str, Any]) -> list[str]:
    counts: dict[str, Counter] = {}
    for c in record["claims"].values():
        counts.setdefault(c["section"], Counter())[c["verdict"]] += 1
    rows = []
    for key, title in _sections(record).items():
        if key in counts:
            rows.append([title] + [counts[key].get(v, 0) for v in VERDICTS] + [sum(counts[key].values())])
    total = Counter(c["verdict"] for c in record["claims"].values())
    rows.append(["**all**"] + [total.get(v, 0) for v in VERDICTS] + [sum(total.values())])
    return markdown_table(["section", *VERDICTS, "claims"], rows)


def machine_label(env: dict[str, Any]) -> str:
    """A run's machine in one line: GPU (or CPU) name and the library versions that decide verdicts."""
    hw = env.get("gpu") if env.get("gpu") not in (None, "", "none") else env.get("cpu", "unknown CPU")
    libs = ", ".join(f"{k} {env[k]}" for k in ("torch", "transformers", "bitsandbytes") if k in env)
    return f"{hw} ({libs})" if libs else str(hw)


# ----------------------------------------------------------------------------------------------
# candidate errata
# ----------------------------------------------------------------------------------------------


def _code(text: Any) -> str:
    """Inline code that survives backticks inside ``text``."""
    text = str(text)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _conclusion(r: dict[str, Any], failures: list[dict[str, Any]]) -> str:
    if any(f.get("stale") for f in failures):
        return (
            "A confirmed erratum no longer holds: the book's digits reproduce here. Either a library or the setup changed "
            "(compare with a run on the pinned versions), or the erratum was wrong: revise its registry entry."
        )
    if r.get("perturbed"):
        return (
            "The book's values were moved beyond their tolerance on purpose (`--perturb`): this entry shows "
            "that the check can fail. It is not an erratum."
        )
    if any(f["kind"] == "digits" for f in failures):
        measured = "; ".join(f"{f['q']} = {_value(f['measured'])}" for f in failures if f["kind"] == "digits")
        return (
            f"The book's number does not hold on the {r['profile']} profile, where its digits are expected. "
            f"If the environment below matches the book's setup, the sentence is a candidate erratum and should give "
            f"the measured value ({measured}). If a library changed since the pinned versions, compare with a run on "
            "the pinned versions (`python -m cheapinfer compare`) before filing it."
        )
    return (
        f"The chapter's qualitative conclusion does not hold on the {r['profile']} profile ({r['device']}). Either the "
        "claim does not carry over to this model or device (the book should say where it holds), or a library update "
        "changed the behaviour: compare with a run on the pinned versions (`python -m cheapinfer compare`)."
    )


def candidate_errata(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per result with a failed asserted check: what was measured, how, what a reader should conclude.

    Results deviating because their book values were perturbed on purpose come last.
    """
    out = []
    for cid, c in record["claims"].items():
        for r in c["results"]:
            if r["verdict"] != DEVIATES:
                continue  # a confirmed erratum is listed under "Errata", with its evidence
            failures = [
                {**{k: chk[k] for k in ("q", "kind", "measured", "expected", "why")}, "stale": bool(chk.get("documented"))}
                for chk in r.get("checks", [])
                if chk["asserted"] and (not chk["passed"]) != bool(chk.get("documented"))
            ]
            if failures:
                out.append(
                    {
                        "claim": cid,
                        "profile": r["profile"],
                        "device": r["device"],
                        "test": r.get("test", ""),
                        "perturbed": bool(r.get("perturbed")),
                        "failures": failures,
                        "notes": list(r.get("notes", [])),
                        "conclusion": _conclusion(r, failures),
                    }
                )
    return sorted(out, key=lambda e: e["perturbed"])


def confirmed_errata(record: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any], list[dict[str, Any]]]]:
    """(claim ID, claim, erratum, results) for every documented erratum that held in this run: the results
    with verdict erratum on one of its profiles, where a check it documents failed as documented."""
    out = []
    for cid, c in record["claims"].items():
        for e in registry.recorded_errata(c):
            rs = [r for r in c.get("results", []) if r["verdict"] == ERRATUM and r["profile"] in e["profiles"]
                  and any(chk.get("documented") and chk["q"] in e["fails"] for chk in r.get("checks", []))]
            if rs:
                out.append((cid, c, e, rs))
    return out


def _printed(claim: dict[str, Any], key: str) -> str:
    src = claim.get("source", {}).get(key)
    if not src:
        return ""
    if src["kind"] == "derived":
        return f"derived: {src['text']}"
    return f'{"printed" if src["kind"] == "printed" else "read from"} "{src["text"]}"'


def _confirmed_lines(record: dict[str, Any]) -> list[str]:
    found = confirmed_errata(record)
    if not found:
        return []
    lines = [
        "## Errata",
        "",
        "Confirmed errata: the registry documents each one, the suite measured it again in this run, and the book's "
        "digits failed exactly as documented. They keep CI green; the day the digits reproduce, the claim turns red. "
        "Each has a grade: " + "; ".join(f"*{g}*, {d}" for g, d in registry.GRADES.items()) + ".",
        "",
        "| grade | errata |",
        "|---|---|",
        *(f"| {g} | {sum(1 for _, _, e, _ in found if e.get('grade', 'erratum') == g)} |" for g in registry.GRADES),
        "",
    ]
    for cid, c, e, rs in found:
        units = c.get("units", {})
        lines += [f"### {cid} ({e.get('grade', 'erratum')})", "", f"> {c['statement']}", ""]
        stands = "; ".join(f"`{k}` = {_with_unit(c['book'][k], units.get(k))} ({_printed(c, k) or 'no source'})" for k in e["stands_on"])
        lines.append(f"- **The book says:** {e['says']} It stands on: {stands}.")
        lines.append(f"- **What holds instead:** {e['holds']}")
        lines.append(f"- **Under which assumption the book's number would hold:** {e['assumption']}")
        if e.get("reader"):
            lines.append(f"- **For readers:** {e['reader']}")
        if e.get("applies"):
            env = record.get("environment", {})
            on = ", ".join(f"{lib} {spec} (this run: {env.get(lib, '?')})" for lib, spec in e["applies"].items())
            lines.append(f"- **Holds on:** {on}; on other releases the book's digits are asserted.")
        for r in rs:
            for chk in r.get("checks", []):
                if chk.get("documented") and chk["q"] in e["fails"]:
                    lines.append(f"- **Evidence** ({r['profile']}, {r['device']}): `{chk['q']}` measured {_value(chk['measured'])}, the book's `{chk['expected']}` fails ({chk['why']}).")
            others = [f"`{chk['q']}` {_value(chk['measured'])}" for chk in r.get("checks", []) if not chk.get("documented") and chk["asserted"]]
            if others:
                lines.append(f"- **Still holds** ({r['profile']}): " + "; ".join(others) + ".")
            if r.get("test"):
                lines.append(f"- **Test:** `{r['test']}`")
        lines.append("")
    return lines


def _load_text(load: dict[str, Any] | None) -> str:
    if not load:
        return "not recorded"
    avg = lambda v: "/".join(f"{x:g}" for x in v) if v else "?"  # noqa: E731
    steal = load.get("steal_fraction")
    return (f"load average {avg(load.get('loadavg_before'))} before, {avg(load.get('loadavg_after'))} after, on {load.get('cpus', '?')} CPUs; "
            f"CPU steal {'?' if steal is None else f'{steal:.1%}'}")


def _noise_words(chk: dict[str, Any]) -> str:
    """How a noisy check's standard error was estimated, in words (a record without the kind: over the rounds)."""
    return registry.NOISE_WORDS.get(chk.get("noise") or "rounds", "standard error")


def _inconclusive_lines(record: dict[str, Any]) -> list[str]:
    """Results the measurement could not decide: each undecided check with its numbers, the load, and what to do.

    Not candidate errata: the noise or the range, not the book, decided nothing."""
    rows = [(cid, r) for cid, c in record["claims"].items() for r in c.get("results", []) if r["verdict"] == INCONCLUSIVE]
    if not rows:
        return []
    lines = ["## Inconclusive", "",
             "Measurements that could not decide. No candidate errata: a margin within the measurement's noise, a "
             "search that ran out of range, or a device that cannot measure the claim's premise says nothing about the book.", ""]
    for cid, r in rows:
        lines += [f"### {cid} on {r['profile']} ({r['device']})", ""]
        for chk in r.get("checks", []):
            if chk.get("decided") is not False:
                continue
            if chk.get("measurable"):
                why = r.get("measured", {}).get(f"{chk['q']}_why") or "see the measured values"
                lines.append(f"- `{chk['q']}`: this device cannot measure it: {why}. **To do:** measure on a device where it can.")
            elif chk.get("searched"):
                ranges = "; ".join(f"`{k}` = {_value(v)}" for k, v in r.get("measured", {}).items() if "searched" in k) or "see the measured values"
                lines.append(f"- `{chk['q']}`: not found in the range this device could afford ({ranges}). **To do:** search further "
                             "on a device with more memory or time.")
            else:
                se, m, bound = chk.get("se"), chk.get("measured"), chk.get("bound")
                numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (se, m, bound))
                margin = registry.margin_text(abs(m - bound) / se) if numbers and se else "?"
                lines.append(f"- `{chk['q']}`: measured {_value(m)} ± {_value(se)} ({_noise_words(chk)}); expected "
                             f"`{chk['expected']}`: the margin is {margin} standard errors, fewer than the {_value(chk.get('sigmas'))} needed "
                             "to decide. **To do:** run on a quieter machine, or with more rounds.")
        lines.append(f"- **Load:** {_load_text(r.get('load'))}.")
        if r.get("test"):
            lines.append(f"- **Test:** `{r['test']}`")
        lines.append("")
    return lines


def _fault_lines(record: dict[str, Any]) -> list[str]:
    claims = record["claims"]
    tested = [cid for cid, c in claims.items() if c.get("has_test")]
    if not any(c.get("faults") for c in claims.values()):
        return []
    lines = ["## Fault coverage", "",
             "Each known fault breaks the measured system (not the registry) the way a real bug would; the claims it names "
             "must turn red (`python -m cheapinfer faults`).", ""]
    last = record.get("fault_run")
    rows = []
    for cid in tested:
        names = claims[cid].get("faults", [])
        if not names:
            continue
        seen = []
        for n in names:
            f = (last or {}).get("faults", {}).get(n)
            if f:
                red = sum(run.get(cid) == RED for run in f["runs"])
                skipped = sum(str(run.get(cid, "")).startswith(NOT_REACHED) for run in f["runs"])
                seen.append(f"{n} (red {red}/{len(f['runs'])}" + (f", not reached in {skipped}: caught first by another claim" if skipped else "") + ")")
            else:
                seen.append(f"{n} (not run)")
        rows.append([cid, "; ".join(seen)])
    lines += markdown_table(["claim", "faults that turn it red (last faults run)"], rows)
    lines.append("")
    bare = [cid for cid in tested if not claims[cid].get("faults")]
    lines.append("Claims that no known fault turns red: " + (", ".join(bare) if bare else "none") + ".")
    if last:
        mode = last.get("mode", ALL_TARGETS)  # a record from before the sweep ran every target
        how = ("every claim each fault names was run" if mode == ALL_TARGETS
               else "the sweep: each run of a fault stopped at its first red claim, unclocked claims first")
        caught = sum(f.get("caught") == last.get("runs") for f in last.get("faults", {}).values())
        lines.append(f"Last faults run: {last.get('created', '?')}, {last.get('runs', '?')} run(s) of each of {len(last.get('faults', {}))} faults "
                     f"({how}); {caught} caught in every run.")
    lines.append("")
    return lines


def _errata_lines(record: dict[str, Any]) -> list[str]:
    errata = candidate_errata(record)
    if not errata:
        return []
    lines = ["## Candidate errata", ""]
    for e in errata:
        c = record["claims"][e["claim"]]
        title = f"### {e['claim']} on {e['profile']} ({e['device']})" + (" — perturbed on purpose" if e["perturbed"] else "")
        lines += [title, "", f"> {c['statement']}", ""]
        for f in e["failures"]:
            if f.get("stale"):
                lines.append(f"- **Measured:** `{f['q']}` = {_value(f['measured'])} now meets `{f['expected']}`, which the registry documents as an erratum.")
            else:
                lines.append(f"- **Measured:** `{f['q']}` = {_value(f['measured'])}; the claim is `{f['expected']}` ({f['why']}).")
        how = f"- **How:** on the {e['profile']} profile, {e['device']}"
        lines.append(how + (f", by `{e['test']}`." if e["test"] else "."))
        for note in e["notes"]:
            lines.append(f"- **Note:** {note}")
        lines.append(f"- **Conclusion:** {e['conclusion']}")
        lines.append("")
    return lines


# ----------------------------------------------------------------------------------------------
# per section and per claim
# ----------------------------------------------------------------------------------------------


def _with_unit(value: Any, unit: str | None) -> str:
    if not unit:
        return _value(value)
    return f"{_value(value)}{unit}" if unit in ("x", "%") else f"{_value(value)} {unit}"


def _book_cell(claim: dict[str, Any]) -> str:
    units = claim.get("units", {})
    return "; ".join(f"{k} {_with_unit(v, units.get(k))}" for k, v in claim["book"].items()) or "—"


def _compact_rows(cid: str, claim: dict[str, Any]) -> list[list[Any]]:
    if claim["verdict"] == NO_TEST or not claim["results"]:
        return [[cid, _book_cell(claim), "—", "—", _BADGE[NO_TEST], "—"]]
    rows = []
    for r in claim["results"]:
        where = "—" if r["profile"] == "-" else r["profile"] if r["device"] in ("-", "") else f"{r['profile']} ({r['device']})"
        checks = r.get("checks", [])
        if r["verdict"] == NOT_RUN or not checks:
            rows.append([cid, _book_cell(claim), "—", "—", _BADGE[r["verdict"]], where])
            continue
        seen: dict[str, Any] = {}
        for chk in checks:
            seen.setdefault(chk["q"], chk["measured"])
        measured = "; ".join(f"{q} {_with_unit(v, claim.get('units', {}).get(q))}" for q, v in seen.items())
        tolerance = "; ".join(chk["expected"] + ("" if chk["asserted"] else " (reported)" if chk["passed"] else " (reported, misses)") + ("" if chk["passed"] or not chk["asserted"] else " **fails**") for chk in checks)
        verdict = _BADGE[r["verdict"]] + (" (perturbed)" if r.get("perturbed") else "")
        rows.append([cid, _book_cell(claim), measured, tolerance, verdict, where])
    # One claim, several profiles: name the claim and its book values once.
    return [row if i == 0 else ["", "", *row[2:]] for i, row in enumerate(rows)]


def _result_lines(claim_id: str, claim: dict[str, Any], r: dict[str, Any]) -> list[str]:
    head = f"- **{r['profile']}** on {r['device']}: {_BADGE[r['verdict']]}" if r["profile"] != "-" else f"- {_BADGE[r['verdict']]}"
    if r.get("perturbed"):
        head += " (book values perturbed on purpose with --perturb)"
    lines = [head]
    if r["verdict"] == NOT_RUN:
        lines.append(f"  - why: {r.get('reason') or 'unknown'}")
        return lines
    for chk in r.get("checks", []):
        status = "undecided" if chk.get("decided") is False else "ok" if chk["passed"] else "FAILS"
        role = "asserted" if chk["asserted"] else "reported"
        noise = f" ± {_value(chk['se'])} ({_noise_words(chk)})" if chk.get("se") is not None else ""
        lines.append(f"  - `{chk['q']}`: measured {_value(chk['measured'])}{noise}; expected {chk['expected']} — {status}, {role} ({chk['why']})")
    checked = {chk["q"] for chk in r.get("checks", [])}
    others = {k: v for k, v in r.get("measured", {}).items() if k not in checked}
    if others:
        lines.append("  - also measured: " + "; ".join(f"`{k}` {_value(v)}" for k, v in others.items()))
    for note in r.get("notes", []):
        lines.append(f"  - note: {note}")
    for w in r.get("warnings", []):
        lines.append(f"  - library warning: {_code(w)}")
    if r.get("test"):
        lines.append(f"  - test: `{r['test']}`" + (f" ({fmt(r['seconds'])} s)" if r.get("seconds") else ""))
    for t in r.get("tables", []):
        lines.append("")
        lines.append(f"  *{t['title']}*")
        lines.append("")
        lines += ["  " + row for row in markdown_table(t["header"], t["rows"])]
        lines.append("")
    for fig in r.get("figures", []):
        if lines[-1]:
            lines.append("")
        lines.append(f"  ![{claim_id} on {r['profile']}: {Path(fig).stem}]({fig})")
    return lines


def _figures(record: dict[str, Any]) -> list[tuple[str, str, str]]:
    out = []
    for cid, c in record["claims"].items():
        for r in c["results"]:
            for fig in r.get("figures", []):
                out.append((fig, cid, r["profile"]))
    return out


def markdown(record: dict[str, Any]) -> str:
    env = record["environment"]
    versions = ", ".join(f"{k} {env[k]}" for k in KEY_ENVIRONMENT[4:] if k in env)
    lines = [
        "# Errata report: Making inference cheap",
        "",
        f"Generated by {record['suite']} on {record['created']}. "
        f"Device: {record['run'].get('device', '?')}; CPU: {env.get('cpu', '?')}; GPU: {env.get('gpu', '?')}"
        f" (driver {env.get('driver', '?')}, CUDA {env.get('cuda', '?')}); {versions}.",
        "",
        "Verdicts: *reproduced* — the book's digits hold within the stated tolerance; *shape holds* — the "
        "claim's invariant holds on a model or device where the digits cannot be expected (digits reported beside); "
        "*erratum* — a confirmed erratum: the book's digits fail as the registry documents, with evidence; "
        "*inconclusive* — the measurement could not decide (a margin within its noise, or a range it could not search "
        "further), never an erratum; *deviates* — a candidate erratum, or a regression of the libraries; *not run* — with "
        "the reason and what to do; *no test yet*.",
        "",
        "## Summary",
        "",
        *summary_table(record),
        "",
    ]
    lines += _confirmed_lines(record)
    lines += _errata_lines(record)
    lines += _inconclusive_lines(record)
    lines += _fault_lines(record)
    figures = _figures(record)
    if figures:
        lines += ["## Figures", ""]
        lines += [f"- [{Path(fig).name}]({fig}): {cid} on {profile}" for fig, cid, profile in figures]
        lines.append("")
    sections = _sections(record)
    by_section: dict[str, list[str]] = {}
    for cid, c in record["claims"].items():
        by_section.setdefault(c["section"], []).append(cid)
    for key in [*sections, *(k for k in by_section if k not in sections)]:
        if key not in by_section:
            continue
        ids = by_section[key]
        lines += [f"## {sections.get(key, key)}", ""]
        rows = [row for cid in ids for row in _compact_rows(cid, record["claims"][cid])]
        lines += [*markdown_table(["claim", "book", "measured", "tolerance", "verdict", "profile"], rows), ""]
        untested = [cid for cid in ids if record["claims"][cid]["verdict"] == NO_TEST]
        for cid in ids:
            c = record["claims"][cid]
            if cid in untested:
                continue
            lines.append(f"### {cid} — {_BADGE[c['verdict']]}")
            lines.append("")
            lines.append(f"> {c['statement']}")
            lines.append("")
            if c["book"]:
                units = c.get("units", {})
                lines.append("Book: " + "; ".join(
                    f"`{k}` = {_with_unit(v, units.get(k))}" + (f" ({_printed(c, k)})" if _printed(c, k) else "")
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
    lines += ["## Environment", "", *markdown_table(["what", "value"], [[k, str(v)] for k, v in env.items()]), ""]
    lines += ["## Run", "", *markdown_table(["what", "value"], [[k, str(v)] for k, v in record["run"].items()]), ""]
    return "\n".join(lines)
