"""The writer's fault: the suite's own bug, not the chapter's. The claims' faults (:mod:`cheapinfer.faults.catalogue`)
turn claims red; this one turns red the checks that a failed write loses nothing (tests/test_hard_edges.py).

``non_atomic_writer`` replaces :func:`cheapinfer.harness.store.atomic_write` by what the suite once did: each file
truncated and written in place, one after the other, with no temporary file and no rename. A full disk then leaves
a truncated file where the previous record was.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from ..harness import store
from .base import patched

WHAT = "every record, matrix and report written in place (truncate, then write): a failed write truncates the previous file"


def _in_place(*files: tuple[Path, str | bytes]) -> None:
    for path, data in files:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            store._write_all(fd, raw)
        finally:
            os.close(fd)


@contextlib.contextmanager
def non_atomic_writer() -> Iterator[None]:
    """The writer's fault, for as long as the block runs."""
    with patched(store, "atomic_write", _in_place):
        yield
