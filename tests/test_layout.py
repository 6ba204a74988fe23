"""The package's layout: seven wings whose imports go down or sideways, never up, and no cycle.

Read from the source (every ``import`` statement, also those inside functions), so that a lazy import
cannot hide an arrow the wing rules forbid. ``cheapinfer/__init__.py`` (the package face: the seed, the
version, the checkout) may be imported from anywhere.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WINGS = ("chapter", "runtime", "harness", "faults", "audits", "reference", "cli")

#: What each wing may import, besides itself and the package face.
MAY_IMPORT = {
    "runtime": set(),
    "chapter": {"runtime"},
    "harness": {"runtime"},  # and only HARNESS_RUNTIME, without torch: test_the_harness_never_loads_torch
    "faults": {"chapter", "runtime", "harness"},
    "audits": {"chapter", "runtime", "harness", "faults"},  # runs the claims under a fault, other kernels, load
    "reference": {"chapter", "runtime", "harness"},  # the engine runs the chapter's workloads beside vLLM
    "cli": set(WINGS),  # the commands: nothing imports cli/ (test_nothing_imports_the_command_line)
    "__main__": {"cli"},
}

#: No module of the package, the plugin or the claim tests is over LIMIT lines.
LIMIT = 450

#: The standard library's modules that start processes or take signals: only ``audits/`` imports them.
PROCESS_MODULES = {"subprocess", "multiprocessing", "signal"}
#: Modules outside ``audits/`` that may import one all the same, and why.
PROCESS_EXCEPTIONS = {"cheapinfer.runtime.accel": "asks nvidia-smi for the GPU driver's version, a query that runs no claim"}
#: The runtime modules ``harness/`` may import: torch-free settings and file helpers.
HARNESS_RUNTIME = {"cheapinfer.runtime.settings", "cheapinfer.runtime.files", "cheapinfer.runtime.memory"}


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path = ROOT) -> dict[str, Path]:
    """The package's modules under the checkout ``root``, by dotted name."""
    return {_module_name(p, root): p for p in sorted((root / "cheapinfer").rglob("*.py"))}


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` (module ``name``) imports anywhere in its source: ``from x import y``
    names the module ``x.y`` where there is one, else ``x`` (whose names it takes)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "cheapinfer"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if base.split(".")[0] != "cheapinfer":
                continue
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return found


def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = _modules(root)
    return {name: {m for m in _imports(path, name, set(modules)) if m in modules and m != name} for name, path in modules.items()}


def _wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(graph.items()):
        wing = _wing(module)
        if wing is None or module == "cheapinfer":
            continue
        allowed = MAY_IMPORT.get(wing, set()) | {wing}
        for target in sorted(targets):
            there = _wing(target)
            if there is not None and there not in allowed:
                bad.append(f"{module} imports {target}: {wing}/ may import {', '.join(sorted(allowed))}")
    return bad


def _stdlib_imports(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports anywhere (also inside functions), not of the package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"cheapinfer"}


def _process_violations(root: Path = ROOT) -> list[str]:
    """Modules outside ``audits/`` (and :data:`PROCESS_EXCEPTIONS`) that import one of :data:`PROCESS_MODULES`."""
    return [f"{name} imports {', '.join(sorted(_stdlib_imports(path) & PROCESS_MODULES))}: only audits/ starts processes or takes signals"
            for name, path in _modules(root).items()
            if _wing(name) != "audits" and name not in PROCESS_EXCEPTIONS and _stdlib_imports(path) & PROCESS_MODULES]


def _cli_importers(graph: dict[str, set[str]]) -> list[str]:
    """Modules outside ``cli/`` (but the ``python -m`` shim) that import one of ``cli/``."""
    return [f"{module} imports {target}: nothing imports the command line" for module, targets in sorted(graph.items())
            for target in sorted(targets) if _wing(target) == "cli" and _wing(module) not in ("cli", "__main__")]


def test_only_the_audits_start_processes():
    bad = _process_violations()
    assert not bad, "\n".join(bad)


def test_nothing_imports_the_command_line():
    bad = _cli_importers(_graph())
    assert not bad, "\n".join(bad)


def test_the_harness_imports_only_itself_and_torch_free_settings():
    graph = _graph()
    bad = [f"{module} imports {target}" for module, targets in sorted(graph.items()) if _wing(module) == "harness"
           for target in sorted(targets) if _wing(target) not in ("harness", None) and target not in HARNESS_RUNTIME]
    assert not bad, f"harness/ imports harness/ and {', '.join(sorted(HARNESS_RUNTIME))} only:\n" + "\n".join(bad)


def test_the_process_and_cli_checks_see_a_broken_layout(tmp_path):
    pkg = tmp_path / "cheapinfer"
    for wing in ("harness", "audits", "cli"):
        (pkg / wing).mkdir(parents=True)
        (pkg / wing / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "harness" / "report.py").write_text("def f():\n    import subprocess\n    from ..cli import main\n")
    (pkg / "audits" / "launch.py").write_text("import signal\nfrom multiprocessing import util\n")
    assert _process_violations(tmp_path) == ["cheapinfer.harness.report imports subprocess: only audits/ starts processes or takes signals"]
    assert _cli_importers(_graph(tmp_path)) == ["cheapinfer.harness.report imports cheapinfer.cli: nothing imports the command line"]


def test_every_module_lives_in_a_wing():
    loose = [name for name in _modules() if name.count(".") == 1 and _wing(name) not in WINGS and name not in ("cheapinfer.__main__", TESTING)]
    assert not loose, f"modules outside the wings {WINGS}: {loose}"


#: The test helpers (pytest, Hypothesis): the claim tests and the suite's tests import it, the package never.
TESTING = "cheapinfer.testing"


def test_nothing_in_the_package_imports_the_test_helpers():
    graph = _graph()
    assert not [m for m, targets in graph.items() if TESTING in targets], "the package imports cheapinfer.testing (pytest, Hypothesis)"
    assert not graph[TESTING], f"{TESTING} imports the package's modules {sorted(graph[TESTING])}: it holds test helpers only"


def test_imports_go_down_or_sideways():
    bad = _violations(_graph())
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (every import counts, also inside functions):\n" + "\n".join(" <-> ".join(c) for c in cycles)


#: The most import layers ``harness/`` may have: a module that imports no other of the wing stands on layer 1, any
#: other one layer above the highest module it imports (every import counts, also inside functions).
HARNESS_LAYERS = 5
#: The harness modules that read or render whole records, side by side on the top layers: none imports another.
HARNESS_PEERS = ("cheapinfer.harness.report", "cheapinfer.harness.compare", "cheapinfer.harness.merge")


def _longest_chain(graph: dict[str, set[str]], wing: str = "harness") -> list[str]:
    """The longest chain of imports among the modules of ``wing``, from the importing module down to one that imports
    none of the wing (its length is the wing's number of layers); the first in name order among equally long ones."""
    inside = {m: sorted(t for t in targets if _wing(t) == wing and t != m) for m, targets in graph.items() if _wing(m) == wing}
    chains: dict[str, list[str]] = {}

    def chain(module: str, seen: tuple[str, ...] = ()) -> list[str]:
        if module not in chains:
            below = [chain(t, (*seen, module)) for t in inside.get(module, []) if t not in seen]  # a cycle fails test_no_import_cycle
            chains[module] = [module, *max(below, key=len, default=[])]
        return chains[module]

    return max((chain(m) for m in sorted(inside)), key=len, default=[])


def test_the_harness_has_at_most_five_import_layers():
    longest = _longest_chain(_graph())
    assert len(longest) <= HARNESS_LAYERS, (f"harness/ has {len(longest)} import layers, more than {HARNESS_LAYERS}: "
                                           + " -> ".join(m.removeprefix("cheapinfer.harness.") for m in longest)
                                           + " (move what the lower modules import from the higher ones down, e.g. into harness/vocabulary.py)")


def test_report_compare_and_merge_do_not_import_each_other():
    graph = _graph()
    bad = [f"{a} imports {b}" for a in HARNESS_PEERS for b in HARNESS_PEERS if b in graph[a]]
    assert not bad, "report, compare and merge stand side by side:\n" + "\n".join(bad)


def test_the_layer_check_names_the_longest_chain(tmp_path):
    pkg = tmp_path / "cheapinfer" / "harness"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    names = ["a", "b", "c", "d", "e", "f"]
    for name, below in zip(names, names[1:] + [None]):
        (pkg / f"{name}.py").write_text(f"def g():\n    from . import {below}\n" if below else "from .. import __version__\n")
    (pkg / "side.py").write_text("from .e import x\nfrom .f import y\n")
    assert _longest_chain(_graph(tmp_path)) == [f"cheapinfer.harness.{n}" for n in names]


def test_the_harness_never_loads_torch():
    """Reading, comparing and reporting records works where torch is not installed: importing every
    harness module loads no torch (a lazy import of a runtime module that needs it would, when called, and
    is caught by the rule below)."""
    harness = [name for name in _modules() if _wing(name) == "harness"]
    code = "import sys\n" + "".join(f"import {m}\n" for m in harness) + "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    graph = _graph()
    for module in harness:
        for target in graph[module]:
            if _wing(target) == "runtime":
                source = _modules()[target].read_text(encoding="utf-8")
                assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) and "torch" in ast.unparse(n).split()
                               for n in ast.walk(ast.parse(source))), f"{module} imports {target}, which imports torch"


def test_no_module_is_over_the_size_limit():
    files = {**_modules(), **{p.relative_to(ROOT).as_posix(): p for d in ("fixtures", "claims") for p in sorted((ROOT / d).glob("*.py"))}}
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in files.items()}
    over = {name: n for name, n in sizes.items() if n > LIMIT}
    assert not over, f"modules over {LIMIT} lines (split them along their seams): {over}"


def _plugin_modules(root: Path = ROOT) -> set[str]:
    """The pytest plugin modules: the package's ``pytest11`` entry points and those they load in turn (``pytest_plugins``)."""
    import tomllib

    entry = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]["pytest11"]
    found = set(entry.values())
    todo = [root / (name.replace(".", "/") + ".py") for name in found]
    while todo:
        tree = ast.parse(todo.pop().read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytest_plugins" for t in node.targets):
                for name in ast.literal_eval(node.value):
                    if name not in found and name.split(".")[0] == "fixtures":  # the suite's own (not pytester)
                        found.add(name)
                        todo.append(root / (name.replace(".", "/") + ".py"))
    return found


def _claim_module_faults(root: Path = ROOT) -> list[str]:
    """What breaks the rule for ``claims/``: a test function without a claim marker, an import from ``fixtures/``."""
    plugins, bad = _plugin_modules(root), []
    for path in sorted((root / "claims").glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                marked = any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "claim" for d in node.decorator_list)
                if not marked:
                    bad.append(f"{path.name}::{node.name} is not a claim test: it belongs under tests/")
        for node in ast.walk(tree):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else [a.name for a in getattr(node, "names", [])] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module == "fixtures":
                names = [f"fixtures.{a.name}" for a in node.names]
            bad += [f"{path.name} imports the plugin module {n}: a helper belongs in cheapinfer.testing" for n in names
                    if n in plugins or n.split(".")[0] == "fixtures"]
    return bad


def _section_names(root: Path = ROOT) -> dict[str, set[str]]:
    """The chapter's section names as each place spells them: the registry's section keys (read from its ``section =``
    lines), ``claims/test_<section>.py``, ``chapter/<section>/``, ``faults/catalogue/<section>.py``, and the
    ``tests/chapter/test_<section>_*.py`` prefixes (``stats``: ``chapter/stats.py``, no section's)."""
    import re

    registry = (root / "cheapinfer" / "registry.toml").read_text(encoding="utf-8")
    chapter, catalogue = root / "cheapinfer" / "chapter", root / "cheapinfer" / "faults" / "catalogue"
    names = {
        "registry.toml": set(re.findall(r'(?m)^section = "([^"]+)"$', registry)),
        "claims/": {p.stem.removeprefix("test_") for p in (root / "claims").glob("test_*.py")},
        "chapter/": {p.parent.name for p in chapter.glob("*/__init__.py")},
        "faults/catalogue/": {p.stem for p in catalogue.glob("*.py")} - {"__init__", "patches"},
    }
    sections = names["registry.toml"]
    prefixes = {next((s for s in sorted(sections | {"stats"}, key=len, reverse=True) if p.stem.startswith(f"test_{s}_")), p.stem)
                for p in (root / "tests" / "chapter").glob("test_*.py")}
    names["tests/chapter/"] = prefixes
    return names


def test_one_name_per_section_everywhere():
    """Issue #44: a section has one name, the registry's key, and every place that is per section uses it (its claims'
    tests, its measurements, its faults; its self-tests are named for it). The registry's SECTIONS are the keys."""
    from cheapinfer.harness import registry

    names = _section_names()
    assert names["registry.toml"] == set(registry.SECTIONS), names["registry.toml"] ^ set(registry.SECTIONS)
    for place in ("claims/", "chapter/", "faults/catalogue/"):
        assert names[place] == set(registry.SECTIONS), f"{place}: {sorted(names[place] ^ set(registry.SECTIONS))} (the sections are {sorted(registry.SECTIONS)})"
    assert names["tests/chapter/"] <= set(registry.SECTIONS) | {"stats"}, f"tests/chapter/ files named for no section: {sorted(names['tests/chapter/'] - set(registry.SECTIONS))}"


def test_the_section_check_sees_a_section_named_twice(tmp_path):
    """The check itself: a claims file under an old name is a name the registry lacks."""
    for d in ("cheapinfer/chapter/kv_cache", "cheapinfer/faults/catalogue", "claims", "tests/chapter"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "cheapinfer" / "registry.toml").write_text('[KV-X]\nsection = "kv_cache"\n', encoding="utf-8")
    (tmp_path / "cheapinfer" / "chapter" / "kv_cache" / "__init__.py").write_text("")
    (tmp_path / "cheapinfer" / "faults" / "catalogue" / "kv.py").write_text("")
    (tmp_path / "claims" / "test_kv_cache.py").write_text("")
    (tmp_path / "tests" / "chapter" / "test_kv_timing.py").write_text("")
    names = _section_names(tmp_path)
    assert names["registry.toml"] == names["claims/"] == names["chapter/"] == {"kv_cache"}
    assert names["faults/catalogue/"] == {"kv"} and names["tests/chapter/"] == {"test_kv_timing"}


def test_claims_hold_only_thin_claim_tests():
    """``claims/`` holds only tests marked ``claim(ID)``; their helpers come from the package (the test helpers from
    ``cheapinfer.testing``), never from ``fixtures/``, whose modules are the plugin's."""
    bad = _claim_module_faults()
    assert not bad, "\n".join(bad)
    assert {"fixtures.plugin", "fixtures.options", "fixtures.profiles", "fixtures.batch_curve"} <= _plugin_modules()


def test_the_claims_check_sees_a_plain_test_and_a_plugin_import(tmp_path):
    (tmp_path / "claims").mkdir()
    (tmp_path / "fixtures").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project.entry-points.pytest11]\nx = "fixtures.plugin"\n')
    (tmp_path / "fixtures" / "plugin.py").write_text('pytest_plugins = ["fixtures.curve"]\n')
    (tmp_path / "fixtures" / "curve.py").write_text("")
    (tmp_path / "claims" / "test_x.py").write_text(
        "import pytest\nfrom fixtures.curve import SIZES\n\n\n@pytest.mark.claim('X-1')\ndef test_claim(claim):\n    pass\n\n\ndef test_plain():\n    pass\n")
    bad = _claim_module_faults(tmp_path)
    assert any("test_plain is not a claim test" in b for b in bad) and any("fixtures.curve" in b for b in bad), bad
    assert not any("test_claim " in b for b in bad), bad


_DTYPE_NAMES = {"fp32", "fp16", "bf16"}
_TORCH_DTYPES = {"float16", "float32", "bfloat16"}
#: The one function that decides the dtype of a claim's model, and its module.
DTYPE_DECIDER = ("cheapinfer/runtime/models.py", "claim_dtype")


def _is_dtype(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and node.value in _DTYPE_NAMES) or (isinstance(node, ast.Attribute) and node.attr in _TORCH_DTYPES)


def _dtype_decisions(root: Path = ROOT) -> list[str]:
    """Places outside :data:`DTYPE_DECIDER` that decide a model's dtype themselves: a choice between two dtypes (``a if
    cuda else b``), a call of the serving rule, or the twin asked for in a dtype written out."""
    decider = root / DTYPE_DECIDER[0]
    paths = [*sorted((root / "cheapinfer").rglob("*.py")), *sorted((root / "claims").glob("*.py")), *sorted((root / "fixtures").glob("*.py"))]
    bad = []
    for path in paths:
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if path == decider:
                break
            if isinstance(node, ast.IfExp) and _is_dtype(node.body) and _is_dtype(node.orelse):
                bad.append(f"{where}:{node.lineno} chooses a dtype itself ({ast.unparse(node)})")
            elif isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name == "serving_dtype":
                    bad.append(f"{where}:{node.lineno} calls serving_dtype, not claim_dtype('serving', ...)")
                elif name == "twin_factory" and node.args and _is_dtype(node.args[0]):
                    bad.append(f"{where}:{node.lineno} asks for the twin in a dtype written out ({ast.unparse(node)})")
    return bad


def test_one_function_decides_a_claims_dtype():
    """The dtype of every claim's model comes from ``models.claim_dtype(purpose, device)``, whose rules say why."""
    bad = _dtype_decisions()
    assert not bad, "\n".join(bad)


def test_the_dtype_check_sees_a_claim_choosing_its_own_dtype(tmp_path):
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "test_x.py").write_text(
        'import torch\n\n\ndef test_x(twin_factory, device):\n    d = torch.float16 if device.type == "cuda" else torch.float32\n'
        '    twin_factory("bf16")\n    models.serving_dtype(device)\n')
    bad = _dtype_decisions(tmp_path)
    assert len(bad) == 3 and all(b.startswith("claims/test_x.py:") for b in bad), bad


def test_one_function_decides_the_runs_device():
    """``device.pick`` is called where a run starts, and nowhere else: by the plugin, which keeps its answer in the
    config (``options.DEVICE``, what every fixture reads), and by ``verify`` and ``gpu-check``, which check
    ``--device`` before they start pytest with it."""
    callers = set()
    for path in [*sorted((ROOT / "cheapinfer").rglob("*.py")), *sorted((ROOT / "claims").glob("*.py")), *sorted((ROOT / "fixtures").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "pick":
                callers.add(path.relative_to(ROOT).as_posix())
    assert callers == {"fixtures/options.py", "cheapinfer/cli/verify.py", "cheapinfer/audits/gpu_check.py"}, callers


@pytest.mark.parametrize("case", ["up", "cycle"])
def test_the_layout_checks_see_a_broken_layout(tmp_path, case):
    """The checks themselves: a chapter module that imports the harness, and two modules that import each other."""
    pkg = tmp_path / "cheapinfer"
    for wing in ("chapter", "harness"):
        (pkg / wing).mkdir(parents=True)
        (pkg / wing / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    if case == "up":
        (pkg / "chapter" / "kv.py").write_text("from ..harness import report\n")
        (pkg / "harness" / "report.py").write_text("")
        assert _violations(_graph(tmp_path)) == ["cheapinfer.chapter.kv imports cheapinfer.harness.report: chapter/ may import chapter, runtime"]
    else:
        (pkg / "harness" / "a.py").write_text("def f():\n    from . import b\n")
        (pkg / "harness" / "b.py").write_text("from .a import f\n")
        assert _cycles(_graph(tmp_path)) == [["cheapinfer.harness.a", "cheapinfer.harness.b"]]



def test_the_tox_environments_python_lines_run_on_this_package():
    """Every ``python -c "..."`` of tox.ini that imports the package runs here: a renamed or re-signed function breaks
    ``tox -e oldest`` before its tests start, which no other test would see."""
    import configparser
    import re

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini", encoding="utf-8")
    lines = {line.strip() for section in tox.sections() for key in ("commands", "commands_pre") for line in tox[section].get(key, "").splitlines()}
    codes = sorted({m.group(1) for line in lines if (m := re.fullmatch(r'python -c "(.*)"', line)) and re.search(r"\b(from|import) cheapinfer\b", m.group(1))})
    assert codes, "tox.ini runs no python -c line that imports the package (the check reads nothing)"
    for code in codes:
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert run.returncode == 0, f"tox.ini's `python -c {code[:80]}...` fails here:\n{run.stderr[-2000:]}"


def test_ci_runs_the_readmes_test_command_verbatim():
    """.ci/run ends with the README's test command, the second command block of the README, character for character."""
    import re

    blocks = re.findall(r"```sh\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    command = blocks[1].strip()
    assert command.startswith("pip install -e '.[test]' && ")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == command
