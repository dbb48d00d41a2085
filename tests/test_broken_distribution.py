"""A distribution on the path whose ``entry_points.txt`` cannot be parsed (a hand-made or
half-written ``.dist-info``): found by review, pydantic's plugin loader, which reads every
distribution's entry points when the first model is built, raised inside evolane's start
and printed a traceback. evolane now says so in one line naming the file and line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.campaign_helpers import toy_flags, write_toy
from tests.plugin_helpers import write_distribution

BROKEN = "[console_scripts]\nbroken-tool = broken_dist:main\nthis line names no entry point\n"


@pytest.mark.parametrize("command", [["schema", "report"], ["optimize", "--dry-run"]])
def test_a_broken_entry_points_file_on_the_path_is_one_line_naming_it(
    tmp_path: Path, command: list[str]
) -> None:
    site = write_distribution(tmp_path / "site", "broken_dist", "", BROKEN)
    path = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    if command[0] == "optimize":
        paths = write_toy(tmp_path, {"0.0": "fix:1"})
        command = [*command, *toy_flags(paths, tmp_path / "store")]
    done = subprocess.run(
        [sys.executable, "-m", "evolane", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    where = site / "broken_dist-1.0.dist-info" / "entry_points.txt"
    assert done.stderr.splitlines() == [
        f"evolane: error: {where}:3: not an entry point ('name = module:attr' under a [group]): "
        "a broken distribution on the path (PYTHONPATH, site-packages); fix or remove it"
    ]
