"""``cheapinfer stress`` (was ``verify --stress N``) (:mod:`cheapinfer.audits.matrix`): the clocked claims run once on the quiet
machine, then again beside N CPU-bound processes (:func:`busy`); per claim the quiet and the stressed
verdict and the machine's load around each. Load must never be what turns a claim red.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..harness.compare import compare, environment_changes
from ..harness.store import atomic_write
from ..harness.tables import markdown_table
from . import matrix
from .launch import ClaimsRun, Runner

#: Each busy process ends after this many seconds at most, or as soon as its parent is gone.
BUSY_SECONDS = 7200.0
#: How long a busy process may take to start before the audit gives up (a loaded machine starts Python slowly).
START_SECONDS = 60.0
#: One CPU-bound process: a pure-Python loop, deaf to Ctrl-C (its parent stops it), that ends at its deadline
#: or once its parent (whose pid it is given: it may start after its parent is gone) is no longer its parent. It
#: says "ready" on stdout once it runs its own code, so that no claim starts before the load it is measured beside.
BUSY = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
x = 1
sys.stdout.write("ready\n"); sys.stdout.close()
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(100000):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
"""


class BusyNotStarted(RuntimeError):
    """A busy process did not reach its loop: the stressed run would measure no stress."""


@contextlib.contextmanager
def busy(n: int, seconds: float = BUSY_SECONDS) -> Iterator[list[int]]:
    """``n`` CPU-bound processes (:data:`BUSY`) for the duration: their pids. They are killed when the block ends,
    however it ends (an error, Ctrl-C, SIGTERM raised as an exception); each also ends by itself after
    ``seconds``, or when this process is gone. The block starts only once every one of them runs its loop."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-I", "-S", "-c", BUSY, str(os.getpid()), str(seconds)], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True))
        for p in procs:
            _wait_ready(p)
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


def _wait_ready(p: subprocess.Popen, timeout: float = START_SECONDS) -> None:
    """Block until the busy process ``p`` has said "ready" (it then runs its loop); one clear error otherwise."""
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    if not ready or p.stdout.readline().strip() != b"ready":
        raise BusyNotStarted(f"a busy process (pid {p.pid}) did not start within {timeout:.0f} s; the stressed run needs it")


def stress(claims: list[str], n: int, report_dir: Path, pytest_args: Sequence[str] = (), runner: Runner | None = None,
           quiet_record: dict[str, Any] | None = None, quiet_source: str | None = None, echo: Callable[[str], None] = print,
           prog: str = "cheapinfer stress") -> dict[str, Any]:
    """The quiet run (or ``quiet_record``), the run beside ``n`` busy processes, and how each claim's verdict moved. Both
    claims runs get ``pytest_args`` and start through ``runner`` (:func:`cheapinfer.audits.matrix.claims_run`)."""
    started = time.monotonic()
    env = dict(os.environ)
    if quiet_record is None:
        echo(f"{prog}: the quiet run: {len(claims)} clocked claim(s) into {report_dir / 'quiet'}")
        got = matrix.claims_run(report_dir / "quiet", claims, env, pytest_args, runner)
        quiet_record, quiet_exit = got.record, got.exit_status
        quiet_source = str(got.record_path) if got.record_path else None
    else:
        quiet_exit = None
    pids: list[int] = []
    if quiet_record is None:  # nothing to compare with: the stressed run would tell nothing
        got = ClaimsRun(None, None, None, 0.0)
    else:
        echo(f"{prog}: the run beside {n} busy process(es) into {report_dir / 'stressed'}")
        with busy(n) as pids:
            got = matrix.claims_run(report_dir / "stressed", claims, env, pytest_args, runner)
    stressed = got.record
    rows = matrix.moved(quiet_record, stressed, claims) if quiet_record and stressed else []
    changes = []
    if quiet_record and stressed:
        changes = [c for c in compare(quiet_record, stressed) if c.claim in claims and c.what not in ("verdict", "claim")]
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "busy_processes": n,
        "busy": f"{n} pure-Python loop(s) (pids {', '.join(map(str, pids))}), each ended when the run ended (at most {BUSY_SECONDS:.0f} s)",
        "seconds": round(time.monotonic() - started, 1),
        "quiet": {"record": quiet_source, "exit_status": quiet_exit, "load": matrix.load_span(quiet_record, claims) if quiet_record else None},
        "stressed": {"record": str(got.record_path) if got.record_path else None, "exit_status": got.exit_status, "seconds": got.seconds,
                     "load": matrix.load_span(stressed, claims) if stressed else None},
        "environment_changes": environment_changes(quiet_record, stressed) if quiet_record and stressed else [],
        "claims": rows,
        "moved_values": [{"claim": c.claim, "profile": c.profile, "q": c.what, "quiet": c.before, "stressed": c.after,
                          "tolerance": c.tolerance, "toward_bound": c.regression} for c in changes],
        "red_under_stress": [r["claim"] for r in rows if r["moved"] == matrix.RED_UNDER_STRESS],
        "inconclusive_under_stress": [r["claim"] for r in rows if r["moved"] == matrix.INCONCLUSIVE_UNDER_STRESS],
    }


def stress_lines(s: dict[str, Any]) -> list[str]:
    """The stress check's summary: per claim the quiet and the stressed verdict, then the load of each run."""
    rows = [[r["claim"], matrix.cell_text(r["quiet"]), matrix.cell_text(r["stressed"]), r["moved"]] for r in s["claims"]]
    lines = markdown_table(["claim", "quiet", f"beside {s['busy_processes']} busy process(es)", "moved"], rows)
    lines += ["", f"Quiet run: {matrix.load_text(s['quiet']['load']) if s['quiet']['load'] else 'no record'} ({s['quiet']['record'] or '-'}).",
              f"Stressed run: {matrix.load_text(s['stressed']['load']) if s['stressed']['load'] else 'no record'} ({s['stressed']['record'] or '-'}); "
              f"{s['busy']}."]
    quiet = s["quiet"]["load"] or {}
    if quiet.get("loadavg_1min") and quiet.get("cpus") and quiet["loadavg_1min"][1] >= quiet["cpus"]:
        lines.append(f"WARNING: the quiet run was not quiet (load average up to {quiet['loadavg_1min'][1]:g} on {quiet['cpus']} CPUs): "
                     "a verdict may have moved there, not under the stress; run it again on an idle machine")
    for line in s["environment_changes"]:
        lines.append(f"WARNING: the runs differ in their environment: {line}")
    for v in s["moved_values"]:
        lines.append(f"moved: {v['claim']} [{v['profile']}] {v['q']}: {matrix.short_value(v['quiet'])} -> {matrix.short_value(v['stressed'])} "
                     f"(beyond {v['tolerance']})")
    return lines


