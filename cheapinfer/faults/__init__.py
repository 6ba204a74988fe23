"""Faults in the measured system, injected to prove that the claims can turn red.

``catalogue``: every fault, a realistic bug or library regression written as a patch of the measurement
code, with the claims it must turn red. ``runner``: runs the claims under each fault and records which
turned red (``python -m cheapinfer faults``).

May import: ``chapter``, ``runtime`` and ``harness``.
"""
