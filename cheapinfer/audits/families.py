"""The CPU kernel families of ``cheapinfer isa`` (:mod:`cheapinfer.audits.matrix`): the caps that make
this CPU dispatch like a smaller one, the probe that records what actually ran, and the check that a cap
took effect (a cap that silently did nothing is reported, not trusted).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

# ----------------------------------------------------------------------------------------------
# kernel families
# ----------------------------------------------------------------------------------------------

#: Kernel levels, lowest first, as the probe reads them from each library.
SCALAR, AVX2, AVX512, AVX512_BF16, AMX = "scalar", "AVX2", "AVX-512", "AVX-512 BF16", "AMX"
LEVELS = (SCALAR, AVX2, AVX512, AVX512_BF16, AMX)
#: The libraries whose kernels a cap selects: what each runs in the suite.
LIBRARIES = {
    "aten": "ATen",  # torch's own vectorised kernels: attention, reductions, elementwise, the low-bit packs
    "onednn": "oneDNN",  # bf16 and int8 matmuls (the serving dtype of BAT-*), and torch's native-bf16 check
    "mkl": "MKL",  # fp32 GEMM: the twin's and the stand-in's matmuls
}


@dataclass(frozen=True)
class Family:
    """A CPU kernel family: the caps that make this machine dispatch like a CPU of that family."""

    name: str
    like: str  # the CPUs it stands for
    caps: dict[str, str] = field(default_factory=dict)  # variable -> value; none: the machine's own kernels
    needs: tuple[str, ...] = ()  # torch.cpu._is_<x>_supported checks this CPU must pass to run it
    expect: dict[str, str] = field(default_factory=dict)  # library -> the level its kernels must run at


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("avx2", "a CPU without AVX-512 (desktop CPUs, older AMD): fp32 everywhere, bf16 not native",
           {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
           ("avx2",), {"aten": AVX2, "onednn": AVX2, "mkl": AVX2}),
    Family("avx512", "AVX-512 without bf16 instructions (Skylake, Cascade Lake): bf16 matmuls emulated",
           {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
           ("avx512",), {"aten": AVX512, "onednn": AVX512, "mkl": AVX512}),
    Family("avx512-bf16", "AVX-512 BF16 without AMX (Cooper Lake, AMD Zen 4)",
           {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512_E3"},
           ("avx512", "avx512_bf16"), {"aten": AVX512, "onednn": AVX512_BF16, "mkl": AVX512_BF16}),
    Family("default", "this machine's own kernels (no cap)"),
)}
_NEEDS_TEXT = {"avx2": "AVX2", "avx512": "AVX-512 (F, BW, VL, DQ)", "avx512_bf16": "AVX-512 BF16", "amx_tile": "AMX"}
#: The verbose switches of the probe; never passed to a claims run.
_VERBOSE = ("ONEDNN_VERBOSE", "DNNL_VERBOSE", "MKL_VERBOSE")

#: Run under a family's caps with oneDNN's and MKL's verbose output on: what each library dispatches to.
PROBE = r"""
import json, platform, torch
out = {"aten": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine(),
       "has": {"onednn": torch.backends.mkldnn.is_available(), "mkl": torch.backends.mkl.is_available()},
       "supports": {n: bool(getattr(torch.cpu, "_is_%s_supported" % n, lambda: False)()) for n in ("avx2", "avx512", "avx512_bf16", "amx_tile")}}
if out["has"]["onednn"]:
    torch._C._nn.mkldnn_linear(torch.randn(4, 64).to_mkldnn(), torch.randn(64, 64).to_mkldnn())  # an fp32 oneDNN primitive: it names its ISA
    out["bf16_native"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # what models.serving_dtype asks
    torch.nn.functional.linear(torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, 64, dtype=torch.bfloat16))  # a bf16 matmul
