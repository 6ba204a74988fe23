"""The suite's checks of its own verdicts (cheapinfer.audits.matrix): the claim x kernel-family table, its flips, the
verdicts that moved under stress, the probe of what a cap made run, and the busy processes beside a run.

Records are made up here with ``record.build`` from measurements judged by the registry; the one real run
(a tiny matrix of one clocked claim in two families) is marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from commands import cheapinfer

from cheapinfer.audits import families as kernel_families
from cheapinfer.audits import matrix, stress
from cheapinfer.audits.launch import Terminated
from cheapinfer.harness import record as records
from cheapinfer.harness import registry, schema, store
from cheapinfer.harness.record import Recorder

ROOT = Path(__file__).resolve().parent.parent
ENV = {"cpu": "Example CPU", "gpu": "none", "torch": "2.13.0", "transformers": "5.24.0", "bitsandbytes": "0.50.2"}
TESTED = {"KV-DECODE-FLAT": ["t.py"], "KV-HEAD-TIMING": ["t.py"]}


def record(step_ratio: float = 1.05, se: float = 0.01, growth: float = 8.0, load: dict | None = None, env: dict | None = None) -> dict:
    """A made-up run of two clocked claims: KV-DECODE-FLAT (a noisy check: step_ratio < 1.25 beyond 3 standard errors)
    and KV-HEAD-TIMING (ratio_growth > 2)."""
    rec = Recorder()
    rec.verify("KV-DECODE-FLAT", "twin", "cpu", {"step_ratio": step_ratio, "step_ratio_se": se, "rounds": 7, "cache_grows_by_one": True,
                                                 "logit_change_vs_no_context": 1.0, "timed_forwards": 1, "timed_forwards_max": 1}, load=load or {})
    rec.verify("KV-HEAD-TIMING", "twin", "cpu", {"ratio_growth": growth, "ratio_at_4096": 200.0, "cached_score_rows": 1}, load=load or {})
    return records.build([r.to_dict() for r in rec.results], dict(env or ENV), {"device": "cpu", "created": "2026-01-01T00:00:00Z"}, TESTED)


CLAIMS = ["KV-DECODE-FLAT", "KV-HEAD-TIMING"]


# ----------------------------------------------------------------------------------------------
# cells: the verdict and the value that decided it
# ----------------------------------------------------------------------------------------------


def test_a_passing_cell_shows_the_check_closest_to_its_bound():
    c = matrix.cell(record(growth=2.5)["claims"]["KV-HEAD-TIMING"])  # 2.5 vs > 2 is 25% from its bound; 200 vs > 10 is far
    assert c["verdict"] == "shape holds" and c["q"] == "ratio_growth" and c["measured"] == 2.5 and c["profile"] == "twin"
    assert matrix.cell_text(c) == "shape holds: ratio_growth 2.5 (> 2) [twin]"


def test_a_deviating_cell_shows_the_failed_check_and_an_inconclusive_one_its_noise():
    red = matrix.cell(record(step_ratio=1.6)["claims"]["KV-DECODE-FLAT"])
    assert red["verdict"] == "deviates" and red["q"] == "step_ratio" and red["measured"] == 1.6
    assert matrix.cell_text(red) == "**deviates**: step_ratio 1.6 ± 0.01 (< 1.25) [twin]"
    undecided = matrix.cell(record(step_ratio=1.2, se=0.1)["claims"]["KV-DECODE-FLAT"])
    assert undecided["verdict"] == "inconclusive" and undecided["se"] == 0.1
    assert matrix.cell_text(undecided) == "inconclusive: step_ratio 1.2 ± 0.1 (< 1.25) [twin]"


def test_cells_of_a_missing_record_an_unselected_test_and_an_error_say_so():
    assert matrix.cell(None) == {"verdict": "no record"}
    unselected = records.build([], dict(ENV), {"device": "cpu"}, TESTED)["claims"]["KV-HEAD-TIMING"]
    assert matrix.cell(unselected) == {"verdict": "not run", "reason": "its test was not selected in this run"}
    errored = record()
    errored["claims"]["KV-HEAD-TIMING"]["verdict"] = "not run"
    errored["claims"]["KV-HEAD-TIMING"]["results"][0].update(verdict="not run", reason="error before a verdict: RuntimeError: boom", harness_error=True)
    assert matrix.cell(errored["claims"]["KV-HEAD-TIMING"])["verdict"] == "error"


# ----------------------------------------------------------------------------------------------
# the table and its flips
# ----------------------------------------------------------------------------------------------


def test_the_table_has_a_cell_per_claim_and_family_and_an_unavailable_family_says_why():
    tab = matrix.table({"avx2": record(), "avx512": None, "default": record()}, CLAIMS, {"avx512": "this CPU lacks AVX-512 (F, BW, VL, DQ)"})
    assert list(tab) == CLAIMS and list(tab["KV-HEAD-TIMING"]) == ["avx2", "avx512", "default"]
    assert tab["KV-HEAD-TIMING"]["avx512"] == {"verdict": "not available here", "reason": "this CPU lacks AVX-512 (F, BW, VL, DQ)"}
    assert matrix.flips(tab) == []


def test_green_in_one_family_and_deviates_in_another_is_a_flip_naming_both():
    tab = matrix.table({"avx2": record(step_ratio=1.6), "default": record()}, CLAIMS)
    [flip] = matrix.flips(tab)
    assert flip["claim"] == "KV-DECODE-FLAT" and list(flip["green"]) == ["default"] and list(flip["red"]) == ["avx2"]
    line = matrix.flip_line(flip)
    assert line.startswith("FLIP KV-DECODE-FLAT: green on default, red on avx2") and "step_ratio 1.6" in line and "step_ratio 1.05" in line


def test_inconclusive_not_run_and_the_same_red_everywhere_are_no_flips():
    undecided = matrix.table({"avx2": record(step_ratio=1.2, se=0.1), "default": record()}, CLAIMS)
    assert undecided["KV-DECODE-FLAT"]["avx2"]["verdict"] == "inconclusive" and matrix.flips(undecided) == []
    red_everywhere = matrix.table({"avx2": record(step_ratio=1.6), "default": record(step_ratio=1.7)}, CLAIMS)
    assert matrix.flips(red_everywhere) == []
    norecord = matrix.table({"avx2": None, "default": record()}, CLAIMS)
    assert matrix.flips(norecord) == []


def test_an_error_in_one_family_beside_a_green_one_is_a_flip():
    errored = record()
    errored["claims"]["KV-HEAD-TIMING"]["verdict"] = "not run"
    errored["claims"]["KV-HEAD-TIMING"]["results"][0].update(verdict="not run", reason="error before a verdict: Illegal instruction", harness_error=True)
    [flip] = matrix.flips(matrix.table({"avx2": errored, "default": record()}, CLAIMS))
    assert flip["claim"] == "KV-HEAD-TIMING" and flip["red"]["avx2"]["verdict"] == "error"


def test_the_markdown_matrix_begins_with_its_mark_and_lists_families_cells_and_flips():
    tab = matrix.table({"avx2": record(step_ratio=1.6), "default": record()}, CLAIMS)
    m = {"created": "2026-01-01T00:00:00Z", "machine": "Example CPU", "seconds": 12.0, "claims": tab, "flips": matrix.flips(tab),
         "families": {"avx2": {"like": "no AVX-512", "caps": {"ATEN_CPU_CAPABILITY": "avx2"}, "cap": {"text": "cap in effect: ATen AVX2"},
                               "exit_status": 1, "seconds": 6.0, "record": "isa/avx2/runs/x.json"},
                      "default": {"like": "own", "caps": {}, "cap": {"text": "no cap: ATen AVX-512"}, "exit_status": 0, "seconds": 6.0, "record": "r"}}}
    md = matrix.matrix_markdown(m)
    assert md.splitlines()[0] == matrix.MATRIX_MARK
    assert "| avx2 | no AVX-512 | ATEN_CPU_CAPABILITY=avx2 | cap in effect: ATen AVX2 | 1 | 6 | isa/avx2/runs/x.json |" in md
    assert "| KV-DECODE-FLAT | **deviates**: step_ratio 1.6 ± 0.01 (< 1.25) [twin] | shape holds: step_ratio 1.05 ± 0.01 (< 1.25) [twin] |" in md
    assert "- FLIP KV-DECODE-FLAT: green on default, red on avx2" in md


# ----------------------------------------------------------------------------------------------
# verdicts that moved under stress
# ----------------------------------------------------------------------------------------------


BUSY_LOAD = {"loadavg_before": [4.1, 3.0, 2.0], "loadavg_after": [4.6, 3.2, 2.1], "cpus": 2, "steal_fraction": 0.02}
QUIET_LOAD = {"loadavg_before": [0.5, 0.4, 0.3], "loadavg_after": [1.1, 0.5, 0.3], "cpus": 2, "steal_fraction": 0.0}


def test_green_quietly_and_red_under_stress_is_a_failure_and_inconclusive_is_counted_apart():
    quiet = record(load=QUIET_LOAD)
    rows = {r["claim"]: r for r in matrix.moved(quiet, record(step_ratio=1.6, growth=8.0, load=BUSY_LOAD), CLAIMS)}
    assert rows["KV-DECODE-FLAT"]["moved"] == matrix.RED_UNDER_STRESS and rows["KV-HEAD-TIMING"]["moved"] == matrix.SAME
    rows = {r["claim"]: r for r in matrix.moved(quiet, record(step_ratio=1.2, se=0.1, load=BUSY_LOAD), CLAIMS)}
    assert rows["KV-DECODE-FLAT"]["moved"] == matrix.INCONCLUSIVE_UNDER_STRESS
    assert rows["KV-DECODE-FLAT"]["quiet"]["verdict"] == "shape holds" and rows["KV-DECODE-FLAT"]["stressed"]["verdict"] == "inconclusive"


def test_inconclusive_quietly_and_red_under_stress_is_a_failure_too_and_red_to_green_is_a_change():
    """As compare judges it: a measurement that now decides red was not red before."""
    rows = {r["claim"]: r for r in matrix.moved(record(step_ratio=1.2, se=0.1), record(step_ratio=1.6), CLAIMS)}
    assert rows["KV-DECODE-FLAT"]["moved"] == matrix.RED_UNDER_STRESS
    rows = {r["claim"]: r for r in matrix.moved(record(step_ratio=1.6), record(), CLAIMS)}
    assert rows["KV-DECODE-FLAT"]["moved"] == matrix.CHANGED


def test_the_load_of_a_run_is_read_from_its_results():
    span = matrix.load_span(record(load=BUSY_LOAD), CLAIMS)
    assert span == {"loadavg_1min": [4.1, 4.6], "steal_max": 0.02, "cpus": 2}
    assert matrix.load_text(span) == "load average (1 min) 4.1 to 4.6 on 2 CPUs, CPU steal up to 2.0%"
    assert matrix.load_span(record(), CLAIMS)["loadavg_1min"] is None


def test_the_stress_summary_names_each_claim_and_both_loads(tmp_path):
    """stress() with a made-up claims run: the quiet record given, the stressed one written by the fake run."""
    stressed = record(step_ratio=1.2, se=0.1, load=BUSY_LOAD)

    def run(cmd, env):
        out = Path(cmd[cmd.index("--report-dir") + 1])
        stressed["run"]["id"] = env[store.RUN_ID_VARIABLE]
        store.keep(stressed, out)
        return 0, False

    s = stress.stress(CLAIMS, 1, tmp_path, runner=run, quiet_record=record(load=QUIET_LOAD), quiet_source="quiet.json", echo=lambda _: None)
    assert s["inconclusive_under_stress"] == ["KV-DECODE-FLAT"] and s["red_under_stress"] == []
    text = "\n".join(stress.stress_lines(s))
    assert "| KV-DECODE-FLAT | shape holds: step_ratio 1.05 ± 0.01 (< 1.25) [twin] | inconclusive: step_ratio 1.2 ± 0.1 (< 1.25) [twin] | inconclusive under stress |" in text
    assert "Quiet run: load average (1 min) 0.5 to 1.1 on 2 CPUs" in text and "Stressed run: load average (1 min) 4.1 to 4.6" in text
    assert "not quiet" not in text
    s["quiet"]["load"] = matrix.load_span(record(load=BUSY_LOAD), CLAIMS)
    assert "WARNING: the quiet run was not quiet (load average up to 4.6 on 2 CPUs)" in "\n".join(stress.stress_lines(s))


# ----------------------------------------------------------------------------------------------
# the probe: what a cap made each library run
# ----------------------------------------------------------------------------------------------

PROBE_AVX2 = """MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors, Lnx 2.60GHz lp64 gnu_thread
MKL_VERBOSE SGEMM(N,N,64,64,64,0x1,0x2,64,0x3,64,0x4,0x5,64) 17.36ms CNR:OFF Dyn:1 FastMM:1 TID:0  NThr:2
onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71049cd69a3df32adcccb623b12cd7baa22)
onednn_verbose,v1,info,cpu,isa:Intel AVX2
onednn_verbose,v1,primitive,exec,cpu,reorder,jit_direct_copy:uni,undef,src:f32::blocked:ab::f0 dst:f32::blocked:ab::f0,attr-scratchpad:user,,4x64,5.2
onednn_verbose,v1,primitive,exec,cpu,inner_product,brg_matmul:avx2,forward_training,src:f32:a:blocked:ab::f0 wei:f32:a:blocked:ab::f0,,,mb4ic64oc64,1.2
cheapinfer-probe {"aten": "AVX2", "machine": "x86_64", "has": {"onednn": true, "mkl": true}, "supports": {"avx2": true, "avx512": true, "avx512_bf16": false, "amx_tile": false}, "bf16_native": false}
"""


def test_the_probe_reads_each_librarys_own_words():
    found = kernel_families.parse_probe(PROBE_AVX2)
    assert found["onednn_isa"] == "Intel AVX2" and found["onednn_kernels"] == {"f32 inner_product": "brg_matmul:avx2"}
    assert found["mkl_isa"] == "Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors"
    assert kernel_families.ran(found) == {"aten": "AVX2", "onednn": "AVX2", "mkl": "AVX2"}
    with pytest.raises(ValueError):
        kernel_families.parse_probe("Illegal instruction (core dumped)\n")


@pytest.mark.parametrize("text, level", [
    ("Intel AVX10.1 and Intel AMX with bfloat16 and 8-bit integer support", "AMX"),
    ("Intel AVX-512 with Intel DL Boost and bfloat16 support", "AVX-512 BF16"),
    ("Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions", "AVX-512"),
    ("Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with support of Intel(R) Deep Learning Boost (Intel(R) DL Boost) and bfloat16", "AVX-512 BF16"),
    ("AVX512", "AVX-512"), ("AVX2", "AVX2"), ("DEFAULT", "scalar"), (None, None),
], ids=lambda v: str(v)[:24])
def test_levels_are_read_from_oneDNN_MKL_and_ATen_words(text, level):
    assert kernel_families.level(text) == level


def test_a_cap_that_did_nothing_is_reported_not_trusted():
    avx2 = kernel_families.FAMILIES["avx2"]
    assert kernel_families.cap_check(avx2, kernel_families.parse_probe(PROBE_AVX2))["in_effect"] is True
    amx_mkl = PROBE_AVX2.replace("Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors",
                                 "Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with support for INT8, BF16, FP16 (limited) "
                                 "instructions, and Intel(R) Advanced Matrix Extensions (Intel(R) AMX) with INT8 and BF16")
    check = kernel_families.cap_check(avx2, kernel_families.parse_probe(amx_mkl))
    assert check["in_effect"] is False and check["text"].startswith("cap NOT in effect (MKL ran AMX, not AVX2)")
    silent = "\n".join(line for line in PROBE_AVX2.splitlines() if not line.startswith("onednn"))
    assert "oneDNN printed nothing to tell" in kernel_families.cap_check(avx2, kernel_families.parse_probe(silent))["text"]
    run_aten = kernel_families.cap_check(avx2, kernel_families.parse_probe(PROBE_AVX2), {"cpu_capability": "AVX512"})
    assert run_aten["in_effect"] is False and "the claims run's ATen ran AVX-512, not AVX2" in run_aten["text"]
    assert kernel_families.cap_check(kernel_families.FAMILIES["default"], kernel_families.parse_probe(PROBE_AVX2))["in_effect"] is None


def test_an_mkl_that_names_no_isa_capped_or_not_leaves_the_cap_untrusted_and_says_why():
    """MKL on an AMD CPU prints "Intel(R) Architecture processors" with and without MKL_ENABLE_INSTRUCTIONS."""
    generic = PROBE_AVX2.replace("Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors", "Intel(R) Architecture processors")
    found = kernel_families.parse_probe(generic)
    check = kernel_families.cap_check(kernel_families.FAMILIES["avx2"], found, own=found)
    assert check["in_effect"] is False
    assert "MKL names no ISA level on this CPU ('Intel(R) Architecture processors' (the same without a cap))" in check["text"]


def test_a_family_this_cpu_lacks_is_not_available_here():
    found = kernel_families.parse_probe(PROBE_AVX2)  # avx512_bf16: false
    assert kernel_families.available(kernel_families.FAMILIES["avx512"], found) is None
    assert kernel_families.available(kernel_families.FAMILIES["avx512-bf16"], found) == "this CPU lacks AVX-512 BF16"
    assert kernel_families.available(kernel_families.FAMILIES["avx2"], {**found, "machine": "aarch64"}) == "not an x86 CPU (aarch64)"
    assert kernel_families.available(kernel_families.FAMILIES["default"], {"error": "the probe failed"}) is None


def test_a_familys_environment_drops_the_callers_caps_and_verbose_switches():
    base = {"PATH": "/bin", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_VERBOSE": "1", "ATEN_CPU_CAPABILITY": "default"}
    assert kernel_families.family_env(kernel_families.FAMILIES["default"], base) == {"PATH": "/bin"}
    assert kernel_families.family_env(kernel_families.FAMILIES["avx512"], base) == {"PATH": "/bin", **kernel_families.FAMILIES["avx512"].caps}


def _fake_isa(monkeypatch, runs: dict[str, dict | None]):
    """isa_main's pieces made up: the probe reads PROBE_AVX2 (this "CPU" lacks AVX-512 BF16), and each family's claims
    run keeps the record ``runs`` gives it (None: it writes none)."""
    monkeypatch.setattr(kernel_families, "probe", lambda env: kernel_families.parse_probe(PROBE_AVX2 if env.get("ATEN_CPU_CAPABILITY") == "avx2" else
                                                                        PROBE_AVX2.replace('"aten": "AVX2"', '"aten": "AVX512"')))

    def run(cmd, env):
        out = Path(cmd[cmd.index("--report-dir") + 1])
        rec = runs[out.name]
        if rec is not None:
            rec["run"]["id"] = env[store.RUN_ID_VARIABLE]
            rec["environment"]["cpu_capability"] = "AVX2" if env.get("ATEN_CPU_CAPABILITY") == "avx2" else "AVX512"
            store.keep(rec, out)
        return (0 if rec else 3), False

    return run


def test_isa_main_names_each_flip_writes_the_matrix_and_exits_1(tmp_path, monkeypatch, capsys):
    run = _fake_isa(monkeypatch, {"avx2": record(step_ratio=1.6), "default": record()})
    code = matrix.isa_main(CLAIMS, ["avx2", "avx512-bf16", "default"], tmp_path, runner=run)
    out = capsys.readouterr().out
    assert code == 1 and "FLIP KV-DECODE-FLAT: green on default, red on avx2" in out
    m = json.loads((tmp_path / "matrix.json").read_text())
    assert m["families"]["avx2"]["cap"]["in_effect"] is True and m["families"]["default"]["cap"]["in_effect"] is None
    assert m["families"]["avx512-bf16"]["unavailable"] == "this CPU lacks AVX-512 BF16"
    assert m["claims"]["KV-HEAD-TIMING"]["avx512-bf16"]["verdict"] == "not available here"
    assert (tmp_path / "matrix.md").read_text().startswith(matrix.MATRIX_MARK)


def test_isa_main_exits_0_when_the_families_agree_and_1_when_one_wrote_no_record(tmp_path, monkeypatch, capsys):
    assert matrix.isa_main(CLAIMS, ["avx2", "default"], tmp_path / "a", runner=_fake_isa(monkeypatch, {"avx2": record(), "default": record()})) == 0
    assert "2 claim(s) x 2 families (avx2, default)" in capsys.readouterr().out
    assert matrix.isa_main(CLAIMS, ["avx2", "default"], tmp_path / "b", runner=_fake_isa(monkeypatch, {"avx2": None, "default": record()})) == 1
    assert "NO RECORD: avx2: its claims run wrote no record (pytest exit 3)" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# which claims
# ----------------------------------------------------------------------------------------------


def test_the_matrix_claims_are_the_clocked_ones_and_those_measured_on_a_model_but_not_arithmetic():
    from cheapinfer.harness.registry import clocked_claims

    claims, reg = matrix.isa_claims(), registry.load()
    assert set(clocked_claims()) <= set(claims)
    assert "KV-IDENTITY" in claims and "EVAL-TABLE" in claims  # numbers from a model's forward passes
    assert not [c for c in claims if set(reg[c].runs_on) <= {"arithmetic", "book"}]
    assert matrix.stress_claims() == [c for c in reg if c in clocked_claims()]
    with pytest.raises(ValueError, match="KV-BYTES-FORMULA: not clocked"):
        matrix.select("KV-BYTES-FORMULA", matrix.stress_claims(), "clocked")
    assert matrix.select(" KV-HEAD-TIMING,KV-DECODE-FLAT", matrix.stress_claims(), "clocked") == ["KV-HEAD-TIMING", "KV-DECODE-FLAT"]


# ----------------------------------------------------------------------------------------------
# busy processes: killed at the end, however it ends; none outlives its parent
# ----------------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_busy_processes_run_during_the_block_and_are_gone_after_it_also_after_an_error():
    with stress.busy(2) as pids:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    assert not any(_alive(p) for p in pids)
    with pytest.raises(KeyboardInterrupt):
        with stress.busy(1) as pids:
            raise KeyboardInterrupt
    assert not _alive(pids[0])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_busy_process_ends_at_its_deadline_and_when_its_parent_is_gone():
    with stress.busy(1, seconds=0.5) as pids:
        deadline = time.monotonic() + 30
        while _alive(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pids[0])
    # A parent killed with SIGKILL runs no cleanup: its busy child sees it gone and ends by itself.
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from cheapinfer.audits import stress\n"
            "with stress.busy(1) as pids:\n    print(pids[0], flush=True); time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code, str(ROOT)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigterm_during_a_stressed_run_stops_the_busy_processes_and_is_one_line(tmp_path, capsys):
    """The claims run is a fake that raises as the SIGTERM handler would; the busy processes must be gone after."""
    seen = []

    def run(cmd, env):
        seen.extend(p for p in os.listdir("/proc") if p.isdigit() and _alive(int(p)) and _is_busy(int(p)))
        raise Terminated()

    code = stress.stress_main(CLAIMS, 2, tmp_path, runner=run, quiet_record=record(), quiet_source="quiet.json")
    assert code == 143 and len(seen) >= 2 and not any(_alive(int(p)) for p in seen)
    assert capsys.readouterr().err.strip() == ("cheapinfer stress: terminated (SIGTERM); the running claims run was stopped; "
                                               "no summary was written")
    assert not (tmp_path / "stress.json").exists()


def _is_busy(pid: int) -> bool:
    """A busy process of this test's own (its parent is this process)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            ppid = int(f.read().split(")")[-1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return ppid == os.getpid() and b"signal.SIG_IGN" in f.read()
    except (OSError, ValueError):
        return False


