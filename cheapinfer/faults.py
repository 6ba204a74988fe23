"""Faults in the measured system: the suite's proof that a broken measurement turns a claim red.

Moving the book's value beyond its tolerance (``--perturb``) only proves the comparator. A fault here
breaks the *system the claim measures*, the way a real bug or a library regression would: a cache
that is silently not used, a batch run one request after another, a wrong scale or constant, a wrong
acceptance rule, a biased statistic. Each fault is a context manager that patches the measurement code
(never the registry, never a test), and names the claims it is expected to turn red.

``python -m cheapinfer faults`` runs every fault (``pytest --fault NAME``, selecting its target claims
with ``--claims``) and prints a fault x claim table; it fails when a fault leaves every one of its target
claims green, and names the claims that no known fault turns red. ``pytest --fault NAME`` runs the suite
with one fault active: its claims should deviate.

A fault is registered with :func:`fault`::

    @fault("kv-decode-ignores-cache", section="KV", kind=DISABLED, targets=("KV-DECODE-FLAT",),
           what="the decode step drops the cache it is given and recomputes the whole history")
    def _():
        with patched(kv, "decode_step", broken_decode_step):
            yield
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator
from unittest import mock

DISABLED = "disabled optimisation"
CONSTANT = "wrong constant"
RULE = "wrong rule"
STATISTIC = "wrong statistic"
KINDS = (DISABLED, CONSTANT, RULE, STATISTIC)


@dataclass(frozen=True)
class Fault:
    name: str
    section: str
    kind: str
    what: str  # the realistic bug, in one sentence
    targets: tuple[str, ...]  # the claims it is expected to turn red
    activate: Callable[[], ContextManager[None]]


FAULTS: dict[str, Fault] = {}


def fault(name: str, *, section: str, kind: str, targets: tuple[str, ...], what: str):
    """Register the decorated generator (patch, ``yield``, restore) as the fault ``name``."""
    if kind not in KINDS:
        raise ValueError(f"fault {name}: kind must be one of {KINDS}")
    if not targets:
        raise ValueError(f"fault {name}: names no claim it turns red")

    def register(gen: Callable[[], Iterator[None]]) -> Callable[[], Iterator[None]]:
        if name in FAULTS:
            raise ValueError(f"fault {name} registered twice")
        FAULTS[name] = Fault(name, section, kind, what, tuple(targets), contextlib.contextmanager(gen))
        return gen

    return register


def patched(target: Any, attribute: str, replacement: Any) -> ContextManager[Any]:
    """``target.attribute`` replaced for the duration; the attribute must exist (a renamed function
    must not leave a fault silently inert)."""
    if not hasattr(target, attribute):
        raise AttributeError(f"fault patches {getattr(target, '__name__', target)}.{attribute}, which does not exist")
    return mock.patch.object(target, attribute, replacement)


def catalogue() -> dict[str, Fault]:
    """Every registered fault, by name (importing the catalogue's modules registers them)."""
    from . import fault_catalogue  # noqa: F401  (registers on import)

    return dict(FAULTS)


def activate(name: str) -> ContextManager[None]:
    faults = catalogue()
    if name not in faults:
        raise KeyError(f"no such fault: {name} (python -m cheapinfer faults --list)")
    return faults[name].activate()


def targeted_by(claim_id: str) -> list[str]:
    """The faults that name ``claim_id`` as a claim they turn red."""
    return [f.name for f in catalogue().values() if claim_id in f.targets]


# ------------------------------------------------------------------------------------------------
# the runner: python -m cheapinfer faults
# ------------------------------------------------------------------------------------------------

RED = "red"
RESULT_NAME = "faults.json"


def _run_one(fault: Fault, outdir: Path, timeout: float, threads: int | None = None) -> dict[str, str]:
    """Run ``fault``'s target claims with the fault active; the verdict of each target claim.

    ``threads``: torch threads of the pytest process (``None``: its default).
    """
    import os
    import subprocess
    import sys

    from . import report
    from .registry import DEVIATES, NOT_RUN

    root = _root()
    outdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pytest", str(root / "claims"), "-q", "-p", "no:cacheprovider", "--no-header", "-r", "N",
        "--fault", fault.name, "--claims", ",".join(fault.targets), "--report-dir", str(outdir),
        "--benchmark-disable", "--benchmark-json", str(outdir / "benchmarks.json"),
    ]
    try:
        env = {**os.environ, **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {})}
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {cid: f"timed out after {timeout:.0f} s" for cid in fault.targets}
    try:
        record = report.load(outdir)
    except (OSError, ValueError):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        return {cid: f"no record (pytest exit {proc.returncode}: {tail[0]})" for cid in fault.targets}
    out = {}
    for cid in fault.targets:
        claim = record["claims"].get(cid, {})
        results = claim.get("results", [])
        if any(r["verdict"] == DEVIATES for r in results):
            out[cid] = RED
        elif any(r["verdict"] == NOT_RUN and str(r.get("reason", "")).startswith("error before a verdict") for r in results):
            out[cid] = "error: " + next(r["reason"] for r in results if r["verdict"] == NOT_RUN)
        else:
            out[cid] = claim.get("verdict", "absent")
    return out


