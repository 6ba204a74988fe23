"""Rebuild tests/data/run-record.json, the fixed run record of the report's snapshot test.

    python tests/data/make_run_record.py            # rewrite run-record.json
    UPDATE_SNAPSHOTS=1 pytest tests/test_report.py  # then re-render errata-snapshot.md from it

The record is made the way a run makes it (``Recorder.verify`` judges hand-written measurements
against the registry, ``record.build`` assembles the record) but with a fixed environment and run,
and keeps a handful of claims that together show every verdict, a regenerated table, a figure
link, a note, a library warning, a perturbed claim, a candidate erratum, a confirmed erratum, a claim with
two confirmed errata of two grades, an inconclusive timing with its noise and load, a search that ran out of
range, and fault coverage. The measurements are
made up for the test (the run says so); nothing here depends on the clock or the machine. Run it
only on purpose: the record follows the registry's statements and checks of the moment.
"""

from __future__ import annotations

import json
from pathlib import Path

from cheapinfer.harness import errata, vocabulary
from cheapinfer.harness import record as records
from cheapinfer.harness.record import Recorder

HERE = Path(__file__).resolve().parent
RECORD = HERE / "run-record.json"

ENVIRONMENT = {
    "python": "3.11.7",
    "platform": "Linux-x86_64",
    "cpu": "Example 8-core CPU",
    "cpu_count": "8",
    "torch_threads": "8",
    "gpu": "Example GPU 8 GB",
    "gpu_memory_gib": "8.0",
    "driver": "550.00",
    "cuda": "12.4",
    "torch": "2.13.0",
    "transformers": "5.24.0",
    "bitsandbytes": "0.50.2",
    "gguf": "0.19.0",
}
RUN = {
    "command": "fixed record for the snapshot test of the report (tests/data/make_run_record.py); measurements are made up",
    "created": "2026-01-01T00:00:00Z",
    "device": "cuda",
    "book_model": "Hugging Face cache (instruct)",
    "twin_dtype": "fp32",
    "seed": 20241,
    "seconds": 12.5,
    "exit_status": 1,
    "benchmarks": "benchmarks.json",
}
#: The claims kept in the record, and the test files that (say the record) name them.
KEPT = ["KV-IDENTITY", "KV-SPEEDUP-48", "KV-SCORES-BYTES", "KV-MACS", "KV-MEMORY-8.3X", "KV-PREFILL-GROWS", "KV-BYTES-FORMULA", "KV-API",
        "KV-DECODE-FLAT", "KV-DECODE-MEMBOUND", "BAT-KNEE", "Q-NF4", "Q-DOWNPROJ-STATS", "SPEC-GAMMA8", "BUD-13B-8GB"]
TESTED = {**{cid: ["test_kv_cache.py"] for cid in KEPT[:9]}, "BAT-KNEE": ["test_batching.py"], "Q-NF4": ["test_quantization.py"],
          "Q-DOWNPROJ-STATS": ["test_quantization.py"], "SPEC-GAMMA8": ["test_speculative.py"]}


