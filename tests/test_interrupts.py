"""Ctrl-C and SIGTERM during ``verify`` and each audit that launches claims runs (``isa``, ``stress``, ``gpu-check``): exit 130 and 143,
one line on stderr, no traceback, and every process the audit started gone (the claims run, ``stress``'s busy process).
Each audit runs in a process of its own (:mod:`interrupted_audit`), its claims run a stand-in started through the one
launcher. ``faults``' SIGTERM, which also removes its temporary directory, is tested in ``tests/test_faults.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the audit's processes through /proc")

#: What each audit says, by how it was stopped.
SAID = {
    ("isa", signal.SIGINT): "cheapinfer isa: interrupted; it recorded nothing; nothing more was run and no summary was written",
    ("isa", signal.SIGTERM): "cheapinfer isa: terminated (SIGTERM); the running claims run was stopped; no summary was written",
    ("stress", signal.SIGINT): "cheapinfer stress: interrupted; it recorded nothing; nothing more was run and no summary was written",
    ("stress", signal.SIGTERM): "cheapinfer stress: terminated (SIGTERM); the running claims run was stopped; no summary was written",
    ("gpu-check", signal.SIGINT): "cheapinfer gpu-check: interrupted during its tests step; no record written",
    ("gpu-check", signal.SIGTERM): "cheapinfer gpu-check: terminated (SIGTERM) during its tests step; no record written",
    ("verify", signal.SIGINT): "cheapinfer verify: interrupted; it recorded nothing; the latest run.json and errata.md were not replaced",
    ("verify", signal.SIGTERM): "cheapinfer verify: terminated (SIGTERM); the running claims run was stopped; the latest run.json and "
                                "errata.md were not replaced",
}


def _processes_with(marker: str) -> list[int]:
    """The live processes whose environment carries ``marker`` (the audit and everything it started)."""
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in env.read_bytes():
                stat = (env.parent / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(env.parent.name))
        except (OSError, IndexError):
            continue
    return found


@pytest.mark.parametrize("audit", ["isa", "stress", "gpu-check", "verify"])
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_audit_exits_130_or_143_in_one_line_with_its_children_stopped(audit, sig, code, tmp_path):
    pid_file = tmp_path / "claims-run.pid"
    marker = f"CHEAPINFER_TEST_MARK={tmp_path.name}"
    env = {**os.environ, "CHEAPINFER_TEST_MARK": tmp_path.name, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("CHEAPINFER_DEVICE", None)
    proc = subprocess.Popen([sys.executable, str(TESTS / "interrupted_audit.py"), audit, str(tmp_path / "out"), str(pid_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not pid_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    if not pid_file.exists():
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the claims run did not start (exit {proc.returncode}): {(out + err)[-3000:]}")
    started = len(_processes_with(marker))
    assert started >= (3 if audit == "stress" else 2)  # the audit, its claims run (and the busy process)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, out[-2000:] + err[-2000:]
    assert [line for line in err.splitlines() if line.strip()] == [SAID[audit, sig]], err
    assert "Traceback" not in out + err
    assert _processes_with(marker) == []
    assert not (tmp_path / "out" / "matrix.json").exists() and not (tmp_path / "out" / "stress.json").exists()
    assert not (tmp_path / "out" / "gpu-check.json").exists()
