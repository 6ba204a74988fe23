"""A non-editable install carries the whole package: every module and the data files it reads, and the pytest plugin
(``fixtures/``) that its ``pytest11`` entry point imports."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Not sources: built or installed things, whose stale copies (build/lib) would hide a package the config misses.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", ".tox", "build", "dist", "*.egg-info", "__pycache__", "reports", "_build")


def test_the_wheel_holds_every_module_and_data_file_of_the_package(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE, symlinks=True)
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("cheapinfer-*.whl")
    with zipfile.ZipFile(wheel) as z:
        held = {n for n in z.namelist() if n.startswith(("cheapinfer/", "fixtures/"))}
        [entry_points] = [z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
    source = {p.relative_to(ROOT).as_posix() for d in ("cheapinfer", "fixtures") for p in (ROOT / d).rglob("*")
              if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".toml")}
    assert source - held == set()
    assert "[pytest11]\ncheapinfer = fixtures.plugin" in entry_points, entry_points
