"""claim -> verdict -> record -> store and report; compare and merge of records. Records only, and pure.

From the ground up (``tests/test_layout.py`` holds the wing to at most five import layers):

1. ``vocabulary`` (the verdicts, claim IDs, the harness-error mark, the fault record's words, the environment entries
   that decide verdicts), ``numbers`` (numbers as the registry reads and the reports print them), ``grades``,
   ``registry_fields``;
2. ``registry`` (the claims, their checks and errata), ``schema`` (the typed records, run.json and faults.json, with
   their versions: one schema, one reader, one validator), ``locate`` (the errata's places in the chapter's text);
3. ``verdict`` (the pure verdict), ``errata`` (the errata a record shows), ``tables`` (Markdown building blocks),
   ``store`` (the report directory, runs/, files replaced whole, a result kept aside), ``reruns``, ``textchecks``,
   ``explanations``;
4. ``author`` (the author's list), ``errata_sections`` (the report's errata sections), ``compare`` and ``merge``;
5. ``record`` (a run's results and the record built from them) and ``report`` (errata.md and evidence.md rendered).

``report``, ``compare`` and ``merge`` do not import each other. No torch, no processes: nothing here imports torch,
``subprocess``, ``multiprocessing`` or ``signal``, so that reading, comparing and reporting records works anywhere. May
import the modules of ``cheapinfer.runtime`` that load no torch (``settings``, ``files``, ``memory``); never
``chapter``, ``faults``, ``audits``, ``reference`` or ``cli``.
"""
