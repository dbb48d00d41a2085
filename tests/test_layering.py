"""The architecture (DESIGN §1) holds for src/, and the checker catches each kind of breach."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layering import LAYERS, check_tree, read_tree

SRC = Path(__file__).resolve().parents[1] / "src" / "evolane"


def test_the_source_tree_keeps_every_rule() -> None:
    assert check_tree(read_tree(SRC)) == []


def test_every_package_of_the_source_is_in_a_layer() -> None:
    listed = {unit for layer in LAYERS for unit in layer}
    units = {path.name for path in SRC.iterdir() if (path / "__init__.py").exists()}
    units |= {path.stem for path in SRC.glob("*.py")}
    assert units <= listed, units - listed


def _tree(**modules: str) -> dict[str, str]:
    """A small fake package: keyword ``a__b`` is module ``evolane.a.b``."""
    tree = {"evolane": "", "evolane.lanes": "", "evolane.measure": "", "evolane.actors": ""}
    tree.update({"evolane." + name.replace("__", "."): source for name, source in modules.items()})
    return tree


def test_a_clean_fake_tree_passes() -> None:
    tree = _tree(
        lanes___replay="from evolane.actors import Actor\n",
        measure___scheduler="from evolane.lanes import ReplayLane\n",
    )
    assert check_tree(tree) == []


@pytest.mark.parametrize(
    ("modules", "expected"),
    [
        pytest.param(  # today's actors -> campaign
            {"actors___kernel": "from evolane.measure import Pipeline\n"},
            "'measure' is not below 'actors'",
            id="later-layer",
        ),
        pytest.param(  # a lazy import inside a function counts as well
            {"lanes___replay": "def f():\n    from evolane.measure._plan import X\n"},
            "'measure' is not below 'lanes'",
            id="lazy-later-layer",
        ),
        pytest.param(  # today's distributed -> actors.lanes._run
            {"measure___scheduler": "from evolane.lanes._replay import run\n"},
            "private evolane.lanes._replay",
            id="private-module",
        ),
        pytest.param(
            {"measure___scheduler": "import evolane.lanes._replay\n"},
            "private evolane.lanes._replay",
            id="private-plain-import",
        ),
        pytest.param(  # today's supervisors._cells <-> _supervisor (a TYPE_CHECKING import)
            {
                "lanes___a": "from evolane.lanes._b import B\n",
                "lanes___b": (
                    "from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from evolane.lanes._a import A\n"
                ),
            },
            "import cycle between files: evolane.lanes._a <-> evolane.lanes._b",
            id="file-cycle",
        ),
        pytest.param(
            {"measure___plan": "import trio\n"},
            "IO-free module imports trio",
            id="io-in-plan",
        ),
        pytest.param(
            {"measure___plan": "from os import path\n"},
            "IO-free module imports os",
            id="os-in-plan",
        ),
        pytest.param(
            {"lanes___big": "x = 1\n" * 501},
            "501 lines (at most 500)",
            id="long-module",
        ),
        pytest.param(
            {"lanes___f": "def f():\n" + "    x = 1\n" * 81},
            "function f has 81 body lines",
            id="long-function",
        ),
        pytest.param(
            {"newpkg___m": "x = 1\n"},
            "'newpkg' is in no layer",
            id="unlisted-package",
        ),
    ],
)
def test_each_breach_is_reported(modules: dict[str, str], expected: str) -> None:
    problems = check_tree(_tree(**modules))
    assert any(expected in problem for problem in problems), problems


def test_a_package_may_use_its_own_private_modules_and_the_root_fault_hook() -> None:
    tree = _tree(
        lanes___a="from evolane.lanes._b import B\nfrom evolane._faults import INSTALLED\n",
        lanes___b="B = 1\n",
        _faults="INSTALLED = []\n",
    )
    assert check_tree(tree) == []
