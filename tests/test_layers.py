"""The dependency rule written in ``kvwire/__init__.py``, checked by reading every import
(top-level and deferred ones alike) of every module in the project's packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"kvgate", "kvwire", "gateway", "policies", "engine", "loadtests"}
ALLOWED = {
    "kvwire": {"kvwire"},
    "engine": {"engine", "kvwire"},
    "policies": {"policies", "kvwire"},
    "gateway": {"gateway", "policies", "kvwire"},
    "loadtests": {"loadtests", "gateway", "policies", "engine", "kvwire"},
    "kvgate": {"kvgate", "kvwire"},
}


def imported_packages(path: Path) -> set[str]:
    """The project packages ``path`` imports (relative imports stay in its own package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & OURS
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_the_layers_below(package: str) -> None:
    modules = sorted((ROOT / package).rglob("*.py"))
    assert modules, f"package {package} has no modules"
    wrong = {str(m.relative_to(ROOT)): sorted(imported_packages(m) - ALLOWED[package])
             for m in modules}
    assert {m: w for m, w in wrong.items() if w} == {}


def test_the_rule_sees_deferred_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from gateway.app import create_app\n    import engine.cli\n")
    assert imported_packages(module) == {"gateway", "engine"}



def imported_modules(path: Path, package: tuple[str, ...]) -> set[str]:
    """Dotted names of every module ``path`` imports, its relative imports resolved as if it
    sat in ``package`` (``from . import x`` counts ``x`` as a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = [*base, *(node.module.split(".") if node.module else [])]
            found.add(".".join(module))
            found |= {".".join([*module, alias.name]) for alias in node.names}
    return found


def imported_test_modules(path: Path) -> list[str]:
    """The test modules and conftests ``path`` (a file under ``tests/``) imports."""
    package = path.relative_to(ROOT).parent.parts
    return sorted(name for name in imported_modules(path, package)
                  if name.startswith("tests.")
                  and name.rsplit(".", 1)[-1].startswith(("test_", "conftest")))


def test_tests_import_no_other_test_module() -> None:
    """Shared test code lives in ``tests.support``; a test module or a conftest is only
    ever loaded by pytest."""
    wrong = {str(m.relative_to(ROOT)): imported_test_modules(m)
             for m in sorted((ROOT / "tests").rglob("*.py"))}
    assert {m: w for m, w in wrong.items() if w} == {}


def test_the_test_rule_sees_relative_and_absolute_imports(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text("from .conftest import make_core\nfrom . import test_other, helpers\n"
                      "from tests.e2e.test_gateway_engines import start_fleet\n"
                      "import tests.support.waiting\n")
    names = imported_modules(module, ("tests", "e2e"))
    assert {"tests.e2e.conftest", "tests.e2e.test_other", "tests.e2e.helpers",
            "tests.e2e.test_gateway_engines", "tests.support.waiting"} <= names
