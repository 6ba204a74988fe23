"""Root conftest: the suite's fixtures live in fixtures/ as pytest plugins.

fixtures/plugin.py: the suite's plugin (options, selection, recording, profiles: see its docstring).
fixtures/quant.py: quantized variants of the trained profiles, built once per session.
fixtures/evaluation.py: the corpus, the battery and the evaluation table, built once per session.
fixtures/batch_curve.py: the batch curve and the serving models, measured once per claim module.
"""

pytest_plugins = ["fixtures.plugin", "fixtures.quant", "fixtures.evaluation", "fixtures.batch_curve", "pytester"]
