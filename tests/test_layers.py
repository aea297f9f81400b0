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
    "kvgate": {"kvgate"},
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
