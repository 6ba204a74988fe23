"""The reference serving engine (vLLM's CPU build) and its report, beside the suite's own measurements
(optional: ``tox -e vllm``). May import: ``chapter`` (it runs the chapter's workloads), ``runtime`` and ``harness``.
"""