def _root() -> Path:
    from pathlib import Path

    return Path(__file__).resolve().parent.parent


def uncovered() -> list[str]:
    """Claims with a test that no known fault names as turning them red."""
    from . import registry
    from .record import tested_ids

    named = {cid for f in catalogue().values() for cid in f.targets}
    tested = tested_ids(_root() / "claims")
    return [cid for cid in registry.load() if cid in tested and cid not in named]


#: What marks a claim test as reading a clock: a timing fixture it asks for, or a clock it calls.
_CLOCK_FIXTURES = {"timed", "step_times", "benchmark"}
_CLOCK_CALLS = ("perf_counter", "time.time(", "monotonic", "timing.", "interleaved(")


def clocked_claims(claims_dir: Path | None = None) -> set[str]:
    """Claims whose test reads a clock: their verdict can depend on the machine's load.

    Found in the tests' source (``claims/test_*.py``): a test marked ``@pytest.mark.claim(ID)`` that asks
    for a timing fixture or calls a clock. A fault naming one of these runs alone; the others run two
    at a time (:func:`run`), since what they measure is a count, a token or a byte, not a time.
    """
    import ast

    out: set[str] = set()
    for path in sorted(Path(claims_dir or _root() / "claims").glob("test_*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef):
                continue
            ids = [d.args[0].value for d in node.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                   and d.func.attr == "claim" and d.args and isinstance(d.args[0], ast.Constant)]
            body = ast.get_source_segment(source, node) or ""
            if ids and ({a.arg for a in node.args.args} & _CLOCK_FIXTURES or any(c in body for c in _CLOCK_CALLS)):
                out.update(ids)
    return out


def run(names: list[str], runs: int, outdir: Path, timeout: float = 600.0, echo: Callable[[str], None] = print, workers: int = 2) -> dict[str, Any]:
    """Run each fault ``runs`` times; the fault x claim results, as written to ``faults.json``.

    Faults whose claims read no clock run ``workers`` at a time, each pytest with one torch thread;
    then the faults naming a clocked claim run one at a time on the quiet machine, so that load from
    a neighbour can never be what turned a timing claim red.
    """
    import tempfile
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    faults = catalogue()
    clocked = clocked_claims()
    started = time.time()
    results: dict[str, Any] = {}

    def one(name: str, tmp: str, alone: bool) -> None:
        f = faults[name]
        t0 = time.time()
        per_run = [_run_one(f, Path(tmp) / f"{name}-{i}", timeout, threads=None if alone else 1) for i in range(runs)]
        caught = [any(v == RED for v in r.values()) for r in per_run]
        results[name] = {
            "section": f.section, "kind": f.kind, "what": f.what, "targets": list(f.targets), "clocked": alone,
            "runs": per_run, "caught": sum(caught), "seconds": round(time.time() - t0, 1),
        }
        echo(f"{'caught' if all(caught) else 'MISSED':<7} {name}: red in {sum(caught)} of {runs} run(s) ({results[name]['seconds']:.0f} s{'' if alone else ', beside another'})")

    quiet = [n for n in names if set(faults[n].targets) & clocked]
    counted = [n for n in names if n not in quiet]
    with tempfile.TemporaryDirectory(prefix="cheapinfer-faults-") as tmp:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(lambda n: one(n, tmp, False), counted))
        for name in quiet:
            one(name, tmp, True)
    results = {n: results[n] for n in names}
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
        "seconds": round(time.time() - started, 1),
        "faults": results,
        "uncovered": uncovered(),
    }


