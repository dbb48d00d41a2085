"""What a user gets from ``pip install evolane``: ``evolane --version`` (found by review: no
command said which evolane is installed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import evolane

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