torch.mm(torch.randn(64, 64), torch.randn(64, 64))  # an fp32 GEMM: MKL's, where torch has it
print("cheapinfer-probe " + json.dumps(out), flush=True)
"""
_PROBE_MARK = "cheapinfer-probe "


def level(text: str | None) -> str | None:
    """The kernel level a library's own words name (ATen's capability, oneDNN's ISA line, MKL's banner)."""
    if not text:
        return None
    t = text.upper()
    if "AMX" in t:
        return AMX
    if "AVX-512" in t or "AVX512" in t or "AVX10" in t:
        return AVX512_BF16 if "BFLOAT16" in t or "BF16" in t else AVX512
    if "AVX2" in t:
        return AVX2
    if t == "DEFAULT":
        return SCALAR
    return text


def parse_probe(text: str) -> dict[str, Any]:
    """The probe's findings from its standard output: its JSON line, oneDNN's ISA and kernels, MKL's ISA.

    ValueError when the probe printed no result (it crashed before its end)."""
    found = None
    onednn_isa = mkl_isa = None
    kernels: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith(_PROBE_MARK):
            found = json.loads(line[len(_PROBE_MARK):])
        elif line.startswith(("onednn_verbose", "dnnl_verbose")):
            f = line.split(",")
            if "isa:" in line and "info" in f:
                onednn_isa = line.split("isa:", 1)[1].strip()
            elif "exec" in f:
                i = f.index("exec")
                if f[i + 1:i + 2] == ["cpu"] and len(f) > i + 3 and f[i + 2] in ("matmul", "inner_product"):
                    src = next((x for x in f[i + 4:] if x.startswith("src:")), "src:?")
                    kernels.setdefault(f"{src.split(':')[1]} {f[i + 2]}", f[i + 3])
        elif line.startswith("MKL_VERBOSE") and " architecture " in line:
            mkl_isa = re.sub(r",\s*(Lnx|Win|Mac|Linux|Windows)\b.*$", "", line.split(" architecture ", 1)[1]).strip()
    if found is None:
        raise ValueError("the probe printed no result")
    return {**found, "onednn_isa": onednn_isa, "onednn_kernels": kernels, "mkl_isa": mkl_isa}


def probe(env: dict[str, str], timeout: float = 180.0) -> dict[str, Any]:
    """:data:`PROBE` in a fresh interpreter with ``env`` (plus the verbose switches): what ran, or ``{"error": why}``."""
    env = {**env, "ONEDNN_VERBOSE": "1", "MKL_VERBOSE": "1"}
    try:
        run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"the probe did not end within {timeout:.0f} s"}
    try:
        return parse_probe(run.stdout)
    except ValueError:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the probe failed (exit {run.returncode}: {tail})"}


def available(family: Family, found: dict[str, Any]) -> str | None:
    """Why ``family`` cannot run on this CPU (its caps would name instructions it lacks), or None when it can.

    ``found``: the probe of the machine's own kernels (its ``supports`` are the CPU's, whatever a cap says)."""
    if not family.needs:
        return None
    if "error" in found:
        return f"cannot tell: {found['error']}"
    if found.get("machine", "").lower() not in ("x86_64", "amd64", "i686", "i386", "x86"):
        return f"not an x86 CPU ({found.get('machine') or 'unknown'})"
    missing = [_NEEDS_TEXT.get(n, n) for n in family.needs if not found.get("supports", {}).get(n)]
    return f"this CPU lacks {', '.join(missing)}" if missing else None


def ran(found: dict[str, Any]) -> dict[str, str | None]:
    """Library -> the level its kernels ran at in the probe (None: it printed nothing to tell)."""
    return {"aten": level(found.get("aten")), "onednn": level(found.get("onednn_isa")), "mkl": level(found.get("mkl_isa"))}


def cap_check(family: Family, found: dict[str, Any], run_env: dict[str, Any] | None = None,
              own: dict[str, Any] | None = None) -> dict[str, Any]:
    """Did ``family``'s caps take effect? ``in_effect``: True, False (a cap that did nothing, or could not be
    seen to work: not trusted), or None (no cap: the machine's own kernels); ``ran``: library -> level;
    ``text``: one line. ``run_env``: the environment of the claims run itself, whose ``cpu_capability`` is ATen's
    in that process. ``own``: the probe without a cap. A library whose words name no level, capped and uncapped
    alike (MKL on a CPU it does not dispatch by ISA prints "Intel(R) Architecture processors"), cannot be seen to
    obey its cap: the column is not trusted, and the text says why."""
    if "error" in found:
        return {"in_effect": False if family.expect else None, "ran": {}, "text": found["error"]}
    levels = ran(found)
    own_levels = ran(own) if own and "error" not in own else {}
    wrong, notes = [], []
    for lib, want in family.expect.items():
        if not found.get("has", {}).get(lib, True):
            notes.append(f"{LIBRARIES[lib]} is not in this torch build")
        elif levels[lib] is None:
            wrong.append(f"{LIBRARIES[lib]} printed nothing to tell which kernels ran")
        elif levels[lib] not in LEVELS:
            same = " (the same without a cap)" if own_levels.get(lib) == levels[lib] else ""
            wrong.append(f"{LIBRARIES[lib]} names no ISA level on this CPU ({levels[lib]!r}{same}): whether it obeyed its cap cannot be seen")
        elif levels[lib] != want:
            wrong.append(f"{LIBRARIES[lib]} ran {levels[lib]}, not {want}")
    if run_env and run_env.get("cpu_capability") and "aten" in family.expect and level(run_env["cpu_capability"]) != family.expect["aten"]:
        wrong.append(f"the claims run's ATen ran {level(run_env['cpu_capability'])}, not {family.expect['aten']}")
    shown = [f"{LIBRARIES[lib]} {levels[lib] or '?'}" for lib in LIBRARIES if found.get("has", {}).get(lib, True)]
    kernels = found.get("onednn_kernels") or {}
    if kernels:
        shown.append("oneDNN kernels: " + ", ".join(f"{k} {v}" for k, v in sorted(kernels.items())))
    if "bf16_native" in found:
        shown.append(f"native bf16 {'yes' if found['bf16_native'] else 'no'}")
    what = "; ".join(shown + notes)
    if not family.expect:
        return {"in_effect": None, "ran": levels, "text": f"no cap: {what}"}
    if wrong:
        return {"in_effect": False, "ran": levels, "text": f"cap NOT in effect ({'; '.join(wrong)}): {what}"}
    return {"in_effect": True, "ran": levels, "text": f"cap in effect: {what}"}


def family_env(family: Family, base: dict[str, str]) -> dict[str, str]:
    """``base`` without any cap or verbose switch of its own, with ``family``'s caps."""
    from ..runtime.profiles import ISA_VARIABLES

    env = {k: v for k, v in base.items() if k not in ISA_VARIABLES and k not in _VERBOSE}
    return {**env, **family.caps}
