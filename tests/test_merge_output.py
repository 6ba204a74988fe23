"""``merge -o`` names the real cause of an output it cannot write (issue 46): a symlink loop is refused, never replaced
by the matrix, and a parent that is a file is named as the parent. One line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from cheapinfer.cli import records as merge

RECORD = Path(__file__).resolve().parent / "data" / "run-record.json"


def _loop(tmp: Path) -> Path:
    (tmp / "loop").symlink_to(tmp / "loop")
    return tmp / "loop"


def _under_a_file(tmp: Path) -> Path:
    (tmp / "afile").write_text("x")
    return tmp / "afile" / "m.md"


@pytest.mark.parametrize("where,said", [
    (_loop, "-o {out}: it is a symlink loop; nothing was written"),
    (_under_a_file, "-o {out}: its directory {tmp}/afile: it is a file, not a directory; nothing was written"),
    (lambda tmp: tmp, "-o {out}: it is a directory; nothing was written"),
], ids=["symlink loop", "parent a file", "a directory"])
def test_merge_o_names_why_it_cannot_write_and_writes_nothing(where, said, tmp_path, capsys):
    out = where(tmp_path)
    with pytest.raises(SystemExit) as exc:
        merge.merge_cli([str(RECORD), "-o", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exc.value.code == 2 and err == [f"cheapinfer merge: error: {said.format(out=out, tmp=tmp_path)}"], err
    assert (tmp_path / "loop").is_symlink() if out.name == "loop" else True, "the symlink loop was replaced by the matrix"