def results() -> list[dict]:
    rec = Recorder(perturb=["KV-SCORES-BYTES"])
    node = "claims/test_kv_cache.py::"
    used = {"cache_grows_by_one": True, "logit_change_vs_no_context": 1.39}
    # the clocked claims' premise on CUDA (cheapinfer.runtime.premise): the timed step bound by the device, not the host
    premise = {"device_bound": True, "device_bound_why": "median enqueue 0.41 ms against 5.2 ms of device time (host share 0.08)",
               "host_share": 0.079, "host_share_step": "decode", "host_enqueue_s": 0.00041, "device_step_s": 0.0052}
    timed_one = {"timed_forwards": 1, "timed_forwards_max": 1, **premise}  # every timed step ran its one forward
    rec.verify("KV-IDENTITY", "twin", "cuda", {"identical": True, **used, "prompts": 4, "tokens": 48}, test=node + "test_cache_gives_identical_tokens[twin]", seconds=3.2)
    rec.verify("KV-IDENTITY", "stand-in", "cuda", {"identical": True, **used, "prompts": 4, "tokens": 48}, test=node + "test_cache_gives_identical_tokens[stand-in]", seconds=1.1)
    rec.not_run("KV-IDENTITY", "book", "cuda", "book weights not found: pass --book-model PATH (a local copy of Qwen/Qwen2.5-0.5B-Instruct)", node + "test_cache_gives_identical_tokens[book]")
    rec.verify(
        "KV-SPEEDUP-48", "twin", "cuda",
        {"speedup": 3.47, "speedup_se": 0.21, "speedup_growth": 2.31, "speedup_growth_se": 0.12, "rounds": 3, **used, "timed_forwards": 48,
         "timed_forwards_max": 48, "cached_s": 0.412, "uncached_s": 1.43, **premise},
        test=node + "test_cache_is_faster_and_more_so_for_longer_generations[twin]", seconds=8.0,
        figures=["plots/kv-decode-vs-context.png"],
        notes=["The twin has random weights: the speedup depends on shapes, not on weight values."],
    )
    rec.verify(
        "KV-SCORES-BYTES", "arithmetic", "cpu",
        {"recompute_mb": 67.108864, "cached_kb": 16.384, "recompute_bytes": 67_108_864, "cached_score_rows": 1, "cached_minus_recompute_row": 2e-7,
         "cached_minus_recompute_over_bound": 0.02},
        test=node + "test_scores_bytes", seconds=0.01,
    )
    rec.verify(
        "KV-MACS", "arithmetic", "cpu",
        {"cached_total_degree": 2, "uncached_total_degree": 3, "cached_step_degree": 1, "uncached_step_degree": 2, "closed_form_matches_count": True},
        test=node + "test_macs", seconds=0.5,
    )
    rec.verify(
        "KV-MEMORY-8.3X", "twin", "cuda", {"ratio": 6.2, "cache_grows_by_one": True, "cached_peak_bytes": 9_437_184, "uncached_peak_bytes": 58_720_256},
        test=node + "test_uncached_needs_8x_memory[twin]", seconds=4.0,
        notes=["Measured with torch.cuda.max_memory_allocated after torch.cuda.reset_peak_memory_stats; weights subtracted."],
    )
    rec.verify(
        "KV-PREFILL-GROWS", "twin", "cuda", {"growth": 2.8, "growth_se": 0.2, "worst_drop": 0.31, "worst_drop_se": 0.04, "rounds": 3, **timed_one},
        test=node + "test_prefill_time_grows_with_prompt[twin]", seconds=6.5,
        tables=[{"title": "Prefill time by prompt length (twin, fp32)", "header": ["prompt tokens", "ms", "ms per token"],
                 "rows": [[128, 41.0, 0.32], [512, 88.0, 0.17], [1024, 61.0, 0.06], [2048, 115.0, 0.056]]}],
        figures=["plots/kv-prefill-vs-prompt.png"],
        notes=["The time drops from 512 to 1024 tokens: the attention kernel switches to a fused path at 1024."],
    )
    rec.verify(
        "KV-BYTES-FORMULA", "arithmetic", "cpu", {"bytes_per_token": 12_288}, test=node + "test_kv_cache_is_12288_bytes_per_token", seconds=0.0,
        tables=[{"title": "KV cache bytes per token", "header": ["model", "layers", "kv heads", "head dim", "bytes/token (fp16)"],
                 "rows": [["Qwen2.5-0.5B", 24, 2, 64, 12_288]]}],
    )
    rec.verify(
        "KV-API", "stand-in", "cuda", {"runs": True, "cache_argument": "cache", "cache_attribute": "cache", "replacement_runs": True},
        test=node + "test_cache_api_runs[stand-in]", seconds=0.4,
        warnings=["FutureWarning: `past_key_values` is deprecated; use `cache` instead"],
    )
    rec.verify(
        "KV-DECODE-FLAT", "twin", "cuda", {"step_ratio": 1.21, "step_ratio_se": 0.09, "rounds": 28, **used, **timed_one},
        test=node + "test_decode_step_is_flat_in_context", seconds=95.0,
        load={"loadavg_before": [3.1, 2.4, 1.2], "loadavg_after": [3.9, 2.8, 1.4], "cpus": 8, "steal_fraction": 0.012},
    )
    knee = {"knee_found": False, "knee_latency_gain": float("nan"), "knee_latency_gain_se": float("nan"), "gain_before_knee": float("nan"),
            "gain_before_knee_se": float("nan"), "knee_batch": 0, "knee_rule_on_book_curve": 16, "knee_searched_up_to": 64,
            "knee_search_complete": True, "knee_skipped_doublings": 0, "throughput_gain_16_32": 1.12, "latency_gain_16_32": 1.79,
            "cache_grows_by_fed": True, "history_tokens": [64, 64], "logit_change_vs_no_context": 1.39, **timed_one}
    rec.verify("BAT-KNEE", "twin", "cuda", knee, test="claims/test_batching.py::test_batch_curve_has_a_knee", seconds=41.0)
    # the book's arithmetic against itself (as claims/test_quantization.py does it): two errata of one claim, of two grades
    tail = {"max_over_std": 24.119099890230515, "beyond_percent": 0.01587831884398496, "one_in": 6297.8959537572255}
    rec.verify("Q-DOWNPROJ-STATS", "arithmetic", "cpu", {"numel": 4_358_144, "numel_millions": 4.358144, **tail, "sigmas_largest": tail["max_over_std"],
                                                         "sigmas_largest_beyond_six": tail["max_over_std"]},
               test="claims/test_quantization.py::test_one_down_proj_has_a_24_sigma_weight[arithmetic]", seconds=0.0)
    rec.verify(
        "SPEC-GAMMA8", "arithmetic", "cpu", {"speedup_a09": 2.356, "speedup_a03": 0.549, "implied_c_a09": 0.1002},
        test="claims/test_speculative.py::test_gamma8", seconds=0.0,
    )
    return [r.to_dict() for r in rec.results]


