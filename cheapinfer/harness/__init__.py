"""claim -> verdict -> record -> report, and the suite's checks of its own verdicts.

- ``registry`` (the claims, their checks and errata), ``verdict`` (the pure verdict), ``record`` (a run's
  results and the fault record's vocabulary), ``schema`` (the typed records, run.json and faults.json, with
  their versions: one schema, one reader, one validator), ``numbers`` (numbers as the registry reads and the
  reports print them), ``load`` (the machine's load);
- ``report`` (run.json and errata.md), ``errata`` (its errata sections), ``tables`` (Markdown building blocks);
- ``compare`` and ``merge`` of records; ``matrix``, ``families`` and ``stress`` (``verify --isa-matrix``
  and ``--stress``); ``pytest_options`` (the options of the suite's pytest plugin).

No torch: nothing here imports it, so that reading, comparing and reporting records works anywhere
(``tests/test_layout.py``). May import the modules of ``cheapinfer.runtime`` that load no torch (``cli``, ``memory``,
``profiles``); never ``chapter``, ``faults`` or ``reference``.
"""
