"""Each package facade that loads its modules on first use (`evolane._lazy`) names the same
public names in its ``TYPE_CHECKING`` imports (what type checkers and readers see), its
table (what the interpreter loads) and ``__all__``, and every one of them resolves."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "evolane"
FACADES = sorted(
    path.parent.name for path in SRC.glob("*/__init__.py") if "lazy_exports(" in path.read_text()
)


def _checked_imports(package: str) -> dict[str, str]:
    """``{name: module}`` of the ``if TYPE_CHECKING:`` imports of the package's facade."""
    tree = ast.parse((SRC / package / "__init__.py").read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom), ast.unparse(statement)
                for alias in statement.names:
                    found[alias.asname or alias.name] = statement.module or ""
    return found


def _table(package: str) -> dict[str, str]:
    """``{name: module}`` of the table the facade gives `lazy_exports`."""
    tree = ast.parse((SRC / package / "__init__.py").read_text())
    (call,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "lazy_exports"
    ]
    table = ast.literal_eval(call.args[1])
    return {name: module for module, names in table.items() for name in names}


def test_the_library_packages_load_on_first_use() -> None:
    assert {"campaign", "lanes", "measure", "sandbox", "stats", "views"} <= set(FACADES)


@pytest.mark.parametrize("package", FACADES)
def test_a_facade_names_each_public_name_once_and_alike(package: str) -> None:
    checked, table = _checked_imports(package), _table(package)
    assert checked == table
    module = importlib.import_module(f"evolane.{package}")
    assert sorted(module.__all__) == sorted(table)
    for name in module.__all__:
        value = getattr(module, name)
        assert getattr(importlib.import_module(table[name]), name) is value


@pytest.mark.parametrize("package", FACADES)
def test_an_unknown_name_is_an_attribute_error_and_a_private_module_still_imports(
    package: str,
) -> None:
    module = importlib.import_module(f"evolane.{package}")
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018
    private = sorted(path.stem for path in (SRC / package).glob("_*.py"))[1]
    imported = importlib.import_module(f"evolane.{package}.{private}")
    assert getattr(module, private) is imported


def test_a_star_import_gets_every_public_name() -> None:
    code = "from evolane.campaign import *; print(len(dir()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= len(importlib.import_module("evolane.campaign").__all__)
