"""Root conftest: the suite's plugin lives in fixtures/plugin.py (options, markers, profiles, report)."""

pytest_plugins = ["fixtures.plugin"]
