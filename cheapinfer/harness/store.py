"""Where the records go: the report directory, every run's own record in ``runs/``, and files replaced whole.

:func:`writable_dir` and :func:`check_slots` refuse a report directory before any test runs; :func:`keep` writes a run's
own record (``runs/<UTC stamp>-<run id>.json``) and :func:`own_record` finds it again; :func:`atomic_write` replaces a
set of files together or not at all. A finished result that cannot be written where it was asked is kept aside, never
thrown away (issue 46): a sweep of every fault takes an hour, and a report dir that fills up or turns read-only while it
runs must not cost that hour. :func:`keep_aside` writes the result into a new file of the system's temporary directory
(``TMPDIR``) and says where; where that fails too (the same full disk), the result is printed on standard output, so
that a terminal or a log still holds it. The Markdown reports are rendered by :mod:`cheapinfer.harness.report`.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from ..runtime.files import why_not_a_directory
from .schema import RECORD_NAME, RunRecord

#: The author's list of errata, beside the latest ``run.json``.
ERRATA_NAME = "errata.md"
#: Every run's own record, ``<report dir>/runs/<UTC stamp>-<run id>.json``, beside the latest ``run.json``.
RUNS_DIR = "runs"
#: A run's pytest-benchmark JSON beside its own record: ``runs/<UTC stamp>-<run id>.benchmarks.json``.
BENCHMARKS_SUFFIX = ".benchmarks.json"
#: The run id ``python -m cheapinfer verify`` gives its pytest, which names that run's record with it.
RUN_ID_VARIABLE = "CHEAPINFER_RUN_ID"


def writable_dir(path: Path) -> Path:
    """``path``, created if needed, once a file could be written in it; ValueError with the reason otherwise."""
    path = Path(path)
    if str(path) == "":
        raise ValueError("an empty path names no directory (it is not the current one)")
    refusal = why_not_a_directory(path)
    if refusal:
        raise ValueError(refusal)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the directory ({exc.strerror or exc})") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ValueError(f"cannot write in the directory ({exc.strerror or exc})") from None
    return path


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to the file descriptor ``fd`` (an OSError such as ENOSPC propagates)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _staged(path: Path, data: str | bytes) -> Path:
    """``data`` in a new temporary file beside ``path`` (removed again if writing it fails), ready to be renamed over it.

    The file gets the mode any file the user writes gets: 0666 less the umask (``open(..., "w")`` does the same).
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        try:
            _write_all(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


class PartlyWritten(OSError):
    """:func:`atomic_write` renamed some of its files into place, then failed: which were replaced, which were not."""

    def __init__(self, written: list[Path], unwritten: list[Path], cause: OSError):
        self.written, self.unwritten = written, unwritten
        super().__init__(cause.errno, f"{', '.join(map(str, written))} replaced, but {', '.join(map(str, unwritten))} not "
                                      f"({cause.strerror or cause}): the files no longer belong to one run")


def check_slots(outdir: Path) -> None:
    """ValueError unless every file a run writes into ``outdir`` can go where it goes: ``runs/`` a directory (or
    absent), ``run.json`` and ``errata.md`` regular files (or absent). Checked before any test runs."""
    from ..runtime.files import kind_of

    outdir = Path(outdir)
    runs = outdir / RUNS_DIR
    refusal = why_not_a_directory(runs) if runs.exists() or runs.is_symlink() else ""
    if refusal:
        raise ValueError(f"{runs}: {refusal}; this run's record could not be kept there")
    for name in (RECORD_NAME, ERRATA_NAME):
        kind = kind_of(outdir / name)
        if kind:
            raise ValueError(f"{outdir / name} is {kind}: the latest {name} could not be written there")


def atomic_write(*files: tuple[Path, str | bytes]) -> None:
    """Write each ``(path, data)`` to a temporary file beside ``path``, then rename them over their paths: readers
    see the old files or the new ones, never a part. On any failure (a full disk, an interrupt) before the
    renames, every temporary file is removed and no path is touched."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files:
            staged.append((_staged(Path(path), data), Path(path)))
        for i, (tmp, path) in enumerate(staged):
            try:
                os.replace(tmp, path)
            except OSError as exc:
                if i:
                    raise PartlyWritten([p for _, p in staged[:i]], [p for _, p in staged[i:]], exc) from None
                raise
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)  # already renamed, unless something failed


def record_json(record: RunRecord) -> str:
    """The record as ``run.json`` and ``runs/`` hold it."""
    return json.dumps(record, indent=1, sort_keys=False, default=str) + "\n"


def _stamp(record: RunRecord) -> str:
    return str(record.get("created", "")).replace("-", "").replace(":", "") or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def new_run_id() -> str:
    """A run's identity: unique across processes, machines and PID namespaces (a pid repeats; this does not)."""
    return secrets.token_hex(6)


def keep(record: RunRecord, outdir: Path, benchmarks: Path | None = None) -> Path:
    """This run's own copy of the record, ``runs/<UTC stamp>-<run id>.json``: concurrent and repeated runs lose nothing.

    The run id is ``record["run"]["id"]`` (:func:`new_run_id` when there is none). ``benchmarks``: this run's
    pytest-benchmark JSON, copied beside the record (``runs/<same name>.benchmarks.json``, which the next run
    does not overwrite); ``record["run"]["benchmarks"]`` then names the copy, relative to ``outdir``.
    """
    outdir = Path(outdir)
    runs = outdir / RUNS_DIR
    runs.mkdir(parents=True, exist_ok=True)
    base = f"{_stamp(record)}-{record.get('run', {}).get('id') or new_run_id()}"
    path, n = runs / f"{base}.json", 1
    while path.exists():  # the same run id twice in one second (a record kept again)
        n += 1
        path = runs / f"{base}-{n}.json"
    if benchmarks is not None:
        copy = path.with_name(f"{path.stem}{BENCHMARKS_SUFFIX}")
        atomic_write((copy, Path(benchmarks).read_bytes()))
        record.setdefault("run", {})["benchmarks"] = str(copy.relative_to(outdir))
    atomic_write((path, record_json(record)))
    return path


def own_record(outdir: Path, run_id: str) -> Path | None:
    """The record the run ``run_id`` kept in ``outdir`` (:func:`keep`; the last, if it was kept twice), or None."""
    runs = Path(outdir) / RUNS_DIR
    mine = [p for p in sorted(runs.glob(f"*-{run_id}.json")) + sorted(runs.glob(f"*-{run_id}-*.json")) if not p.name.endswith(BENCHMARKS_SUFFIX)]
    return mine[-1] if mine else None


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
                _write_all(fd, data.encode("utf-8"))
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
