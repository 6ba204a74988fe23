"""Faults in the measured system, injected to prove that the claims can turn red.

``catalogue``: every fault, a realistic bug or library regression written as a patch of the measurement
code, with the claims it must turn red. ``base``: what a fault is and how it registers; ``core``: the catalogue (``catalogue``, ``activate``, ``targeted_by``), which the plugin reads. ``runner``: runs the claims
under each fault and records which turned red (``python -m cheapinfer faults``), its phases planned by the pure
``plan`` and ``alone_jobs``; ``child``: the pytest processes of the fault runs (a fork server) and ``halt``.
``writer``, ``device``, ``text`` and ``records``: the suite's own faults (a write in place; the device path's defects of
issue 41; the checks of the chapter's text; the readers of run records, ``compare`` and the report), each turning its own
self-tests red in tests/ rather than claims.

May import: ``chapter``, ``runtime`` and ``harness``.
"""
