"""A reader of standard output that leaves early (``cheapinfer compare A B | head -1``) ends the command quietly, exit
141 as a shell gives a tool SIGPIPE stopped, with no BrokenPipeError traceback (issue 46: never a traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "data" / "run-record.json"


@pytest.mark.parametrize("argv", [["merge", str(RECORD)], ["compare", str(RECORD), str(RECORD)], ["--help"]], ids=["merge", "compare", "--help"])
def test_a_reader_that_leaves_early_ends_the_command_quietly(argv):
    read, write = os.pipe()
    os.close(read)  # the reader has left before the command writes a byte
    try:
        run = subprocess.run([sys.executable, "-m", "cheapinfer", *argv], stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in run.stderr and "BrokenPipeError" not in run.stderr, run.stderr
    assert run.returncode == 141 and run.stderr.strip() == "", run.stderr
