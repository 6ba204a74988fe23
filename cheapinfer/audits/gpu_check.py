"""``python -m cheapinfer gpu-check``: the one prepared check of a CUDA machine, offline.

It needs the pinned artifacts in the cache already (``python -m cheapinfer fetch`` once, with the network; carry
``CHEAPINFER_CACHE`` over to the GPU machine), and runs, with every download refused, each through the one launcher
(:func:`cheapinfer.audits.launch.run_claims`, Ctrl-C passed on, SIGTERM stopping the running step):

1. ``pytest tests -m gpu --device cuda``: the suite's own GPU tests (bitsandbytes against the suite's formats);
2. ``pytest claims -m gpu --device cuda``, as ``python -m cheapinfer verify --device cuda -m gpu`` runs it: every
   device-dependent claim, which writes the run record; the verdict table is printed.

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
from typing import Iterator

from .. import CHECKOUT
from .launch import Interrupted, Runner, child_environment, claims_args, claims_outcome, interruptible, run_claims, warn_memory

RECORD_NAME = "gpu-check.json"
#: Every download refused: the suite's artifacts and Hugging Face's.
OFFLINE = {"CHEAPINFER_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
NO_CUDA_EXIT = 2


#: The check's steps, (name, folder of the checkout, what its pytest is given besides the device's and the report folder).
STEPS = (("tests", "tests", ["-m", "gpu", "-r", "fEs"]), ("claims", "claims", ["-m", "gpu", "-r", "fE"]))


def step_dir(name: str, out: Path) -> Path:
    """Where a step's pytest writes: ``out/tests`` for the GPU tests; ``out`` itself for the claims (its run record)."""
    return out / "tests" if name == "tests" else out


def step_args(name: str, device: str, book_model: str | None = None) -> list[str]:
    """What the step ``name``'s pytest is given besides its folder and report folder (:func:`claims_args` adds those)."""
    extra = ["--device", device] + (["--book-model", book_model] if book_model and name == "claims" else [])
    return extra + dict((n, a) for n, _, a in STEPS)[name]


def plan(device: str, out: Path, book_model: str | None = None) -> list[tuple[str, list[str]]]:
    """The check's steps, (name, the pytest command line it runs), in order: the GPU tests, then the device claims."""
    return [(name, [sys.executable, "-m", "pytest", *claims_args(None, step_dir(name, out), pytest_args=step_args(name, device, book_model),
                                                                   folder=folder)]) for name, folder, _ in STEPS]


def run_steps(device: str, out: Path, book_model: str | None = None, runner: Runner | None = None) -> Iterator[dict]:
    """Each step of :func:`plan` in turn, offline, through :func:`cheapinfer.audits.launch.run_claims`: (step, command,
    exit, seconds), once it ended. After the claims step its verdict table, as ``verify`` prints it.
    :class:`~cheapinfer.audits.launch.Interrupted` when Ctrl-C ended a step: no step starts after it."""
    env = {**child_environment(), **OFFLINE}
    for (name, folder, _), (_, cmd) in zip(STEPS, plan(device, out, book_model)):
        if name == "claims":
            warn_memory(out, device, "cheapinfer gpu-check")
        got = run_claims(None, step_dir(name, out), env=env, pytest_args=step_args(name, device, book_model), runner=runner, folder=folder)
        if got.interrupted:
            raise Interrupted(f"during its {name} step")
        code = claims_outcome(got, out, "cheapinfer gpu-check") if name == "claims" else got.exit_status
        yield {"step": name, "command": cmd, "exit": code, "seconds": got.seconds}


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


def gpu_check_main(p, args, runner: Runner | None = None) -> int:
    """``cheapinfer gpu-check`` after its arguments are parsed: the usage checks, the two steps, the record. Ctrl-C is
    exit 130 and SIGTERM 143, one line each, the running step stopped (:func:`cheapinfer.audits.launch.interruptible`)."""
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
    started = time.time()
    steps: list[dict] = []

    def body() -> int:
        for step in run_steps(str(device), out, args.book_model, runner):
            steps.append(step)
        return 0

    def say(how: str, kept: str | None) -> str:
        return f"cheapinfer gpu-check: {how} {kept or f'during its {STEPS[len(steps)][0]} step'}; no record written"

    code = interruptible(body, say)
    if code:
        return code
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

