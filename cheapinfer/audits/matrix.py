"""The suite checks its own verdicts on one machine: on other CPU kernels, and under load.

Machines of one kind can carry different CPUs (one with AMX, one with AVX-512 BF16 only, one without
AVX-512), so the kernels a claim runs on, their rounding and their speed differ. A verdict must depend on
the book, not on which of them ran it. Two checks, both run by ``python -m cheapinfer verify``:

``--isa-matrix`` runs the kernel-dependent claims (:func:`isa_claims`) once per kernel family
(:data:`FAMILIES`), each family a pytest run of its own under caps that make this CPU dispatch like a
smaller one (``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``), with its own
report directory (``<report dir>/isa/<family>/``). Before each run a small probe (:data:`PROBE`, with
oneDNN's and MKL's verbose output on) records what actually ran, so that a cap that silently did nothing
is reported, not trusted (:func:`cap_check`); the run's own record says which ATen kernels it used
(``environment.cpu_capability``). It writes a claim x family table (``isa/matrix.md``, ``isa/matrix.json``),
each cell the verdict and its deciding value (:func:`deciding`). A claim that is green in one family and
deviates (or errs) in another is a *flip* (:func:`flips`): the command exits 1 and names each.
*Inconclusive* in one family is allowed: it decides nothing.

``--stress N`` runs the clocked claims (:func:`cheapinfer.harness.registry.clocked_claims`) once on the quiet machine
(or reads ``--quiet-record``), then again beside N CPU-bound processes (:func:`busy`), and prints, per
claim, the quiet and the stressed verdict and the machine's load around each (:func:`moved`). A claim that
is green (or inconclusive) quietly and deviates under stress exits 1: load must never be what turns a
claim red. *Inconclusive* under stress is allowed, and counted.

The pure parts (the table, the flips, the moved verdicts, the probe's parsing and the cap check) take
records and text and are tested on made-up ones (``tests/test_matrix.py``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import CHECKOUT
from ..harness import registry
from ..harness.compare import shape_bounds
from ..harness.numbers import fmt
from ..harness.schema import ClaimEntry, ResultEntry
from ..harness.store import atomic_write
from ..harness.tables import machine_label, markdown_table
from ..harness.vocabulary import BREAKABLE, DEVIATES, ERRATUM, INCONCLUSIVE, NOT_RUN, PASSING, is_harness_error
from . import families as kernel_families
from .launch import ClaimsRun, Interrupted, Runner, child_environment, interruptible, run_claims

ROOT = CHECKOUT

# ----------------------------------------------------------------------------------------------
# which claims
# ----------------------------------------------------------------------------------------------


def isa_claims() -> list[str]:
    """The claims whose verdict can depend on the CPU's kernels, in the book's order: the clocked ones
    (their speed) and every claim measured on a model (its numbers come from the kernels' rounding:
    ``profiles.device_dependent``, the ``-m gpu`` selection), with a test. The book profile is left out of that
    test (it needs weights this suite cannot fetch; a claim measured only there would be *not run* in every
    family); its results in each run are skipped with their reason."""
    from ..runtime.profiles import device_dependent

    return [cid for cid, c in registry.load().items()
            if c.timing == registry.CLOCKED or device_dependent(set(c.runs_on) - {"book"})]


def stress_claims() -> list[str]:
    """The clocked claims (``timing = "clocked"`` in the registry), in the book's order."""
    return [cid for cid, c in registry.load().items() if c.timing == registry.CLOCKED]


def select(wanted: str | None, allowed: list[str], what: str) -> list[str]:
    """``--claims ID,ID`` within ``allowed`` (all of it when None); ValueError, one line, for an unknown ID or one outside."""
    if wanted is None:
        return list(allowed)
    ids = [c.strip() for c in wanted.split(",") if c.strip()]
    unknown = [c for c in ids if c not in registry.load()]
    if unknown or not ids:
        raise ValueError(f"no such claim ID: {', '.join(unknown) or '(none given)'}")
    outside = [c for c in ids if c not in allowed]
    if outside:
        raise ValueError(f"{', '.join(outside)}: not {what}")
    return [c for c in allowed if c in ids]


