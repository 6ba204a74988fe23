"""Reading the files a user names, bounded: a record is a regular file of at most :data:`MAX_RECORD_BYTES`, and
its JSON numbers are finite. Imports nothing heavy (no torch), so every command and the plugin may use it.

A FIFO would block a reader for ever and ``/dev/zero`` would grow it without end: both are refused before a
byte is read, and a file that grows while it is read is cut at the limit, then refused. JSON's own parser
takes ``NaN``, ``Infinity`` and ``1e400`` (read as infinity); a record of this suite holds none of them, so each
is refused here, in one line, as a huge integer is refused by the record's validator.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

#: The largest record a reader takes: a full run record is about 1 MiB; 64 times that is no record of this suite.
MAX_RECORD_BYTES = 64 * 1024 * 1024


class UnreadableFile(ValueError):
    """A file that cannot be read as a record: not a regular file, too large, or not strict JSON (one line)."""


def kind_of(path: Path) -> str:
    """What ``path`` is, in words, when it is not a regular file ("" when it is one, or does not exist)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISREG(mode):
        return ""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bounded(path: Path, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; UnreadableFile (one line) for anything else.

    The file is opened without blocking (a FIFO opened for reading would wait for a writer), then judged by what
    the open descriptor is, so a path swapped between a check and the open cannot slip through. OSError (no such
    file, permission denied) propagates.
    """
    limit = MAX_RECORD_BYTES if limit is None else limit
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnreadableFile(f"it is {kind_of(path) or 'not a regular file'}, not a record file")
        if os.fstat(fd).st_size > limit:
            raise UnreadableFile(f"it is {os.fstat(fd).st_size} bytes, more than the {limit // 2**20} MiB a record of this suite can be")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UnreadableFile(f"it grew past the {limit // 2**20} MiB a record of this suite can be while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _constant(name: str) -> Any:
    raise UnreadableFile(f"it holds {name}, which is not a JSON number (a record of this suite holds finite numbers only)")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnreadableFile(f"it holds the number {text[:40]}, beyond the range of a float")
    return value


def loads_strict(text: str | bytes) -> Any:
    """JSON with finite numbers only: ``NaN``, ``Infinity`` and a literal beyond a float (``1e400``) are
    UnreadableFile, one line; so is text that is not JSON or not UTF-8."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, parse_constant=_constant, parse_float=_float)
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"it is not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise UnreadableFile("it is JSON nested too deep to be a record of this suite") from None
    except json.JSONDecodeError as exc:
        raise UnreadableFile(f"it is not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None


def read_json(path: Path, limit: int | None = None) -> Any:
    """The JSON file ``path``, bounded (:func:`read_bounded`) and strict (:func:`loads_strict`)."""
    return loads_strict(read_bounded(path, limit))


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that refuses NaN and infinity (ValueError) rather than writing what is no JSON."""
    return json.dumps(value, allow_nan=False, **kwargs)


def why_not_a_directory(path: Path) -> str:
    """Why ``path`` cannot be (or become) a directory, in words naming the real cause, or "" when nothing is in its
    way: it is a file, a symlink loop, or one of its parents is a file."""
    path = Path(path)
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "it is a symlink loop"
        if exc.errno == errno.ENOTDIR:
            for parent in reversed(path.parents):
                if parent.exists() and not parent.is_dir():
                    return f"its parent {parent} is a file, not a directory"
            return "a parent of it is not a directory"
        if exc.errno != errno.ENOENT:
            return exc.strerror or str(exc)
        for parent in reversed(path.parents):
            if os.path.islink(parent) and not parent.exists():
                try:
                    os.stat(parent)
                except OSError as inner:
                    if inner.errno == errno.ELOOP:
                        return f"its parent {parent} is a symlink loop"
        return ""
    if path.is_dir():
        return ""
    kind = kind_of(path)
    return f"it is {kind}, not a directory" if kind else "it is a file, not a directory"
