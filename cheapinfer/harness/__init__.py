"""claim -> verdict -> record -> report: the registry and its verdicts (``registry``), the run's record
(``record``), the report writer (``report``), ``compare`` and ``merge`` of records, the ISA and stress
matrix (``matrix``), the machine's load (``load``), the pytest options' entry point (``pytest_options``)
and the one reader of the claim tests' source (``claimfiles``).

No torch: nothing here imports it, so that reading, comparing and reporting records works anywhere
(``tests/test_layout.py``). May import the modules of ``cheapinfer.runtime`` that load no torch (``cli``,
``profiles``); never ``chapter``, ``faults`` or ``reference``.
"""