# ----------------------------------------------------------------------------------------------
# cells, the table, flips, moved verdicts (pure: records in, data out)
# ----------------------------------------------------------------------------------------------


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def deciding(result: ResultEntry, claim: ClaimEntry) -> dict[str, Any] | None:
    """The check that decided ``result``'s verdict, with its value: the failed one (deviates), the undecided one
    (inconclusive), the documented one (erratum); for a pass, the check closest to its bound (the first to flip)."""
    checks = [c for c in result.get("checks", []) if c.get("asserted")]
    if not checks:
        return None
    verdict = result["verdict"]
    if verdict == DEVIATES:
        pick = [c for c in checks if not c["passed"] and c.get("decided", True) and not c.get("documented")]
    elif verdict == INCONCLUSIVE:
        pick = [c for c in checks if c.get("decided") is False]
    elif verdict == ERRATUM:
        pick = [c for c in checks if c.get("documented")]
    else:
        def margin(c: dict[str, Any]) -> float:  # to the nearer side of a range
            bounds, m = shape_bounds(c["q"], claim, result["profile"]), _num(c.get("measured"))
            if not bounds or m is None:
                return float("inf")
            return min(abs(m - bound) / abs(bound) if bound else abs(m - bound) for _, bound in bounds)

        pick = sorted(checks, key=margin)
    c = (pick or checks)[0]
    out = {"profile": result["profile"], "q": c["q"], "measured": c.get("measured"), "expected": c.get("expected", "")}
    if c.get("se") is not None:
        out["se"] = c["se"]
    return out


def cell(claim: ClaimEntry | None) -> dict[str, Any]:
    """One claim of one run: its verdict (``error`` when its test raised before one), the deciding value, and the
    reason of a *not run*. ``claim``: the claim's entry in a run record (None: the run has no record)."""
    if claim is None:
        return {"verdict": "no record"}
    results = [r for r in claim.get("results", []) if r.get("profile") != "-"]
    verdict = claim["verdict"]
    if verdict == NOT_RUN:
        errored = [r for r in results if is_harness_error(r)]
        reason = (errored or results or claim.get("results") or [{}])[0].get("reason", "")
        return {"verdict": "error" if errored else NOT_RUN, "reason": reason}
    shown = next((r for r in results if r["verdict"] == verdict), None)
    out: dict[str, Any] = {"verdict": verdict}
    if shown is not None:
        out.update(deciding(shown, claim) or {"profile": shown["profile"]})
        if shown.get("load"):
            out["load"] = shown["load"]
    return out


def cell_text(c: dict[str, Any]) -> str:
    """A cell as one line: verdict, then the deciding value (or the reason)."""
    verdict = c["verdict"]
    head = f"**{verdict}**" if verdict in (DEVIATES, "error", "no record") else verdict
    if "q" in c:
        se = f" ± {_short(c['se'])}" if c.get("se") is not None else ""
        expected = str(c.get("expected", ""))
        expected = expected[len(c["q"]):].strip() if expected.startswith(c["q"]) else expected
        return f"{head}: {c['q']} {_short(c['measured'])}{se}" + (f" ({expected})" if expected else "") + f" [{c['profile']}]"
    if c.get("reason"):
        reason = c["reason"] if len(c["reason"]) <= 90 else c["reason"][:87] + "..."
        return f"{head}: {reason}"
    return head


def short_value(v: Any) -> str:
    return fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v)


def _short(v: Any) -> str:
    """A measured value in a cell: three significant digits (the record keeps all of them)."""
    return f"{v:.3g}" if isinstance(v, float) else short_value(v)


