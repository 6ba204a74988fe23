"""``cheapinfer faults --report-dir`` (issue 46, case 2): a folder that cannot take ``faults.json`` is refused in one
line, exit 2, before the sweep; a write that fails after the sweep (a full disk, a folder turned read-only) keeps
the sweep's record elsewhere and says where, in one line, and leaves the previous ``faults.json`` whole.

Tests run as root here, and root ignores a folder's permissions, so the refusals are made in-process by failing the
system call itself (``EACCES``, ``ENOSPC``), and once for real as an unprivileged user (``setpriv``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import site
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cheapinfer import cli as cli_main
from cheapinfer.audits import faults as runner
from cheapinfer.harness import store

ROOT = Path(__file__).resolve().parent.parent
FAULT = "kv-decode-ignores-cache"


def _sweep(names, runs, *args, **kwargs) -> dict:
    """A finished sweep's record, as :func:`runner.run` returns it, without running a fault."""
    return {"schema": 1, "suite": "cheapinfer test", "runs": runs, "mode": "sweep", "seconds": 1.0, "uncovered": [],
            "faults": {n: {"targets": ["KV-IDENTITY"], "runs": [{"KV-IDENTITY": "red"}], "kind": "k", "caught": 1} for n in names}}


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
    """A full disk in ``folder``, room elsewhere: ``store._write_all`` fails with ENOSPC on a file opened in ``folder``
    (the descriptors ``os.open`` gave for it are tracked, as a descriptor names no path)."""
    real_open, real_write, there = os.open, store._write_all, set()

    def opened(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        (there.add if _in(folder, path) else there.discard)(fd)
        return fd

    mp.setattr(os, "open", opened)
    mp.setattr(store, "_write_all", lambda fd, data: _enospc() if fd in there else real_write(fd, data))


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

    from cheapinfer.harness.store import keep_aside

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    said = keep_aside(tmp_path / "reports" / "faults.json", '{"a": 1}\n', "the record")
    kept = list(tmp_path.iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("cheapinfer-faults-") and kept[0].suffix == ".json"
    assert said == f"the record was kept as {kept[0]} instead" and kept[0].read_text() == '{"a": 1}\n'
    monkeypatch.setattr(store, "_write_all", _enospc)
    out = io.StringIO()
    said = keep_aside(tmp_path / "faults.json", '{"a": 2}', "the record", out=out)
    assert out.getvalue() == '{"a": 2}\n' and list(tmp_path.iterdir()) == kept, "a partial file was left aside"
    assert said == f"the record could not be kept in {tmp_path} either (No space left on device), so it was printed on standard output"


# ------------------------------------------------------------------------------------------------
# after the sweep: the record kept aside, one line, exit 1; the previous faults.json whole
# ------------------------------------------------------------------------------------------------


def _fails_after_the_sweep(tmp_path, capsys, monkeypatch, break_it) -> tuple[int, str, str, Path]:
    """Run ``faults`` whose report dir ``break_it`` breaks while the sweep runs; exit code, stderr line, stdout, the dir."""
    reports, aside = tmp_path / "reports", tmp_path / "elsewhere"
    reports.mkdir(), aside.mkdir()
    (reports / "faults.json").write_text("previous")
    monkeypatch.setattr(tempfile, "tempdir", str(aside))

    def sweep(*args, **kwargs):
        break_it(reports, monkeypatch)
        return _sweep(*args, **kwargs)

    monkeypatch.setattr(runner, "run", sweep)
    code, err, out = _main(["faults", "--report-dir", str(reports), FAULT], capsys)
    assert len(err) == 1, err
    return code, err[0], out, reports


def _turns_read_only(reports, mp):
    mp.setattr(os, "open", _refusing_open(reports, errno.EACCES))


def _fills(reports, mp):
    _fill(reports, mp)


def _check_kept_aside(tmp_path, capsys, monkeypatch, break_it, why):
    code, line, _, reports = _fails_after_the_sweep(tmp_path, capsys, monkeypatch, break_it)
    assert (reports / "faults.json").read_text() == "previous", "the previous faults.json was truncated"
    assert code == 1 and f"cannot write {reports / 'faults.json'} ({why}); the previous one is as it was" in line, line
    kept = list((tmp_path / "elsewhere").iterdir())
    assert len(kept) == 1 and f"this sweep's record was kept as {kept[0]} instead" in line, line
    assert json.loads(kept[0].read_text()) == _sweep([FAULT], 1), "the sweep's record was not kept whole"
    assert sorted(p.name for p in reports.iterdir()) == ["faults.json"], "a temporary file was left in the report dir"


@pytest.mark.parametrize("break_it,why", [(_turns_read_only, "Permission denied"), (_fills, "No space left on device")],
                         ids=["turned read-only", "full disk"])
def test_a_report_dir_that_fails_after_the_sweep_keeps_the_sweeps_record(break_it, why, tmp_path, capsys, monkeypatch):
    _check_kept_aside(tmp_path, capsys, monkeypatch, break_it, why)


def test_the_writers_fault_turns_the_kept_aside_check_red(tmp_path, capsys, monkeypatch):
    """Not true by construction: written in place (the writer's fault), a full disk truncates the previous faults.json."""
    from cheapinfer.faults.writer import non_atomic_writer

    with non_atomic_writer(), pytest.raises(AssertionError, match="the previous faults.json was truncated"):
        _check_kept_aside(tmp_path, capsys, monkeypatch, _fills, "No space left on device")


def test_with_no_room_anywhere_the_sweeps_record_goes_to_standard_output(tmp_path, capsys, monkeypatch):
    code, line, out, reports = _fails_after_the_sweep(tmp_path, capsys, monkeypatch, lambda d, mp: mp.setattr(store, "_write_all", _enospc))
    assert code == 1 and (reports / "faults.json").read_text() == "previous"
    assert f"could not be kept in {tmp_path / 'elsewhere'} either (No space left on device), so it was printed on standard output" in line
    assert list((tmp_path / "elsewhere").iterdir()) == [], "a partial file was left aside"
    assert json.loads(out[out.rindex("\n{\n") + 1:]) == _sweep([FAULT], 1)


# ------------------------------------------------------------------------------------------------
# for real, as a user whom permissions bind
# ------------------------------------------------------------------------------------------------

_AS_USER = r"""
import json, os, sys
from pathlib import Path
from cheapinfer.audits import faults as runner
from cheapinfer import cli
print("STARTED", flush=True)
base = Path(sys.argv[1])
ro, later = base / "ro", base / "later"

def sweep(names, runs, *a, **k):
    os.chmod(later, 0o555)  # the folder turns read-only while the sweep runs
    return {"schema": 1, "suite": "t", "runs": runs, "mode": "sweep", "seconds": 1.0, "uncovered": [], "faults": {}}

def code(where):
    try:
        return cli.main(["faults", "--report-dir", str(where), sys.argv[2]])
    except SystemExit as exc:
        return exc.code

runner.run = sweep
print("CODES", code(ro), code(later))
"""


def _python_for(user: list[str]) -> str | None:
    """An interpreter of this Python's version that ``user`` (a command prefix) may run, or None."""
    want = f"{sys.version_info.major}.{sys.version_info.minor}"
    for exe in dict.fromkeys([sys.executable, os.path.realpath(sys.executable), shutil.which(f"python{want}", path="/usr/local/bin:/usr/bin") or ""]):
        if exe and subprocess.run([*user, exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True).stdout.strip() == want:
            return exe
    return None


@pytest.mark.skipif(os.name != "posix", reason="file permissions and setpriv are POSIX")
def test_as_an_unprivileged_user_a_read_only_report_dir_is_refused_and_a_late_one_keeps_the_sweep(tmp_path):
    if os.geteuid() != 0:
        user = []
    elif shutil.which("setpriv"):
        user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    else:
        pytest.skip("root, and no setpriv to become a user whom permissions bind")
    python = _python_for(user)
    if python is None:
        pytest.skip("no interpreter of this Python's version that the unprivileged user may run")
    base = Path(tempfile.mkdtemp(prefix="cheapinfer-ro-"))  # outside tmp_path, whose parents only root may enter
    try:
        for d in (base, base / "ro", base / "later", base / "aside"):
            d.mkdir(exist_ok=True)
            os.chmod(d, 0o755)
            if user:
                os.chown(d, 65534, 65534)
        (base / "later" / "faults.json").write_text("previous")
        os.chmod(base / "ro", 0o555)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base / "aside"), "TMPDIR": str(base / "aside"),
               "PYTHONPATH": os.pathsep.join([str(ROOT), *site.getsitepackages()])}
        done = subprocess.run([*user, python, "-c", _AS_USER, str(base), FAULT], capture_output=True, text=True, env=env, timeout=300)
        if "STARTED" not in done.stdout:
            pytest.skip(f"the unprivileged user cannot import the suite: {done.stderr.strip().splitlines()[-1:]}")
        assert "Traceback" not in done.stderr and "CODES 2 1" in done.stdout, (done.stdout, done.stderr)
        err = done.stderr.splitlines()
        assert len(err) == 2, err
        assert f"--report-dir {base / 'ro'}: cannot write in the directory (Permission denied)" in err[0]
        kept = list((base / "aside").glob("cheapinfer-faults-*.json"))
        assert len(kept) == 1 and f"cannot write {base / 'later' / 'faults.json'} (Permission denied); the previous one is as it was; " \
                                   f"this sweep's record was kept as {kept[0]} instead" in err[1], err
        assert json.loads(kept[0].read_text())["mode"] == "sweep" and (base / "later" / "faults.json").read_text() == "previous"
        assert stat.S_IMODE(os.stat(base / "later").st_mode) == 0o555 and os.listdir(base / "ro") == []
    finally:
        for d in (base / "ro", base / "later"):
            os.chmod(d, 0o755)
        shutil.rmtree(base)
