"""Reading one translation of the chapter for ``cheapinfer errata`` (the command: :mod:`cheapinfer.cli.records`), which
writes the unified diff of every replacement of cheapinfer/errata.toml for an author to apply."""

from __future__ import annotations

from pathlib import Path

#: The largest chapter file read (the chapter is about 100 KB): a bigger file is refused, not read.
MAX_BYTES = 8 * 2**20


def read_chapter(path: Path) -> str:
    """The chapter's text; ValueError with one line for a missing, oversized, binary or non-UTF-8 file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read it ({exc.strerror or exc})") from None
    if len(raw) > MAX_BYTES:
        raise ValueError(f"it is larger than {MAX_BYTES // 2**20} MiB: not the chapter's text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