def table(records: dict[str, dict[str, Any] | None], claims: list[str], unavailable: dict[str, str] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Claim -> family -> cell. ``records``: family -> its run record (None: it wrote none); ``unavailable``: family ->
    why it cannot run here (its cells say *not available here*)."""
    unavailable = unavailable or {}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for cid in claims:
        row = {}
        for fam, rec in records.items():
            if fam in unavailable:
                row[fam] = {"verdict": "not available here", "reason": unavailable[fam]}
            else:
                row[fam] = cell(rec["claims"].get(cid) if rec is not None else None)
        out[cid] = row
    return out


def flips(tab: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The claims green in one family and red in another (deviates, or its test raised before a verdict).

    *Inconclusive*, *not run* and *not available here* flip nothing: they decide nothing."""
    out = []
    for cid, row in tab.items():
        green = {fam: c for fam, c in row.items() if c["verdict"] in PASSING}
        red = {fam: c for fam, c in row.items() if c["verdict"] in (DEVIATES, "error")}
        if green and red:
            out.append({"claim": cid, "green": green, "red": red})
    return out


def flip_line(flip: dict[str, Any]) -> str:
    side = lambda cells: "; ".join(f"{fam}: {cell_text(c)}" for fam, c in cells.items())  # noqa: E731
    return f"FLIP {flip['claim']}: green on {', '.join(flip['green'])}, red on {', '.join(flip['red'])} ({side(flip['green'])} | {side(flip['red'])})"


#: How a claim's verdict moved from the quiet run to the stressed one.
SAME, RED_UNDER_STRESS, INCONCLUSIVE_UNDER_STRESS, CHANGED = "same", "RED under stress", "inconclusive under stress", "changed"


def moved(quiet: dict[str, Any], stressed: dict[str, Any], claims: list[str]) -> list[dict[str, Any]]:
    """Per claim: the quiet and the stressed cell and how the verdict moved. *RED under stress*: green or
    inconclusive quietly (compare's breakable verdicts), deviates or errs under stress, a failure; *inconclusive
    under stress*: green quietly, undecided under stress, allowed."""
    rows = []
    for cid in claims:
        q, s = cell(quiet["claims"].get(cid)), cell(stressed["claims"].get(cid))
        if s["verdict"] in (DEVIATES, "error", "no record") and q["verdict"] in BREAKABLE:
            how = RED_UNDER_STRESS
        elif q["verdict"] == s["verdict"]:
            how = SAME
        elif q["verdict"] in PASSING and s["verdict"] == INCONCLUSIVE:
            how = INCONCLUSIVE_UNDER_STRESS
        else:
            how = CHANGED
        rows.append({"claim": cid, "quiet": q, "stressed": s, "moved": how})
    return rows


def load_span(record: dict[str, Any], claims: list[str]) -> dict[str, Any]:
    """The 1-minute load average over a run's results of ``claims`` (lowest and highest, before and after each
    test), and the highest CPU steal: the ``load`` every result keeps."""
    avgs, steal = [], []
    for cid in claims:
        for r in record["claims"].get(cid, {}).get("results", []):
            ld = r.get("load") or {}
            avgs += [v[0] for v in (ld.get("loadavg_before"), ld.get("loadavg_after")) if v]
            if ld.get("steal_fraction") is not None:
                steal.append(ld["steal_fraction"])
    return {"loadavg_1min": [min(avgs), max(avgs)] if avgs else None, "steal_max": max(steal) if steal else None,
            "cpus": next((r.get("load", {}).get("cpus") for c in claims for r in record["claims"].get(c, {}).get("results", []) if r.get("load")), None)}


def load_text(span: dict[str, Any]) -> str:
    avg = span.get("loadavg_1min")
    steal = span.get("steal_max")
    return (f"load average (1 min) {avg[0]:g} to {avg[1]:g}" if avg else "load not recorded") + (
        f" on {span['cpus']} CPUs" if span.get("cpus") else "") + (f", CPU steal up to {steal:.1%}" if steal is not None else "")


# ----------------------------------------------------------------------------------------------
# the Markdown
# ----------------------------------------------------------------------------------------------

#: The first line of ``isa/matrix.md``.
MATRIX_MARK = "<!-- claims x CPU kernel families, written by python -m cheapinfer verify --isa-matrix -->"


def matrix_markdown(m: dict[str, Any]) -> str:
    fams = list(m["families"])
    lines = [MATRIX_MARK, "# Claims x CPU kernel families", "",
             f"{m['created']}, {m['machine']}; {len(m['claims'])} claims; {m['seconds']:.0f} s. Each family is its own pytest run, "
             "under caps that make this CPU dispatch like a smaller one; *cap* says what the probe saw run.", "", "## Families", ""]
    lines += markdown_table(["family", "stands for", "caps", "cap", "pytest exit", "seconds", "record"], [
        [name, f["like"], ", ".join(f"{k}={v}" for k, v in f["caps"].items()) or "none",
         f.get("unavailable") and f"not available here: {f['unavailable']}" or f["cap"]["text"],
         f.get("exit_status", "-"), f.get("seconds", "-"), f.get("record") or "-"]
        for name, f in m["families"].items()])
    lines += ["", "## Claims", "", "Each cell: the verdict, then its deciding value (the failed or undecided check; for a pass, "
              "the check closest to its bound) and the profile it was measured on.", ""]
    lines += markdown_table(["claim", *fams], [[cid, *(cell_text(row[f]) for f in fams)] for cid, row in m["claims"].items()])
    lines += ["", "## Flips", ""]
    if m["flips"]:
        lines += [f"- {flip_line(f)}" for f in m["flips"]]
    else:
        lines.append("None: no claim is green in one family and red in another.")
    lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# running: each family, the quiet and the stressed run
# ----------------------------------------------------------------------------------------------

def claims_run(report_dir: Path, claims: list[str], env: dict[str, str], pytest_args: Sequence[str], runner: Runner | None) -> ClaimsRun:
    """One pytest run of ``claims`` into ``report_dir`` (:func:`cheapinfer.audits.launch.run_claims`, in the foreground);
    :class:`~cheapinfer.audits.launch.Interrupted` when Ctrl-C ended it (nothing more starts)."""
    got = run_claims(claims, report_dir, env=env, pytest_args=pytest_args, runner=runner)
    if got.interrupted:
        raise Interrupted(f"its record so far: {got.record_path}" if got.record_path else "it recorded nothing")
    return got


def isa_matrix(claims: list[str], families: list[str], report_dir: Path, pytest_args: Sequence[str] = (), runner: Runner | None = None,
               echo: Callable[[str], None] = print, base_env: dict[str, str] | None = None, prog: str = "cheapinfer isa") -> dict[str, Any]:
    """Run ``claims`` under each of ``families`` and build the matrix (as written to ``isa/matrix.json``)."""
    base_env = child_environment(base_env)
    started = time.monotonic()
    own = kernel_families.probe(kernel_families.family_env(kernel_families.FAMILIES["default"], base_env))
    out_families: dict[str, Any] = {}
    records: dict[str, dict[str, Any] | None] = {}
    unavailable: dict[str, str] = {}
    for name in families:
        fam = kernel_families.FAMILIES[name]
        info: dict[str, Any] = {"like": fam.like, "caps": dict(fam.caps)}
        out_families[name] = info
        why = kernel_families.available(fam, own)
        if why:
            info["unavailable"] = unavailable[name] = why
            records[name] = None
            echo(f"{prog}: {name}: not available here ({why})")
            continue
        env = kernel_families.family_env(fam, base_env)
        found = own if not fam.caps else kernel_families.probe(env)
        info["probe"] = found
        echo(f"{prog}: {name} ({', '.join(f'{k}={v}' for k, v in fam.caps.items()) or 'no cap'}): "
             f"{len(claims)} claim(s) into {report_dir / name}")
        got = claims_run(report_dir / name, claims, env, pytest_args, runner)
        records[name] = got.record
        info.update(record=str(got.record_path) if got.record_path else None, exit_status=got.exit_status, seconds=got.seconds)
        info["cap"] = kernel_families.cap_check(fam, found, (got.record or {}).get("environment"), own)
        info["ran_environment"] = {k: (got.record or {}).get("environment", {}).get(k) for k in ("cpu_capability", "cpu_isa_caps")}
        echo(f"{prog}: {name}: {info['cap']['text']}")
    tab = table(records, claims, unavailable)
    # The machine as its own kernels describe it (a capped run's environment names its caps).
    env = next((r["environment"] for name, r in sorted(records.items(), key=lambda kv: kv[0] != "default") if r), {})
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_label(env) if env else "?",
        "environment": env,
        "seconds": round(time.monotonic() - started, 1),
        "families": out_families,
        "claims": tab,
        "flips": flips(tab),
    }


