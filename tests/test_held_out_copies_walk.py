"""What the copy scan walks (`campaign._copies.scan_folders`): a project's files, not a
Python's installed code, which a run is shown at every start (its standard library and
site-packages: 34,000 files and 490 MiB walked for a replay run by a virtual environment's
Python, whose prefix resolves to a pyenv install; found by review)."""

from __future__ import annotations

from pathlib import Path

from evolane.campaign._copies import scan_folders

ANSWERS = [f"the route number {i} ends at harbour {i * 7919}" for i in range(3)]
TOKENS = {answer.encode(): place for place, answer in enumerate(ANSWERS)}


def _copy(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f'{{"answer": "{answer}"}}\n' for answer in ANSWERS))


def test_a_python_install_s_library_is_not_walked_but_the_rest_is(tmp_path: Path) -> None:
    prefix = tmp_path / "python"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python3").write_text("#!/bin/sh\n")
    stdlib = prefix / "lib" / "python3.11"
    stdlib.mkdir(parents=True)
    (stdlib / "os.py").write_text("")
    for i in range(20):
        _copy(stdlib / "json" / f"m{i}.py")
    _copy(stdlib / "site-packages" / "pkg" / "data.jsonl")
    _copy(tmp_path / "python" / "notes" / "traces.jsonl")
    scan = scan_folders([str(prefix)], (), TOKENS, 3)
    assert scan.copies == [(str(prefix / "notes" / "traces.jsonl"), 3)]
    assert scan.files == 2 and not scan.partial  # bin/python3 and the log


def test_a_virtual_environment_s_own_folders_are_not_walked(tmp_path: Path) -> None:
    """Its bin, lib, include, share are installed code; a file beside them is the user's
    (``python -m venv .`` in a project)."""
    project = tmp_path / "proj"
    (project / "bin").mkdir(parents=True)
    (project / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for tree in ("bin", "lib", "include", "share"):
        _copy(project / tree / "copy.jsonl")
    _copy(project / "data" / "traces.jsonl")
    scan = scan_folders([str(project)], (), TOKENS, 3)
    assert scan.copies == [(str(project / "data" / "traces.jsonl"), 3)]
