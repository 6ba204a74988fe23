"""The memory a run records: the process's peak after each claim, the claim that set the run's peak (no model)."""

from cheapinfer.harness import tables
from cheapinfer.harness.record import Recorder, run_peak
from cheapinfer.runtime import memory

GIB = 2**30


def _result(claim, peak, profile="twin"):
    return {"claim": claim, "profile": profile, "test": f"claims/test_x.py::{claim}", "memory": {"peak_rss_bytes": peak}}


def test_the_process_peak_is_at_least_its_resident_set_and_grows_with_an_allocation():
    before = memory.peak_rss()
    block = bytearray(64 * 2**20)  # touched: resident
    for i in range(0, len(block), 4096):
        block[i] = 1
    after = memory.snapshot()
    assert after["peak_rss_bytes"] >= after["rss_bytes"] > 64 * 2**20
    assert after["peak_rss_bytes"] >= before
    memory.release()  # collects and trims without error where glibc is absent too
    assert memory.available() >= 0


def test_the_claim_after_which_the_peak_last_rose_set_it_and_the_largest_rises_are_listed():
    results = [_result("A", 2 * GIB), _result("B", 5 * GIB), {"claim": "C", "profile": "twin", "verdict": "not run"},
               _result("D", 5 * GIB), _result("E", 6 * GIB), _result("F", 6 * GIB)]
    peak = run_peak(results, 6 * GIB)
    assert peak["peak_rss_bytes"] == 6 * GIB
    assert peak["set_by"]["claim"] == "E" and peak["set_by"]["peak_rss_bytes"] == 6 * GIB
    assert [(r["claim"], r["rise_bytes"]) for r in peak["rises"]] == [("B", 3 * GIB), ("A", 2 * GIB), ("E", GIB)]


def test_a_peak_after_the_last_claim_is_the_runs_and_is_said_so():
    record = {"run": {"memory": run_peak([_result("A", 2 * GIB)], 3 * GIB)}}
    lines = tables.memory_lines(record)
    assert lines[0].startswith("peak resident memory: 3.0 GiB") and "reached in A (twin) at 2.0 GiB, and after the last claim" in lines[0]
    assert lines[1] == "raised most by: A (twin) +2.0 GiB"


def test_no_memory_recorded_gives_no_peak_and_no_line():
    assert run_peak([{"claim": "A", "profile": "twin"}]) == {}
    assert tables.memory_lines({"run": {"memory": {}}}) == [] and tables.memory_lines({}) == []


def test_a_result_carries_its_memory_into_the_record():
    recorder = Recorder()
    result = recorder.not_run("KV-BYTES-FORMULA", "arithmetic", "cpu", "skipped")
    result.memory = {"peak_rss_bytes": 5, "rss_bytes": 4}
    assert result.to_dict()["memory"] == {"peak_rss_bytes": 5, "rss_bytes": 4}
