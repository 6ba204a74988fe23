"""A finished result that cannot be written where it was asked is kept aside, never thrown away (issue 46).

A sweep of every fault takes an hour; a report dir that fills up or turns read-only while it runs must not cost that
hour. :func:`keep_aside` writes the result into a new file of the system's temporary directory (``TMPDIR``) and says
where. Where that fails too (the same full disk), the result is printed on standard output, so that a terminal or a
log still holds it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from . import report


def keep_aside(path: Path, data: str, what: str, out: TextIO | None = None) -> str:
    """Keep ``data`` (``what`` it is, in words), which could not be written to ``path``; where it went, as the end of a
    one-line error message.

    The file is new (``cheapinfer-<name>-<random>.<suffix>``), so no earlier file is touched; it is written and
    synced in full, or removed. ``out``: where the data goes when no file can take it (default standard output).
    """
    path = Path(path)
    try:
        fd, name = tempfile.mkstemp(prefix=f"cheapinfer-{path.stem}-", suffix=path.suffix)
        try:
            try:
                report._write_all(fd, data.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            os.unlink(name)
            raise
    except OSError as exc:
        stream = out or sys.stdout
        stream.write(data if data.endswith("\n") else data + "\n")
        stream.flush()
        return f"{what} could not be kept in {tempfile.gettempdir()} either ({exc.strerror or exc}), so it was printed on standard output"
    return f"{what} was kept as {name} instead"