#: The fault catalogue as the record sees it (made up, like the measurements) and one faults run.
FAULTS = {"KV-IDENTITY": ["kv-decode-ignores-cache"], "KV-SPEEDUP-48": ["kv-decode-ignores-cache", "kv-cached-generation-recomputes"], "KV-BYTES-FORMULA": ["kv-bytes-counts-query-heads"]}
FAULT_RUN = {
    "created": "2026-01-01T00:00:00Z", "runs": 3, "mode": "sweep", "seconds": 95.0, "uncovered": [],
    "faults": {
        "kv-decode-ignores-cache": {"section": "kv_cache", "kind": "disabled optimisation", "what": "made up", "targets": ["KV-IDENTITY", "KV-SPEEDUP-48"],
                                    "runs": [{"KV-IDENTITY": "red", "KV-SPEEDUP-48": "not reached: caught by KV-IDENTITY first"}] * 3, "caught": 3, "seconds": 60.0},
        "kv-bytes-counts-query-heads": {"section": "kv_cache", "kind": "wrong constant", "what": "made up", "targets": ["KV-BYTES-FORMULA"],
                                        "runs": [{"KV-BYTES-FORMULA": "red"}] * 3, "caught": 3, "seconds": 35.0},
    },
}


def make() -> dict:
    record = records.build(results(), dict(ENVIRONMENT), dict(RUN), TESTED, faults=FAULTS, fault_run=FAULT_RUN)
    record["claims"] = {cid: c for cid, c in record["claims"].items() if cid in KEPT}
    record["summary"] = {v: n for v, n in ((v, sum(c["verdict"] == v for c in record["claims"].values())) for v in vocabulary.VERDICTS) if n}
    record["sections"] = {k: t for k, t in record["sections"].items() if any(c["section"] == k for c in record["claims"].values())}
    record["errata"] = errata.candidate_errata(record)
    return record


if __name__ == "__main__":
    RECORD.write_text(json.dumps(make(), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {RECORD}")