# ----------------------------------------------------------------------------------------------
# the commands (called by python -m cheapinfer verify)
# ----------------------------------------------------------------------------------------------


def guarded(prog: str, body: Callable[[], int]) -> int:
    """``body()``, with Ctrl-C and SIGTERM as one line and exit 130 / 143 (the running pytest and the busy
    processes are stopped on the way out): :func:`cheapinfer.audits.launch.interruptible`."""

    def say(how: str, kept: str | None) -> str:
        if how == "interrupted":
            return f"{prog}: interrupted; {kept + '; ' if kept else ''}nothing more was run and no summary was written"
        return f"{prog}: {how}; the running claims run was stopped; no summary was written"

    return interruptible(body, say)


def isa_main(claims: list[str], families: list[str], report_dir: Path, pytest_args: Sequence[str] = (), runner: Runner | None = None,
             prog: str = "cheapinfer isa") -> int:
    """``cheapinfer isa``: 0 when no claim flips, 1 when one does (or a family wrote no record). Each family's claims run
    gets ``pytest_args`` and starts through ``runner`` (default :func:`cheapinfer.audits.launch.run_interruptibly`)."""

    def body() -> int:
        m = isa_matrix(claims, families, report_dir, pytest_args, runner, prog=prog)
        md, js = report_dir / "matrix.md", report_dir / "matrix.json"
        atomic_write((md, matrix_markdown(m)), (js, json.dumps(m, indent=1, default=str) + "\n"))
        print()
        print(matrix_markdown(m).split("\n## Claims\n", 1)[1].split("\n## Flips\n", 1)[0].strip())
        print()
        for name, f in m["families"].items():
            print(f"{name}: " + (f"not available here ({f['unavailable']})" if f.get("unavailable") else f"{f['cap']['text']} ({f['seconds']:.0f} s)"))
        untrusted = [n for n, f in m["families"].items() if f.get("cap", {}).get("in_effect") is False]
        norecord = [n for n, f in m["families"].items() if not f.get("unavailable") and m["claims"] and
                    all(row[n]["verdict"] == "no record" for row in m["claims"].values())]
        for line in map(flip_line, m["flips"]):
            print(line)
        for n in untrusted:
            print(f"WARNING: {n}: the cap was not seen to take effect (its line above says why); its column is not trusted as an {n} CPU's verdicts")
        for n in norecord:
            print(f"NO RECORD: {n}: its claims run wrote no record (pytest exit {m['families'][n]['exit_status']})")
        ran_families = [n for n, f in m["families"].items() if not f.get("unavailable")]
        print(f"{len(m['claims'])} claim(s) x {len(ran_families)} famil{'y' if len(ran_families) == 1 else 'ies'} "
              f"({', '.join(ran_families)}), {m['seconds']:.0f} s: {len(m['flips'])} flip(s).")
        print(f"Matrix: {md} and {js}")
        return 1 if m["flips"] or norecord else 0

    return guarded(prog, body)
