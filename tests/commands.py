"""The ``cheapinfer`` command line, run in this process as ``python -m cheapinfer`` runs it: (exit status, standard
output, standard error), both read at the file descriptors, so that what a child it starts prints is there too.
The environment and working directory are the test's (``monkeypatch.setenv``, ``monkeypatch.chdir``).
"""

from __future__ import annotations

import subprocess

from cheapinfer import cli


def cheapinfer(capfd, *argv: str) -> subprocess.CompletedProcess:
    capfd.readouterr()  # what the test printed before
    said = ""
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # a usage error (argparse's): as the interpreter ends on it
        code, said = (exc.code, "") if isinstance(exc.code, int) else (0, "") if exc.code is None else (1, f"{exc.code}\n")
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["cheapinfer", *argv], code, out, err + said)
