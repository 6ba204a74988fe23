"""What the commands of ``python -m cheapinfer`` share: a usage error is one line on standard error, exit 2."""

from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (``prog: error: message``), exit status 2.

    argparse's own error prints the whole usage first; ``--help`` still prints it.
    """

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
