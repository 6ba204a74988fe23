"""Root conftest: the suite's fixtures live in fixtures/ as pytest plugins.

fixtures/plugin.py: options, markers, device and profile fixtures, the claim recorder, the report.
fixtures/quant.py: quantized variants of the trained profiles, built once per session.
fixtures/evaluation.py: the corpus, the battery and the evaluation table, built once per session.
"""

pytest_plugins = ["fixtures.plugin", "fixtures.quant", "fixtures.evaluation"]
