"""What a user gets from ``pip install evolane``: ``evolane --version`` (found by review: no
command said which evolane is installed), and an optional extra that is not installed refused
up front with the line that names it (found by review: a model role without ``openai`` ran
the campaign, then failed it, exit 1; a local Dask cluster without ``cryptography`` left
a run behind)."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest

import evolane
from tests.campaign_helpers import toy_flags, with_flag, write_toy

ROOT = Path(__file__).resolve().parents[1]


def _evolane(*args: str, blocked: str = "") -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess; ``blocked`` names a package made unimportable (not installed)."""
    code = textwrap.dedent(
        f"""
        import sys
        for name in {blocked.split()!r}:
            sys.modules[name] = None
        sys.argv[0] = "evolane"
        from evolane.cli import main
        main()
        """
    )
    command = [sys.executable, "-c", code, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def test_version_flag_prints_the_package_version() -> None:
    done = _evolane("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"evolane {evolane.__version__}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())  # one version, not two
    assert "version" in project["project"]["dynamic"]
    source = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert source == "evolane._version.__version__"


def test_a_model_role_without_the_llm_extra_is_refused_before_the_run(tmp_path: Path) -> None:
    """``--optimizer llm:MODEL`` or ``--judge llm:MODEL`` without ``openai``: one line naming
    the extra, exit 2, nothing run (it measured the parent, then failed every call: exit 1)."""
    paths = write_toy(tmp_path / "toy", {"default": "noop"})
    flags = toy_flags(paths, tmp_path / "store")
    local = ["--llm-base-url", "http://127.0.0.1:9/v1"]
    model_optimizer = with_flag(flags, "--optimizer", "llm:some-model")
    model_judge = [*with_flag(flags, "--judge", "llm:some-model"), "--rubric", str(paths["plan"])]
    for given, flag in ((model_optimizer, "--optimizer"), (model_judge, "--judge")):
        for command in ("optimize", "estimate")[: 2 if flag == "--optimizer" else 1]:
            done = _evolane(command, *given, *local, blocked="openai")
            assert done.returncode == 2, done.stdout + done.stderr
            assert done.stderr == (
                f"evolane: error: {flag} llm:some-model: the llm backends need the extra "
                "(openai>=1.106): pip install 'evolane[llm]'\n"
            )
    assert not (tmp_path / "store" / "runs").exists() or not any(
        (tmp_path / "store" / "runs").iterdir()
    )


def test_evolane_plugins_says_which_extra_a_listed_builtin_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by review: ``evolane plugins`` listed the llm judge and optimizer and the otel
    observer without their extras, though naming one then fails (exit 2)."""

    def missing(blocked: str) -> dict[tuple[str, str], str | None]:
        done = _evolane("plugins", "--json", blocked=blocked)
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)["plugins"]
        return {(row["group"], row["name"]): row["missing_extra"] for row in rows}

    lacking = missing("openai opentelemetry")
    assert lacking[("evolane.judges", "llm")] == lacking[("evolane.optimizers", "llm")] == "llm"
    assert lacking[("evolane.observers", "otel")] == "otel"
    assert lacking[("evolane.optimizers", "agent:aider")] is None
    installed = missing("")
    assert installed[("evolane.judges", "llm")] is None  # the test extra installs openai
    assert installed[("evolane.observers", "otel")] is None
    monkeypatch.setenv("COLUMNS", "250")  # the table's cells unfolded
    shown = _evolane("plugins", blocked="openai").stdout
    assert "llm (built-in) (needs pip install 'evolane[llm]')" in shown


def test_a_local_dask_cluster_without_cryptography_is_refused_before_the_run(
    tmp_path: Path,
) -> None:
    """``--cluster local:N`` with Dask but without ``cryptography`` (the dask extra makes its
    TLS key with it): one line naming the extra, exit 2, and no run in the store (it left an
    interrupted run and an active campaign behind)."""
    paths = write_toy(tmp_path / "toy", {"default": "noop"})
    store = tmp_path / "store"
    flags = [*toy_flags(paths, store), "--cluster", "local:2"]
    done = _evolane("optimize", *flags, blocked="cryptography")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        "evolane: error: --cluster local:2: a local Dask cluster needs cryptography: "
        "install the dask extra: pip install 'evolane[dask]'\n"
    )
    assert not (store / "runs").exists() or not any((store / "runs").iterdir())


FLOORS = {  # what the code uses, and the last release that lacks it (checked by install)
    "typer": ("from typer.exceptions import", "0.27.3"),  # typer/exceptions.py: from 0.28
    "pydantic": ("ModelWrapValidatorHandler", "2.10.0"),
    "openai": ("api_key=key,", "1.105.0"),  # an async callable as the key: from 1.106
}


def test_the_dependency_floors_have_what_the_code_imports() -> None:
    """Found by review: ``typer>=0.12`` let pip keep a typer 0.12-0.27 already installed, and
    every ``evolane`` command died in an import traceback (no ``typer.exceptions``); with
    ``pydantic>=2.7`` a pydantic before 2.11 failed every campaign (no
    ``ModelWrapValidatorHandler``); with ``openai>=1.40`` (extras llm and test) an openai
    before 1.106 failed every model call ('no running event loop': the key is an async
    callable)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [project["dependencies"], *project["optional-dependencies"].values()]
    specs: dict[str, list[Any]] = {}
    for requirement in map(Requirement, [line for group in declared for line in group]):
        specs.setdefault(requirement.name, []).append(requirement.specifier)
    source = "\n".join(path.read_text() for path in (ROOT / "src").rglob("*.py"))
    for name, (used, lacking) in FLOORS.items():
        assert used in source, f"{name}: the code no longer uses {used!r}; update FLOORS"
        for spec in specs[name]:
            assert not spec.contains(lacking), f"{name}{spec} admits {lacking}"


def test_an_openai_older_than_the_floor_is_not_the_llm_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An openai already installed but older than the floor (pip keeps it when evolane is
    installed without the extra) is refused like a missing one, not run call after call."""
    from evolane.lanes import llm_available

    for version, usable in (
        ("1.55.3", False),
        ("1.105.0", False),
        ("1.106.0", True),
        ("3.63.0", True),
    ):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, v=version: v)
        assert llm_available() is usable, version


def _source_copy(tmp_path: Path) -> Path:
    """A copy of what a build reads from the source tree (no caches)."""
    pytest.importorskip("setuptools")
    tree = tmp_path / "tree"
    caches = shutil.ignore_patterns("__pycache__", "*.egg-info", ".*")
    for name in ("src", "tests"):
        shutil.copytree(ROOT / name, tree / name, ignore=caches)
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, tree / name)
    return tree


def _build(tree: Path, code: str) -> str:
    """Run a setuptools build hook in ``tree``; the archive's file name under dist/."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


def _sdist(tmp_path: Path) -> set[str]:
    """The member names of the sdist setuptools builds from a copy of the source tree."""
    tree = _source_copy(tmp_path)
    code = "from setuptools import build_meta; print(build_meta.build_sdist('dist'))"
    with tarfile.open(tree / "dist" / _build(tree, code)) as archive:
        return {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}


def test_the_sdist_carries_the_whole_test_suite(tmp_path: Path) -> None:
    """Found by review: the sdist held the ``test_*.py`` files only (setuptools' default),
    without conftest.py, the helpers they import or tests/data, so its tests could not run."""
    members = _sdist(tmp_path)
    suite = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert suite - members == set()
    assert not [name for name in members if "__pycache__" in name or name.endswith(".pyc")]


def test_the_wheel_marks_the_package_typed() -> None:
    """Found by review: the wheel had no ``py.typed``, so a type checker of a program that
    embeds evolane ignored every type hint of its API ("missing library stubs or py.typed").
    Checked on the declaration (a wheel build needs the ``wheel`` package)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["evolane"]
    assert (ROOT / "src" / "evolane" / "py.typed").is_file()


MODULES = {"pyyaml": "yaml"}
"""A distribution whose import name differs from its name (lower case, ``-`` as ``_``)."""


def test_every_runtime_dependency_is_imported() -> None:
    """Found by review: ``trio-util`` was installed with every evolane and imported nowhere."""
    from packaging.requirements import Requirement

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    source = "\n".join(path.read_text() for path in (ROOT / "src").rglob("*.py"))
    for name in (Requirement(line).name.lower() for line in declared):
        module = MODULES.get(name, name.replace("-", "_"))
        assert f"import {module}" in source or f"from {module}" in source, name
