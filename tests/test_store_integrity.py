"""Store integrity (issue 17 item 6): a store and a target that contain each other are
refused, a write error or a corrupt blob ends the run ``failed`` with one clear line, and
``evolane fsck`` finds and quarantines damaged objects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.campaign_helpers import toy_flags, write_toy

PLAN = {"0.0": "fix:2", "0.1": "harm:1", "1.0": "fix:1"}
EVOLANE = [sys.executable, "-m", "evolane"]


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLANE, *args], capture_output=True, text=True, timeout=timeout)


def _one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evolane: error:"), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    return lines[0]


def test_a_store_inside_the_target_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = paths["target"] / "sub" / ".." / ".evolane"
    line = _one_line(_run(["optimize", *toy_flags(paths, store)]), 2)
    assert "--store" in line and "--target" in line and str(paths["target"]) in line
    assert not (paths["target"] / ".evolane").exists()
    assert not (paths["target"] / "sub").exists()


def test_a_target_inside_the_store_through_a_symlink_exits_2(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    store.mkdir()
    (paths["target"]).rename(store / "target")
    link = tmp_path / "link"
    link.symlink_to(store / "target")
    flags = toy_flags({**paths, "target": link}, store)
    line = _one_line(_run(["optimize", *flags]), 2)
    assert "inside --store" in line and str(link) in line and str(store) in line
    assert sorted(p.name for p in store.iterdir()) == ["target"]
