"""The test suite's own shape: e2e test modules hold tests and stand on `e2e/harness/` (no test
module imports another, so a scene has one home), every test module starts with its tests
soon after its imports and fixtures, and the unit tests import nothing of `e2e`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
E2E = ROOT / "e2e"
UNIT = ROOT / "tests"
# How far into a module its first test may start: the module docstring, imports, constants
# and a fixture or two fit; a scene (node classes, deployments, stand-ins) does not.
FIRST_TEST_BY_LINE = 150
# Modules whose scenes have not moved to e2e/harness/ yet (the line of their first test): the
# check fails when one of them moves its first test up without leaving this list too.
NOT_YET_MOVED: dict[str, int] = {}


def modules_of_tests(root: Path) -> list[Path]:
    """Every `test_*.py` under root."""
    return sorted(root.rglob("test_*.py"))


def imported_modules(path: Path) -> set[str]:
    """The dotted names a module imports (`from a.b import c` names `a.b` and `a.b.c`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def imports_a_test_module(path: Path) -> list[str]:
    """The test modules ``path`` imports."""
    return sorted(name for name in imported_modules(path)
                  if name.rsplit(".", 1)[-1].startswith("test_"))


def first_test_line(path: Path) -> int | None:
    """The line of the module's first test function (None: it has none)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = [node.lineno for node in tree.body
             if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
             and node.name.startswith("test_")]
    return min(lines, default=None)


def test_no_e2e_test_module_imports_another() -> None:
    importing = {str(path.relative_to(ROOT)): imports_a_test_module(path)
                 for path in modules_of_tests(E2E)}
    assert {path: names for path, names in importing.items() if names} == {}


def test_no_unit_test_module_imports_e2e() -> None:
    """The unit suite runs without the e2e package and its extra (kubernetes, grpc, …)."""
    importing = {str(path.relative_to(ROOT)): sorted(name for name in imported_modules(path)
                                                     if name.split(".")[0] == "e2e")
                 for path in sorted(UNIT.rglob("*.py"))}
    assert {path: names for path, names in importing.items() if names} == {}


def test_every_e2e_test_module_starts_with_its_tests() -> None:
    late = {str(path.relative_to(ROOT)): line for path in modules_of_tests(E2E)
            if (line := first_test_line(path)) is not None and line > FIRST_TEST_BY_LINE}
    assert late == NOT_YET_MOVED, f"first test after line {FIRST_TEST_BY_LINE}: move the " \
        "scene into e2e/harness/"


@pytest.mark.parametrize("source", [
    "from e2e.test_galactic_router import start_node\n",
    "import e2e.test_galactic_router\n",
    "from e2e import test_galactic_router\n",
])
def test_the_check_sees_each_form_of_importing_a_test_module(source: str,
                                                              tmp_path: Path) -> None:
    module = tmp_path / "test_example.py"
    module.write_text(source)
    assert imports_a_test_module(module) == ["e2e.test_galactic_router"]


def test_the_check_passes_a_module_importing_the_harness(tmp_path: Path) -> None:
    module = tmp_path / "test_example.py"
    module.write_text("from e2e.harness.galactic.sites import start_site\nimport pytest\n")
    assert imports_a_test_module(module) == []
