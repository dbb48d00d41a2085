"""``evolane dataset from-trajectory -o PATH`` writes where the user points (found by review):
a pipe or a device is written to, never replaced by a regular file (as root the atomic
rename put one in place of ``/dev/full``), a symlink's target is replaced and the link
kept, and a write that fails is one error line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EVOLANE = [sys.executable, "-m", "evolane"]


def _trajectory(folder: Path) -> Path:
    path = folder / "t.jsonl"
    rows = [
        {
            "session_id": f"s{i}",
            "turn": 0,
            "task": f"greet person {i}",
            "outcome": {"status": "failure" if i % 2 else "success"},
            "target": "greeter",
        }
        for i in range(10)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _derive(folder: Path, output: Path) -> subprocess.CompletedProcess[str]:
    command = [*EVOLANE, "dataset", "from-trajectory", str(_trajectory(folder)), "-o", str(output)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=folder)


def test_a_fifo_is_written_to_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "cases.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the cases fit the pipe's buffer
    try:
        done = _derive(tmp_path, fifo)
        assert done.returncode == 0, done.stderr
        assert fifo.is_fifo()
        received = os.read(reader, 1 << 16).decode()
    finally:
        os.close(reader)
    assert len(received.splitlines()) == 10
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_symlink_keeps_pointing_at_the_file_it_names(tmp_path: Path) -> None:
    real = tmp_path / "data" / "cases.jsonl"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "cases.jsonl"
    link.symlink_to(real)
    done = _derive(tmp_path, link)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and link.resolve() == real
    assert len(real.read_text().splitlines()) == 10


def test_a_folder_or_a_missing_parent_is_one_error_line(tmp_path: Path) -> None:
    for output, why in ((tmp_path, "Is a directory"), (tmp_path / "no" / "c.jsonl", "No such")):
        done = _derive(tmp_path, output)
        assert done.returncode == 2
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"evolane: error: {output}: cannot write: {why}"), line


def test_an_output_that_is_an_input_is_refused_and_kept(tmp_path: Path) -> None:
    """``-o`` naming the trajectory file (or a file of an input folder) replaced the agent's
    records with the derived cases (found by review): refused, exit 2, the file intact."""
    trajectory = _trajectory(tmp_path)
    records = trajectory.read_bytes()
    command = [*EVOLANE, "dataset", "from-trajectory"]
    for given, output in ((trajectory, trajectory), (tmp_path, trajectory)):
        done = subprocess.run(
            [*command, str(given), "-o", str(output)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2
        (line,) = done.stderr.strip().splitlines()
        assert (
            line
            == f"evolane: error: -o {output}: it is an input ({given}); write the cases elsewhere"
        )
        assert trajectory.read_bytes() == records
