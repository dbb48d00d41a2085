"""Found by review: what a template names is shown to a confined command by where it really
is, but was refused by its name alone. ``/run`` is never shown (its sockets connect through
a read-only mount: a root evolane's command is root to D-Bus, systemd or a container
runtime), yet a template naming ``/var/run/docker.sock``, the usual spelling, or a
symlink to ``/run`` showed the host's whole ``/run``. Both spellings are judged now."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evolane.sandbox import folders_to_expose
from evolane.sandbox._confine import confinement_problem
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
