"""``python -m cheapinfer gpu-check``: the one prepared check of a CUDA machine, offline.

It needs the pinned artifacts in the cache already (``python -m cheapinfer fetch`` once, with the network; carry
``CHEAPINFER_CACHE`` over to the GPU machine), and runs, with every download refused:

1. ``pytest tests -m gpu --device cuda``: the suite's own GPU tests (bitsandbytes against the suite's formats);
2. ``python -m cheapinfer verify --device cuda -m gpu``: every device-dependent claim, which writes the run record and
   prints the verdict table.

Then one record, ``gpu-check.json`` in the report folder: the GPU (name, memory, compute capability), its driver,
CUDA, cuDNN and the library versions (:func:`cheapinfer.runtime.device.environment`), each step's command, exit
status and seconds, the run record's path and its verdicts counted. Without CUDA it says so in one line and exits 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from .. import CHECKOUT
from .launch import child_environment

RECORD_NAME = "gpu-check.json"
#: Every download refused: the suite's artifacts and Hugging Face's.
OFFLINE = {"CHEAPINFER_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
NO_CUDA_EXIT = 2


def plan(device: str, out: Path, root: Path = CHECKOUT, passthrough: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """The check's steps, (name, command), in order: the GPU tests, then the device claims through verify."""
    extra = list(passthrough or [])
    return [
        ("tests", [sys.executable, "-m", "pytest", str(root / "tests"), "-m", "gpu", "--device", device, "-q", "-p", "no:cacheprovider",
                   "--report-dir", str(out / "tests"), "-r", "fEs"]),
        ("claims", [sys.executable, "-m", "cheapinfer", "verify", "--device", device, "--report-dir", str(out), *extra, "-m", "gpu"]),
    ]


def verdicts(run_record: Path) -> dict[str, int]:
    """The run record's verdicts counted (claim results; empty where it cannot be read)."""
    try:
        record = json.loads(run_record.read_text(encoding="utf-8"))
        return dict(Counter(r.get("verdict", "?") for c in record.get("claims", {}).values() for r in c.get("results", [])))
    except (OSError, ValueError, AttributeError):
        return {}


def _cached_artifacts() -> str | None:
    """Why the artifacts are not all in the cache (offline), or None."""
    from ..runtime import artifacts

    before = os.environ.get(artifacts.OFFLINE_VARIABLE)
    os.environ[artifacts.OFFLINE_VARIABLE] = "1"
    try:
        for artifact in artifacts.ARTIFACTS.values():
            artifacts.fetch(artifact)
    except (artifacts.ArtifactError, artifacts.ArtifactUnavailable) as exc:
        return str(exc).splitlines()[0]
    finally:
        if before is None:
            os.environ.pop(artifacts.OFFLINE_VARIABLE)
        else:
            os.environ[artifacts.OFFLINE_VARIABLE] = before
    return None


def gpu_check_main(p, args) -> int:
    """``cheapinfer gpu-check`` after its arguments are parsed: the usage checks, the two steps, the record."""
    import subprocess

    if not args.device.startswith("cuda"):
        p.error(f"--device {args.device}: the GPU check runs on CUDA (cuda or cuda:N); verify --device cpu runs the claims on the CPU")
    if not (CHECKOUT / "tests").is_dir() or not (CHECKOUT / "claims").is_dir():
        p.error(f"tests/ and claims/ are not next to the package ({CHECKOUT}); run from a checkout of the suite")
    import torch

    from ..runtime.device import DeviceUnavailable, environment, pick

    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else ("ROCm " + torch.version.hip if torch.version.hip else "a CPU build")
        print(f"cheapinfer gpu-check: needs a CUDA GPU, and torch {torch.__version__} ({build}) sees none: nothing was run", file=sys.stderr)
        return NO_CUDA_EXIT
    try:
        device = pick(args.device)
    except DeviceUnavailable as exc:
        print(f"cheapinfer gpu-check: {exc}", file=sys.stderr)
        return NO_CUDA_EXIT
    missing = _cached_artifacts()
    if missing:
        print(f"cheapinfer gpu-check: runs offline, and the cache lacks an artifact: {missing} (python -m cheapinfer fetch, "
              "once with the network, then carry CHEAPINFER_CACHE over)", file=sys.stderr)
        return NO_CUDA_EXIT
    out = args.report_dir.expanduser().absolute()
    out.mkdir(parents=True, exist_ok=True)
    env = {**child_environment(), **OFFLINE}
    steps, started = [], time.time()
    for name, cmd in plan(str(device), out, passthrough=["--book-model", args.book_model] if args.book_model else None):
        t0 = time.perf_counter()
        try:
            code = subprocess.call(cmd, env=env)
        except KeyboardInterrupt:
            print(f"cheapinfer gpu-check: interrupted during its {name} step; no record written", file=sys.stderr)
            return 130
        steps.append({"step": name, "command": cmd, "exit": code, "seconds": round(time.perf_counter() - t0, 1)})
    run_record = out / "run.json"
    record = {"check": "gpu-check", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
              "seconds": round(time.time() - started, 1), "device": str(device), "environment": dict(environment(device)),
              "steps": steps, "run_record": str(run_record) if run_record.exists() else None,
              "verdicts": verdicts(run_record) if run_record.exists() else {}}
    tmp = out / (RECORD_NAME + ".part")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out / RECORD_NAME)
    gpu = record["environment"]
    print(f"\nGPU check on {gpu.get('gpu', '?')} (capability {gpu.get('gpu_capability', '?')}, driver {gpu.get('driver', '?')}): "
          + "; ".join(f"{s['step']} exit {s['exit']} in {s['seconds']:g} s" for s in steps)
          + f"; verdicts {', '.join(f'{v} {n}' for v, n in sorted(record['verdicts'].items())) or 'none recorded'}\nRecord: {out / RECORD_NAME}")
    return max(s["exit"] for s in steps)

