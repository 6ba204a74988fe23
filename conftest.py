"""Root conftest. The suite's pytest plugin is ``fixtures/plugin.py`` (see its docstring), the package's ``pytest11``
entry point ``cheapinfer``: pytest has loaded it before it reads this file, wherever it started. Here it is loaded
only where no entry point did (the checkout on ``PYTHONPATH`` without an install, or ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``),
under the same name, so that it is registered once; ``-p no:cheapinfer`` leaves it out either way.

``pytester``: the plugin's own tests (``tests/test_plugin.py``) run it on made-up claim tests with pytest's pytester.
"""

import sys

pytest_plugins = ["pytester"]


def pytest_addoption(parser, pluginmanager) -> None:
    # Called as this file is registered, before the command line is parsed: the plugin's options still count.
    loaded = sys.modules.get("fixtures.plugin")
    if pluginmanager.is_blocked("cheapinfer") or (loaded is not None and pluginmanager.is_registered(loaded)):
        return
    import fixtures.plugin

    # Under its entry point's name, unless another plugin holds that name (then under its module's; the plugin adds its
    # options only where they are missing).
    pluginmanager.register(fixtures.plugin, fixtures.plugin.NAME if not pluginmanager.has_plugin(fixtures.plugin.NAME) else "fixtures.plugin")
