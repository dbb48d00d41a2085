"""Each package facade that loads its modules on first use (`evolane._lazy`) imports its
public names once, in its ``TYPE_CHECKING`` block (what type checkers and readers see, and
what `lazy_exports` reads from the compiled facade to load a name), and lists them in
``__all__``; the two agree and every name resolves, from a source install or a bytecode-only
one."""

from __future__ import annotations

import ast
import compileall
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evolane._lazy import imported_names

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


def test_the_library_packages_load_on_first_use() -> None:
    assert {"campaign", "lanes", "measure", "sandbox", "stats", "views"} <= set(FACADES)


@pytest.mark.parametrize("package", FACADES)
def test_a_facade_names_each_public_name_once_and_alike(package: str) -> None:
    checked = _checked_imports(package)
    module = importlib.import_module(f"evolane.{package}")
    assert sorted(module.__all__) == sorted(checked)
    compiled = compile((SRC / package / "__init__.py").read_text(), package, "exec")
    read = imported_names(compiled)  # what the facade's __getattr__ reads
    assert {name: read[name][0] for name in module.__all__} == checked
    for name in module.__all__:
        value = getattr(module, name)
        assert getattr(importlib.import_module(checked[name]), name) is value


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


def test_a_copy_installed_without_sources_resolves_every_name(tmp_path: Path) -> None:
    """Bytecode only (``compileall -b``, the ``.py`` files removed): no block to read, so
    each facade finds its names in its submodules."""
    copy = tmp_path / "evolane"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert compileall.compile_dir(copy, legacy=True, quiet=2)
    for source in copy.rglob("*.py"):
        source.unlink()
    code = (
        "import importlib, sys\n"
        "for package in sys.argv[1:]:\n"
        "    module = importlib.import_module('evolane.' + package)\n"
        "    assert module.__file__.endswith('.pyc'), module.__file__\n"
        "    for name in module.__all__:\n"
        "        getattr(module, name)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "campaign", "store", "lanes"],
        capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_dir_of_a_facade_lists_every_public_name_before_it_is_loaded() -> None:
    code = (
        "import evolane.campaign as c, sys\n"
        "assert 'evolane.campaign._run' not in sys.modules\n"
        "print(' '.join(dir(c)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert {"run_campaign", "StoreLayout", "__all__"} <= set(done.stdout.split())
