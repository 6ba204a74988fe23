"""Audits: the claims run under a perturbation, their verdicts compared with a clean run's.

``faults``: each fault of the catalogue injected, the claims it names must turn red (``cheapinfer faults``), its
runs forked from ``forks``' server. ``matrix`` and ``families``: the kernel-dependent claims under each CPU kernel
family (``cheapinfer isa``). ``stress``: the clocked claims beside busy processes (``cheapinfer stress``).
``gpu_check``: the GPU tests and the device claims on a CUDA machine (``cheapinfer gpu-check``).

The only wing that starts processes. May import: ``chapter``, ``runtime``, ``harness`` and ``faults``.
"""
