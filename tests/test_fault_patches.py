"""A fault patches the narrowest point: a wrapper of the real function, or one value, never a copy of the whole
function with one line changed (a copy drifts from the original it stands for, and then tests an older system).

Read from the catalogue's source: every ``patched(target, "name", replacement)`` whose replacement is a function
written in the fault is compared, line by line and without its docstring, with the function it replaces.
"""

import ast
import difflib
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

from cheapinfer.faults import core

CATALOGUE = Path(core.__file__).resolve().parent / "catalogue"
#: A replacement sharing more than this fraction of its lines with the original is a copy: the fault's change is
#: then a line or two, which a wrapper (``result_mapped``, or a call of the real function) or one patched value says.
COPY_RATIO = 0.5
#: Shorter replacements are a line or two of their own: nothing to drift.
MIN_LINES = 4


def _body_lines(node: ast.FunctionDef) -> list[str]:
    body = node.body[1:] if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) else node.body
    return [line.strip() for stmt in body for line in ast.unparse(stmt).splitlines()]


def _replacements():
    """(module file, line, replacement name, original's qualified name, replacement lines, original lines)."""
    core.catalogue()
    for path in sorted(CATALOGUE.glob("*.py")):
        module = importlib.import_module(f"cheapinfer.faults.catalogue.{path.stem}")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        written = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "patched" and len(call.args) == 3):
                continue
            target, attribute, replacement = call.args
            if not (isinstance(attribute, ast.Constant) and isinstance(replacement, ast.Name) and replacement.id in written):
                continue
            try:
                original = getattr(eval(ast.unparse(target), vars(module)), attribute.value)  # noqa: S307 - the catalogue's own names
                source = ast.parse(textwrap.dedent(inspect.getsource(original))).body[0]
            except (NameError, AttributeError, TypeError, OSError):
                continue  # a target imported inside the fault (a library class): not the suite's own function
            if isinstance(source, ast.FunctionDef):
                yield (path.name, call.lineno, replacement.id, attribute.value, _body_lines(written[replacement.id]), _body_lines(source))


def test_the_scan_sees_the_catalogue_patches():
    """The scan must find the catalogue's function replacements; an empty scan would pass anything."""
    assert len(list(_replacements())) >= 10


@pytest.mark.parametrize("where, line, name, original, mine, theirs", list(_replacements()), ids=lambda v: v if isinstance(v, str) else None)
def test_no_fault_copies_the_function_it_replaces(where, line, name, original, mine, theirs):
    if len(mine) < MIN_LINES:
        return
    ratio = difflib.SequenceMatcher(None, mine, theirs).ratio()
    assert ratio <= COPY_RATIO, (f"{where}:{line}: {name} copies {original} ({ratio:.0%} of its lines alike): wrap the real function "
                                 "(faults.base.result_mapped, or a call of the original) or patch one value instead")


def test_the_rule_sees_a_copy_with_one_line_changed():
    """The rule's own teeth: a copy of a real function with one line changed is refused."""
    from cheapinfer.chapter.speculative import speculative

    theirs = _body_lines(ast.parse(textwrap.dedent(inspect.getsource(speculative.accept_greedy))).body[0])
    mine = [line.replace("target_choice[n]", "proposals[n]") if line.startswith("return") else line for line in theirs]
    assert mine != theirs and difflib.SequenceMatcher(None, mine, theirs).ratio() > COPY_RATIO