def stress_main(claims: list[str], n: int, report_dir: Path, pytest_args: Sequence[str] = (), runner: Runner | None = None,
                quiet_record: dict[str, Any] | None = None, quiet_source: str | None = None, prog: str = "cheapinfer stress") -> int:
    """``cheapinfer stress``: 0 when no claim turned red under stress, 1 when one did (or a run wrote no record)."""

    def body() -> int:
        try:
            s = stress(claims, n, report_dir, pytest_args, runner, quiet_record, quiet_source, prog=prog)
        except BusyNotStarted as e:
            print(f"{prog}: {e}; no summary was written", file=sys.stderr)
            return 1
        atomic_write((report_dir / "stress.json", json.dumps(s, indent=1, default=str) + "\n"))
        print()
        print("\n".join(stress_lines(s)))
        missing = [name for name in ("quiet", "stressed") if not s[name]["record"]]
        for name in missing:
            ran = s[name]["exit_status"] is not None
            print(f"NO RECORD: the {name} run " + (f"wrote no record (pytest exit {s[name]['exit_status']})" if ran else "did not run (no quiet record)"))
        for cid in s["red_under_stress"]:
            print(f"RED UNDER STRESS {cid}")
        print(f"{len(s['claims'])} clocked claim(s), quiet then beside {n} busy process(es), {s['seconds']:.0f} s: "
              f"{len(s['red_under_stress'])} red under stress, {len(s['inconclusive_under_stress'])} inconclusive under stress, "
              f"{sum(r['moved'] == matrix.SAME for r in s['claims'])} unchanged.")
        print(f"Summary: {report_dir / 'stress.json'}")
        return 1 if s["red_under_stress"] or missing else 0

    return matrix.guarded(prog, body)
