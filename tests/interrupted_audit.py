"""One audit (``isa``, ``stress``, ``gpu-check``) or ``verify`` started as its command starts it, whose claims run is a stand-in that
waits to be stopped: ``python tests/interrupted_audit.py AUDIT REPORT_DIR PID_FILE``. ``tests/test_interrupts.py`` sends
it Ctrl-C or SIGTERM once the stand-in has written its pid.

The stand-in goes through the one launcher (:func:`cheapinfer.audits.launch.run_claims` and
:func:`~cheapinfer.audits.launch.run_interruptibly`); only the command it starts is replaced: a Python process that
takes Ctrl-C as pytest does (exit 2), started where the claims' pytest would start. ``isa``'s probe of the kernels reads a
made-up answer, and ``gpu-check`` sees a made-up CUDA card (:mod:`fake_cuda`).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from cheapinfer.audits import launch

#: The claims run's stand-in: it writes its pid, takes Ctrl-C as pytest does (exit 2), and waits.
STAND_IN = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, lambda *a: sys.exit(2))
with open(sys.argv[1] + ".part", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".part", sys.argv[1])
time.sleep(600)
"""


def main(audit: str, out: Path, pid_file: str) -> int:
    real = launch.run_interruptibly
    launch.run_interruptibly = lambda cmd, env: real([sys.executable, "-c", STAND_IN, pid_file], env)
    if audit == "isa":
        from cheapinfer.audits import families, matrix

        families.probe = lambda env: {"error": "a made-up probe"}
        return matrix.isa_main(["KV-HEAD-TIMING"], ["default"], out)
    if audit == "stress":
        from cheapinfer.audits import stress

        # the quiet run's verdicts given: the run that is stopped is the one beside the busy process
        return stress.stress_main(["KV-HEAD-TIMING"], 1, out, quiet_record={"claims": {}}, quiet_source="quiet.json")
    if audit == "gpu-check":
        import pytest
        from fake_cuda import FakeCuda

        from cheapinfer.audits import gpu_check
        from cheapinfer.cli.machine import gpu_check_cli

        mp = pytest.MonkeyPatch()
        FakeCuda(count=1).install(mp)
        mp.setattr(gpu_check, "_cached_artifacts", lambda: None)
        return gpu_check_cli(["--report-dir", str(out)])
    if audit == "verify":
        from cheapinfer.cli import main as cli

        return cli(["verify", "--report-dir", str(out)])
    raise SystemExit(f"no such audit: {audit}")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, whatever started this process
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3]))
