"""Found by review: what a template names is shown to a confined command by where it really
is, but was refused by its name alone. ``/run`` is never shown (its sockets connect through
a read-only mount: a root evolane's command is root to D-Bus, systemd or a container
runtime), yet a template naming ``/var/run/docker.sock``, the usual spelling, or a
symlink to ``/run`` showed the host's whole ``/run``. Both spellings are judged now."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolane.sandbox import folders_to_expose
from evolane.sandbox._confine import confinement_problem, program_folders
from tests.campaign_helpers import run_optimize, shared_folder, toy_flags, write_toy


def test_a_symlink_to_a_host_only_or_private_folder_is_not_shown(tmp_path: Path) -> None:
    links = {"run": "/run", "proc": "/proc", "tmp": "/tmp", "root": "/"}
    for name, target in links.items():
        (tmp_path / name).symlink_to(target)
    (tmp_path / "mine").mkdir()
    named = [str(tmp_path / name) for name in [*links, "mine"]]
    named += ["/var/run", "/var/run/.", str(tmp_path / "proc" / "self" / "status")]
    assert folders_to_expose(named) == [str(tmp_path / "mine")]


@pytest.mark.skipif(confinement_problem() is not None, reason=f"{confinement_problem()}")
def test_a_replay_naming_a_link_to_run_sees_none_of_it(tmp_path: Path) -> None:
    (tmp_path / "run-link").symlink_to("/run")
    if not os.listdir("/run"):
        pytest.skip("this host's /run is empty")
    paths = write_toy(tmp_path, {"default": "noop"}, val=8, test=0, passing=8)
    spy = shared_folder(tmp_path / "spy")
    flags = toy_flags(paths, paths["store"])
    flags[flags.index("--replay") + 1] = (
        'sh -c \'ls -A "$3" > "$4/$EVOLANE_CASE_ID" 2>/dev/null; '
        'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\' '
        f"replay {{candidate}} {{output_dir}} {tmp_path / 'run-link'} {spy}"
    )
    flags += ["--expose-rw", str(spy), "--iterations", "1", "--population", "1"]
    done = run_optimize(flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = {path.name: path.read_text() for path in spy.iterdir()}
    assert len(seen) == 8 and not any(seen.values()), seen


def test_a_programs_prefix_is_never_a_home_nor_a_folder_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: a program in ``~/bin`` had the whole home shown as its prefix."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    assert program_folders(f"{home}/bin/tool") == [f"{home}/bin"]
    assert program_folders(f"{home}/tool") == [f"{home}/tool"]
    assert program_folders("/root/bin/tool") == ["/root/bin"]
    assert program_folders("/home/me/bin/tool") == ["/home/me/bin"]
    assert program_folders("/home/bin/tool") == ["/home/bin/tool"]  # /home/bin: a home
    assert program_folders("/tmp/bin/tool") == ["/tmp/bin"]
    assert program_folders("/run/bin/tool") == []
    assert program_folders(f"{tmp_path}/venv/bin/python") == [f"{tmp_path}/venv"]
    # A home's hidden folder holds the user's data beside its bin (~/.local/share's
    # credentials, ~/.cargo/credentials.toml): only the bin is shown, unless it is a venv.
    assert program_folders(f"{home}/.local/bin/claude") == [f"{home}/.local/bin"]
    assert program_folders("/home/me/.cargo/bin/tool") == ["/home/me/.cargo/bin"]
    (home / ".venv").mkdir(parents=True)
    (home / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert program_folders(f"{home}/.venv/bin/python") == [f"{home}/.venv"]
    assert program_folders(f"{home}/.tools/lib/tool") == [f"{home}/.tools/lib"]


@pytest.mark.skipif(confinement_problem() is not None, reason=f"{confinement_problem()}")
def test_a_judge_run_by_name_from_home_bin_reads_nothing_else_of_the_home(
    tmp_path: Path,
) -> None:
    """Found by review: ``--judge 'mygrader ...'`` found in ``~/bin`` read ``~/.ssh``."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE-KEY")
    (home / "bin").mkdir()
    spy = shared_folder(tmp_path / "spy")
    grader = home / "bin" / "mygrader"
    grader.write_text(
        f"#!/bin/sh\ncat {home}/.ssh/id_rsa >> {spy}/seen 2>/dev/null\necho '{{\"score\": 1}}'\n"
    )
    grader.chmod(0o755)
    paths = write_toy(tmp_path, {"default": "noop"}, val=8, test=0, passing=8)
    flags = toy_flags(paths, paths["store"])
    flags += ["--judge", "mygrader {case_file}", "--expose-rw", str(spy)]
    flags += ["--iterations", "1", "--population", "1"]
    env = {**os.environ, "HOME": str(home), "PATH": f"{home / 'bin'}:{os.environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *flags],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = (spy / "seen").read_text() if (spy / "seen").exists() else ""
    assert "PRIVATE-KEY" not in seen