# ----------------------------------------------------------------------------------------------
# the command, end to end (a tiny real matrix)
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tiny_isa_matrix_runs_each_family_and_writes_its_table(tmp_path, capfd):
    """One fast clocked claim under the AVX2 cap and under the machine's own kernels: 47 s on 2 cores at load 9, over a minute when busier."""
    run = cheapinfer(capfd, "verify", "--isa-matrix", "--claims", "KV-HEAD-TIMING", "--families", "avx2,default", "--report-dir", str(tmp_path))
    m = json.loads((tmp_path / "isa" / "matrix.json").read_text())
    assert run.returncode == (1 if m["flips"] else 0), run.stdout[-3000:] + run.stderr[-3000:]
    assert list(m["claims"]) == ["KV-HEAD-TIMING"] and list(m["families"]) == ["avx2", "default"]
    avx2 = m["families"]["avx2"]
    if "unavailable" not in avx2:
        assert avx2["ran_environment"]["cpu_capability"] == "AVX2"
        if kernel_families.level(avx2["probe"]["mkl_isa"]) in kernel_families.LEVELS:
            assert avx2["cap"]["in_effect"] is True
        else:  # an MKL that names no level (a non-Intel CPU): the cap cannot be seen, the column is flagged
            assert avx2["cap"]["in_effect"] is False and "MKL names no ISA level" in avx2["cap"]["text"]
            assert "WARNING: avx2: the cap was not seen to take effect" in run.stdout
        assert schema.read_record(tmp_path / "isa" / "avx2")["environment"]["cpu_isa_caps"].startswith("ONEDNN_MAX_CPU_ISA=AVX2")
    assert m["families"]["default"]["ran_environment"]["cpu_isa_caps"] == "none"
    assert (tmp_path / "isa" / "matrix.md").read_text().splitlines()[0] == matrix.MATRIX_MARK
    assert "Matrix: " in run.stdout


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_block_starts_only_once_every_busy_process_runs_its_loop(monkeypatch):
    """A busy process still starting is no load: the block must not start before each has said it runs its loop (a
    process slowed by 1 s before its loop makes the wait visible)."""
    monkeypatch.setattr(stress, "BUSY", stress.BUSY.replace("x = 1\n", "x = 1\ntime.sleep(1.0)\n", 1))
    start = time.monotonic()
    with stress.busy(2) as pids:
        assert time.monotonic() - start >= 1.0 and all(_is_busy(p) for p in pids)


def test_a_busy_process_that_never_starts_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    def never(p, timeout=stress.START_SECONDS):
        raise stress.BusyNotStarted(f"a busy process (pid {p.pid}) did not start within 60 s; the stressed run needs it")

    monkeypatch.setattr(stress, "_wait_ready", never)
    code = stress.stress_main(CLAIMS, 2, tmp_path, runner=lambda cmd, env: pytest.fail("ran without its load"),
                              quiet_record=record(), quiet_source="quiet.json")
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("cheapinfer stress: a busy process (pid ") and "\n" not in err
    assert not (tmp_path / "stress.json").exists()
