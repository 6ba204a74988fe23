"""``cheapinfer faults --report-dir`` (issue 46, case 2): a folder that cannot take ``faults.json`` is refused in one
line, exit 2, before the sweep; a write that fails after the sweep (a full disk, a folder turned read-only) keeps
the sweep's record elsewhere and says where, in one line, and leaves the previous ``faults.json`` whole.

Tests run as root here, and root ignores a folder's permissions, so the refusals are made in-process by failing the
system call itself (``EACCES``, ``ENOSPC``), and once for real as an unprivileged user (``setpriv``).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from cheapinfer import __main__ as cli_main
from cheapinfer.faults import runner
from cheapinfer.harness import report

FAULT = "kv-decode-ignores-cache"


def _main(argv: list[str], capsys) -> tuple[int, list[str], str]:
    """Exit code, the non-blank stderr lines and stdout of ``python -m cheapinfer`` run in-process."""
    try:
        code = cli_main.main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if line.strip()], out


def _in(folder: Path, path) -> bool:
    return Path(os.fsdecode(path)).parent == folder


def _refusing_open(folder: Path, err: int):
    """``os.open`` failing with ``err`` for every file created in ``folder``, named or not (``O_TMPFILE``): what a
    read-only folder does to a user."""
    real, unnamed = os.open, getattr(os, "O_TMPFILE", -1)

    def fake(path, flags, *args, **kwargs):
        if (flags & os.O_CREAT and _in(folder, path)) or (flags & unnamed == unnamed and Path(os.fsdecode(path)) == folder):
            raise OSError(err, os.strerror(err), os.fsdecode(path))
        return real(path, flags, *args, **kwargs)

    return fake


def _refusing_mkdir(folder: Path):
    real = os.mkdir

    def fake(path, *args, **kwargs):
        if Path(os.fsdecode(path)) == folder:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))
        return real(path, *args, **kwargs)

    return fake


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _fill(folder: Path, mp) -> None:
    """A full disk in ``folder``, room elsewhere: ``report._write_all`` fails with ENOSPC on a file opened in ``folder``
    (the descriptors ``os.open`` gave for it are tracked, as a descriptor names no path)."""
    real_open, real_write, there = os.open, report._write_all, set()

    def opened(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        (there.add if _in(folder, path) else there.discard)(fd)
        return fd

    mp.setattr(os, "open", opened)
    mp.setattr(report, "_write_all", lambda fd, data: _enospc() if fd in there else real_write(fd, data))


# ------------------------------------------------------------------------------------------------
# before the sweep: one line, exit 2
# ------------------------------------------------------------------------------------------------


def _read_only(d, mp):
    d.mkdir()
    mp.setattr(os, "open", _refusing_open(d, errno.EACCES))


def _uncreatable(d, mp):
    mp.setattr(os, "mkdir", _refusing_mkdir(d))


def _under_a_file(d, mp):
    d.parent.rmdir()
    d.parent.write_text("a file")


@pytest.mark.parametrize("make,said", [
    (_read_only, "cannot write in the directory (Permission denied)"),
    (_uncreatable, "cannot create the directory (Permission denied)"),
    (_under_a_file, "is a file, not a directory"),
], ids=["read-only", "uncreatable", "under a file"])
def test_a_report_dir_that_cannot_take_faults_json_is_refused_before_the_sweep(make, said, tmp_path, capsys, monkeypatch):
    where = tmp_path / "parent" / "reports"
    where.parent.mkdir()
    monkeypatch.setattr(runner, "run", lambda *a, **k: pytest.fail("the sweep ran before the report dir was checked"))
    make(where, monkeypatch)
    code, err, _ = _main(["faults", "--report-dir", str(where), FAULT], capsys)
    monkeypatch.undo()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"cheapinfer faults: error: --report-dir {where}: ") and said in err[0], err
    if where.is_dir():  # the probe leaves nothing behind
        assert list(where.iterdir()) == []


# ------------------------------------------------------------------------------------------------
# keep_aside: a result that cannot go where it was asked
# ------------------------------------------------------------------------------------------------


def test_keep_aside_writes_a_new_file_in_the_temporary_directory_or_prints_the_data(tmp_path, monkeypatch):
    import io

    from cheapinfer.harness.aside import keep_aside

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    said = keep_aside(tmp_path / "reports" / "faults.json", '{"a": 1}\n', "the record")
    kept = list(tmp_path.iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("cheapinfer-faults-") and kept[0].suffix == ".json"
    assert said == f"the record was kept as {kept[0]} instead" and kept[0].read_text() == '{"a": 1}\n'
    monkeypatch.setattr(report, "_write_all", _enospc)
    out = io.StringIO()
    said = keep_aside(tmp_path / "faults.json", '{"a": 2}', "the record", out=out)
    assert out.getvalue() == '{"a": 2}\n' and list(tmp_path.iterdir()) == kept, "a partial file was left aside"
    assert said == f"the record could not be kept in {tmp_path} either (No space left on device), so it was printed on standard output"
