"""The ``cheapinfer`` command line, run in this process as ``python -m cheapinfer`` runs it: (exit status, standard
output, standard error), both read at the file descriptors, so that what a child it starts prints is there too.
The environment and working directory are the test's, with ``env`` set and ``cwd`` entered for the command.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cheapinfer import cli


def cheapinfer(capfd, *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    capfd.readouterr()  # what the test printed before
    said = ""
    with pytest.MonkeyPatch.context() as mp:
        if cwd is not None:
            mp.chdir(cwd)
        for name, value in (env or {}).items():
            mp.setenv(name, value)
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:  # a usage error (argparse's): as the interpreter ends on it
            code, said = (exc.code, "") if isinstance(exc.code, int) else (0, "") if exc.code is None else (1, f"{exc.code}\n")
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["cheapinfer", *argv], code, out, err + said)
