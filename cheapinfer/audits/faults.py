"""Faults in the measured system: the suite's proof that a broken measurement turns a claim red.

Moving the book's value beyond its tolerance (``--perturb``) only proves the comparator. A fault here
breaks the *system the claim measures*, the way a real bug or a library regression would: a cache
that is silently not used, a batch run one request after another, a wrong scale or constant, a wrong
acceptance rule, a biased statistic. Each fault is a context manager that patches the measurement code
(never the registry, never a test), and names the claims it is expected to turn red.

``python -m cheapinfer faults`` runs every fault (``pytest --fault NAME``, selecting its target claims
with ``--claims``) and prints a fault x claim table; it fails when a fault leaves every one of its target
claims green, and names the claims that no known fault turns red. By default it sweeps: each run of a
fault stops at its first red claim (:func:`run`); ``--all-targets`` runs every claim a fault names.
``pytest --fault NAME`` runs the suite with one fault active: its claims should deviate. Such a run keeps its
own record (``runs/``, marked with the fault) and replaces neither the latest ``run.json`` nor ``errata.md``;
the runner reads each fault run's kept record.

A fault is written and registered as :mod:`cheapinfer.faults.base` says.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from .. import __version__
from ..faults.core import Fault, activate, catalogue, inapplicable, last_run, targeted_by  # noqa: F401  (activate, targeted_by: the catalogue's, named here too)
from ..harness.registry import clocked_claims, slow_claims
from ..harness.schema import FAULT_SCHEMA, FAULTS_NAME, FaultRecord, RecordError, read_record
from ..harness.vocabulary import ALL_TARGETS, NOT_REACHED, RED, SWEEP, is_harness_error
from ..runtime.files import kind_of
from .forks import clear_halt, halt

#: ``--timeout``: below this, starting pytest and importing torch alone would "time out" every fault.
MIN_TIMEOUT = 5.0

# ------------------------------------------------------------------------------------------------
# the runner: python -m cheapinfer faults
# ------------------------------------------------------------------------------------------------


class FaultRun(NamedTuple):
    """One run of one fault: each claim's verdict, and for each claim it judged, its checks that failed and held."""

    verdicts: dict[str, str]
    checks: dict[str, dict[str, list[str]]]


def checks_of(claim: Mapping[str, Any]) -> dict[str, list[str]]:
    """A record claim's checks by outcome over its results (profiles): ``failed`` where any result failed the check,
    ``held`` where every result that judged it passed. A check is named as the record states it (``expected``)."""
    outcome: dict[str, bool] = {}
    for result in claim.get("results", []):
        for check in result.get("checks", []) if result.get("test") else ():
            name = check.get("expected") or check["q"]
            outcome[name] = outcome.get(name, True) and bool(check["passed"])
    return {"failed": sorted(n for n, ok in outcome.items() if not ok), "held": sorted(n for n, ok in outcome.items() if ok)}


def _run_one(fault: Fault, claims: tuple[str, ...], outdir: Path, timeout: float, threads: int | None = None,
             stop: bool = False) -> FaultRun:
    """Run the tests of ``claims`` with ``fault`` active; the verdict of each claim, and its checks by outcome.

    ``threads``: torch threads of the pytest process (``None``: its default). ``stop``: stop after the first
    claim that deviates (``--stop-on-red``); the claims after it are ``not reached``.
    """
    from ..harness.vocabulary import DEVIATES
    from .launch import run_claims

    outdir.mkdir(parents=True, exist_ok=True)
    got = run_claims(claims, outdir, fault=fault.name, threads=threads, timeout=timeout, stop_on_red=stop,
                     pytest_args=["--no-header", "-r", "N", "--benchmark-disable", "--benchmark-json", str(outdir / "benchmarks.json")])
    code, tail = got.exit_status, got.tail
    if code is None:
        return FaultRun({cid: f"timed out after {timeout:.0f} s" for cid in claims}, {})
    try:
        if got.record_path is None:
            raise OSError(f"no record kept in {outdir}")
        record = read_record(got.record_path)
    except RecordError as exc:
        return FaultRun({cid: f"no well-formed record ({exc}; pytest exit {code}: {tail})" for cid in claims}, {})
    except (OSError, ValueError):
        return FaultRun({cid: f"no record (pytest exit {code}: {tail})" for cid in claims}, {})
    out, checks = {}, {}
    for cid in claims:
        claim = record["claims"].get(cid, {})
        results = [r for r in claim.get("results", []) if r.get("test")]  # the placeholder of an unselected test has none
        if any(r["verdict"] == DEVIATES for r in results):
            out[cid] = RED
        elif any(is_harness_error(r) for r in results):
            out[cid] = "error: " + next(r["reason"] for r in results if is_harness_error(r))
        elif not results and stop:
            out[cid] = NOT_REACHED
        else:
            out[cid] = claim.get("verdict", "absent")
        if results:
            checks[cid] = checks_of(claim)
    return FaultRun(out, checks)