def last_run(report_dir: Path) -> dict[str, Any] | None:
    """The last ``faults`` result written into ``report_dir``, if it is one (else None)."""
    import json

    path = report_dir / RESULT_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("faults"), dict) and all(
        isinstance(f, dict) and isinstance(f.get("runs"), list) and isinstance(f.get("targets"), list) for f in data["faults"].values()
    )
    return data if ok else None


def table(result: dict[str, Any]) -> list[str]:
    """The fault x claim table (Markdown): for each fault and target claim, red in k of n runs."""
    from .report import markdown_table

    n = result["runs"]
    rows = []
    for name, r in result["faults"].items():
        for cid in r["targets"]:
            red = sum(run.get(cid) == RED for run in r["runs"])
            other = sorted({v for run in r["runs"] for v in [run.get(cid, "absent")] if v != RED})
            rows.append([name, r["kind"], cid, f"red {red}/{n}" + (f" (else: {'; '.join(other)})" if other else "")])
    return markdown_table(["fault", "kind", "claim", "verdict under the fault"], rows)


def faults_cli(argv: list[str]) -> int:
    import argparse
    import json
    import os
    from pathlib import Path

    p = argparse.ArgumentParser(
        prog="cheapinfer faults",
        description="Inject each known fault into the measured system and check that it turns its claims red. Exit 1 when a fault goes unnoticed in any run.",
    )
    p.add_argument("names", nargs="*", metavar="FAULT", help="faults to run (default: all)")
    p.add_argument("--runs", type=int, default=1, help="runs of each fault (default 1; a fault must be caught in every run)")
    p.add_argument("--list", action="store_true", help="list the faults and the claims each must turn red, and exit")
    p.add_argument("--report-dir", type=Path, default=_root() / "reports", help="where faults.json is written (default reports/)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one fault run may take (default 600)")
    p.add_argument("--workers", type=int, default=2, help="faults whose claims read no clock run this many at a time (default 2); the others always run alone")
    args = p.parse_args(argv)
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
    if args.report_dir.exists() and not args.report_dir.is_dir():
        p.error(f"--report-dir {args.report_dir} is a file, not a directory")
    result = run(args.names or list(faults), args.runs, args.report_dir, args.timeout, workers=args.workers)
    print()
    print("\n".join(table(result)))
    missed = [n for n, r in result["faults"].items() if r["caught"] < args.runs]
    print(f"\n{len(result['faults'])} faults, {args.runs} run(s) each, {result['seconds']:.0f} s: "
          f"{len(result['faults']) - len(missed)} caught in every run" + (f"; MISSED: {', '.join(missed)}" if missed else "") + ".")
    print(f"Claims no known fault turns red: {', '.join(result['uncovered']) or 'none'}")
    args.report_dir.mkdir(parents=True, exist_ok=True)
    target = args.report_dir / RESULT_NAME
    tmp = target.with_name(f".{RESULT_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    tmp.replace(target)
    print(f"written: {target}")
    return 1 if missed else 0
