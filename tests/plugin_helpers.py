"""A test distribution "installed" in a folder: a module and a ``.dist-info`` with entry
points, put on ``sys.path`` (or a subprocess's ``PYTHONPATH``) by the tests of plugins."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest


def write_distribution(root: Path, module: str, source: str, entry_points: str) -> Path:
    """``root`` holding module ``module`` (``source``) and its distribution, version 1.0,
    whose ``entry_points.txt`` is ``entry_points``."""
    info = root / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (root / f"{module}.py").write_text(source)
    name = module.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    return root


def install(root: Path, module: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The distribution in ``root`` on this process's path (importlib caches cleared)."""
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, module, raising=False)
    return root