def uncovered() -> list[str]:
    """Claims that no known fault names as turning them red (every claim has its test: ``tests/test_registry.py``)."""
    from ..harness import registry

    named = {cid for f in catalogue().values() for cid in f.targets}
    return [cid for cid in registry.load() if cid not in named]


def declared_checks() -> dict[str, list[tuple[str, str]]]:
    """Each fault that a registry check names as its ``fault``: the (claim, check as the record states it) that name it."""
    from ..harness import registry

    out: dict[str, list[tuple[str, str]]] = {}
    for cid, claim in registry.load().items():
        for check in claim.checks:
            if check.fault:
                out.setdefault(check.fault, []).append((cid, check.describe(claim.book)))
    return out


def toothless(declared: Mapping[str, Sequence[tuple[str, str]]], faults: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The checks that did not fail under the fault they name, run by run (``FAULT_RULE``): each with the fault, the run
    (from 1) and whether it ``held`` or was ``not judged`` (its claim not run to it, errored, or without the check).
    Pure: ``faults`` is a fault record's ``faults``; a fault the sweep did not run is passed over."""
    out = []
    for name, checks in declared.items():
        for i, run in enumerate(faults.get(name, {}).get("checks", [])):
            for cid, check in checks:
                got = run.get(cid, {})
                if check not in got.get("failed", ()):
                    out.append({"claim": cid, "check": check, "fault": name, "run": i + 1,
                                "status": "held" if check in got.get("held", ()) else "not judged"})
    return out


#: One fault run: (the fault's name, the run's index, the claims it runs).
Job = tuple[str, int, tuple[str, ...]]


def plan(targets: Mapping[str, Sequence[str]], runs: int, clocked: set[str], slow: set[str], last_seconds: Mapping[str, float],
         all_targets: bool = False) -> tuple[list[Job], list[str]]:
    """The counted phase's jobs, in the order they start, and the faults that have a clocked claim (the alone phase's).

    ``targets``: each fault's target claims; ``clocked``: claims whose test reads a clock; ``slow``: claims with a
    slow test; ``last_seconds``: each fault's seconds in the last fault run. In the sweep the counted phase runs
    each fault's unclocked claims; with ``all_targets``, every claim of each fault that has no clocked claim. Longest
    first, so that no long fault starts last: by the last run's seconds where there is one, else the faults whose
    claims have a slow test first. Pure: the runner and its tests share it.
    """
    quiet = [n for n, t in targets.items() if set(t) & clocked]
    if all_targets:
        first = [(n, i, tuple(t)) for n, t in targets.items() if n not in quiet for i in range(runs)]
    else:
        first = [(n, i, a) for n, t in targets.items() for i in range(runs) if (a := tuple(c for c in t if c not in clocked))]
    first.sort(key=lambda job: (-float(last_seconds.get(job[0], 0) or 0), not set(job[2]) & slow))
    return first, quiet


def alone_jobs(targets: Mapping[str, Sequence[str]], quiet: Sequence[str], runs: int, clocked: set[str], caught: Callable[[str, int], bool],
               all_targets: bool = False, must: Mapping[str, set[str]] | None = None) -> list[Job]:
    """The alone phase, chosen after the counted one: the clocked claims of each fault's runs that no counted claim
    caught (``caught(fault, run)``), and in every run the clocked claims ``must`` names for the fault (a check of theirs
    names it: :func:`toothless`); with ``all_targets``, every claim of every fault with a clocked claim."""
    if all_targets:
        return [(n, i, tuple(targets[n])) for n in quiet for i in range(runs)]
    must = must or {}
    jobs = [(n, i, tuple(c for c in targets[n] if c in clocked and (not caught(n, i) or c in must.get(n, ())))) for n in quiet for i in range(runs)]
    return [job for job in jobs if job[2]]


def run(names: list[str], runs: int, outdir: Path, timeout: float = 600.0, echo: Callable[[str], None] = print, workers: int = 2,
        all_targets: bool = False) -> FaultRecord:
    """Run each fault ``runs`` times; the fault x claim results, as written to ``faults.json`` (a :class:`~cheapinfer.harness.schema.FaultRecord`).

    The sweep (default) asks of each fault what the catalogue promises of every fault: that it turns a
    claim red in every run. Each run tries the fault's unclocked claims first, ``workers`` faults at a
    time with one torch thread each, stopping at the first red claim (``--stop-on-red``); only a fault
    that none of them caught goes on to its clocked claims, run one fault at a time on the quiet
    machine, so that load from a neighbour can never be what turned a timing claim red.

    ``all_targets``: every claim a fault names is run in every run (the per-claim coverage the registry's
    fault lists state); a fault naming a clocked claim then runs alone, after the others.
    """
    import tempfile
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    faults = catalogue()
    clocked = clocked_claims()
    started = time.time()
    not_applicable = {n: why for n in names if (why := inapplicable(faults[n]))}
    for n, why in not_applicable.items():
        echo(f"{'n/a':<7} {n}: not run: it {why}")
    names = [n for n in names if n not in not_applicable]
    declared = declared_checks()
    must = {n: {cid for cid, _ in declared.get(n, ())} for n in names}  # claims run to the end: a check names the fault
    per_run: dict[str, list[dict[str, str]]] = {n: [{} for _ in range(runs)] for n in names}
    per_checks: dict[str, list[dict[str, dict[str, list[str]]]]] = {n: [{} for _ in range(runs)] for n in names}
    seconds: dict[str, float] = {n: 0.0 for n in names}
    alone_ran: dict[str, bool] = {n: False for n in names}
    lock = threading.Lock()

    def step(name: str, i: int, claims: tuple[str, ...], tmp: str, alone: bool, phase: str) -> None:
        t0 = time.time()
        stop = not all_targets and not set(claims) & must[name]
        run, checks = _run_one(faults[name], claims, Path(tmp) / f"{name}-{i}-{phase}", timeout, threads=None if alone else 1, stop=stop)
        with lock:
            per_run[name][i].update(run)
            per_checks[name][i].update(checks)
            seconds[name] += time.time() - t0
            alone_ran[name] |= alone
            red = [cid for cid, v in run.items() if v == RED]
            echo(f"  {name} (run {i + 1}, {'alone' if alone else 'beside another'}): "
                 f"{'red: ' + ', '.join(red) if red else 'nothing red'} ({time.time() - t0:.0f} s)")

    def caught(name: str, i: int) -> bool:
        return any(v == RED for v in per_run[name][i].values())

    targets = {n: faults[n].targets for n in names}
    last = (last_run(outdir) or {}).get("faults", {})
    first, quiet = plan(targets, runs, clocked, slow_claims(), {n: f.get("seconds", 0) for n, f in last.items()}, all_targets)
    clear_halt()
    with tempfile.TemporaryDirectory(prefix="cheapinfer-faults-") as tmp:
        pool = ThreadPoolExecutor(max_workers=max(1, workers))
        try:
            list(pool.map(lambda job: step(*job, tmp, False, "counted"), first))
            for job in alone_jobs(targets, quiet, runs, clocked, caught, all_targets, must):
                step(*job, tmp, True, "clocked")
        except BaseException:  # SIGTERM (faults_cli), Ctrl-C: the running fault runs end now, before the folder goes
            halt()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    results: dict[str, Any] = {}
    for n in names:
        f = faults[n]
        for i, r in enumerate(per_run[n]):
            by = [cid for cid in f.targets if r.get(cid) == RED]
            # A claim the sweep never ran, or stopped before: another claim had already caught the fault.
            skipped = f"{NOT_REACHED}: caught by {by[0]} first" if by else "not run"
            per_run[n][i] = {cid: r[cid] if r.get(cid) not in (None, NOT_REACHED) else skipped for cid in f.targets}
        hits = [any(v == RED for v in r.values()) for r in per_run[n]]
        results[n] = {
            "section": f.section, "kind": f.kind, "what": f.what, "targets": list(f.targets), "clocked": alone_ran[n],
            "runs": per_run[n], "caught": sum(hits), "seconds": round(seconds[n], 1), "checks": per_checks[n],
        }
        by = sorted({cid for r in per_run[n] for cid, v in r.items() if v == RED})
        echo(f"{'caught' if all(hits) else 'MISSED':<7} {n}: red in {sum(hits)} of {runs} run(s)"
             f"{' by ' + ', '.join(by) if by else ''} ({results[n]['seconds']:.0f} s{', alone' if alone_ran[n] else ''})")
    held = toothless(declared, results)
    for t in held:
        echo(f"TOOTHLESS {t['claim']}: {t['check']} {t['status']} under its own fault {t['fault']} (run {t['run']})")
    return {
        "schema": FAULT_SCHEMA,
        "suite": f"cheapinfer {__version__}",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
        "mode": ALL_TARGETS if all_targets else SWEEP,
        "seconds": round(time.time() - started, 1),
        "faults": results,
        "uncovered": uncovered(),
        "toothless": held,
        "not_applicable": not_applicable,
    }


def table(result: FaultRecord) -> list[str]:
    """The fault x claim table (Markdown): for each fault and target claim, red in k of n runs."""
    from ..harness.tables import markdown_table

    n = result["runs"]
    rows = []
    for name, r in result["faults"].items():
        for cid in r["targets"]:
            red = sum(run.get(cid) == RED for run in r["runs"])
            other = sorted({v for run in r["runs"] for v in [run.get(cid, "absent")] if v != RED})
            rows.append([name, r["kind"], cid, f"red {red}/{n}" + (f" (else: {'; '.join(other)})" if other else "")])
    return markdown_table(["fault", "kind", "claim", "verdict under the fault"], rows)


def teeth_table(result: FaultRecord) -> list[str]:
    """The checks that name their fault (Markdown): for each, whether it failed under that fault, run by run."""
    from ..harness.tables import markdown_table

    rows = []
    for name, checks in declared_checks().items():
        runs = result["faults"].get(name, {}).get("checks")
        for cid, check in checks if runs else ():
            failed = sum(check in run.get(cid, {}).get("failed", ()) for run in runs)
            rows.append([f"{cid}: `{check}`", name, f"failed {failed}/{len(runs)}"])
    return markdown_table(["check", "its fault", "under it"], rows) if rows else []


def faults_main(p, args) -> int:
    """``cheapinfer faults`` after its arguments are parsed: the usage checks, the sweep, the table, faults.json."""
    import json

    from ..harness.store import atomic_write

    faults = catalogue()
    unknown = [n for n in args.names if n not in faults]
    if unknown:
        p.error(f"no such fault: {', '.join(unknown)} (see --list)")
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if args.list:
        for f in faults.values():
            print(f"{f.name}  [{f.section}, {f.kind}] -> {', '.join(f.targets)}\n    {f.what}")
        print(f"{len(faults)} faults; claims no known fault turns red: {', '.join(uncovered()) or 'none'}")
        return 0
    from ..harness.store import writable_dir

    try:  # before the sweep: a folder that cannot take faults.json would throw the finished sweep away
        writable_dir(args.report_dir)
    except ValueError as exc:
        p.error(f"--report-dir {args.report_dir}: {exc}")
    if kind_of(args.report_dir / FAULTS_NAME):
        p.error(f"--report-dir {args.report_dir}: {args.report_dir / FAULTS_NAME} is {kind_of(args.report_dir / FAULTS_NAME)}, so faults.json cannot be written")
    if args.timeout < MIN_TIMEOUT:
        p.error(f"--timeout {args.timeout:g}: at least {MIN_TIMEOUT:g} s (starting pytest and loading a claim's model alone take seconds)")
    result = run(args.names or list(faults), args.runs, args.report_dir, args.timeout, echo=lambda line: print(line, flush=True),
                 workers=args.workers, all_targets=args.all_targets)
    if result["faults"]:
        print()
        print("\n".join(table(result)))
    missed = [n for n, r in result["faults"].items() if r["caught"] < args.runs]
    print(f"\n{len(result['faults'])} faults run, {args.runs} run(s) each ({result['mode']}), {result['seconds']:.0f} s: "
          f"{len(result['faults']) - len(missed)} caught in every run" + (f"; MISSED: {', '.join(missed)}" if missed else "")
          + (f"; not applicable here (not run): {', '.join(result['not_applicable'])}" if result.get("not_applicable") else "") + ".")
    print(f"Claims no known fault turns red: {', '.join(result['uncovered']) or 'none'}")
    teeth = teeth_table(result)
    if teeth:
        print("\n" + "\n".join(teeth))
    print(f"Checks that held or went unjudged under the fault they name: "
          f"{', '.join(sorted({t['claim'] + ': ' + t['check'] for t in result.get('toothless', [])})) or 'none'}")
    target, text = args.report_dir / FAULTS_NAME, json.dumps(result, indent=1) + "\n"
    try:
        args.report_dir.mkdir(parents=True, exist_ok=True)
        atomic_write((target, text))
    except OSError as exc:  # a full disk after the sweep: one line; the previous faults.json is untouched, the sweep kept aside
        from ..harness.store import keep_aside

        previous = "the previous one is as it was" if target.exists() else "nothing was written there"
        kept = keep_aside(target, text, "this sweep's record")
        print(f"cheapinfer faults: error: cannot write {target} ({exc.strerror or exc}); {previous}; {kept}", file=sys.stderr)
        return 1
    print(f"written: {target}")
    return 1 if missed or result.get("toothless") else 0
