"""Found by review: the post-apply check is shown the published target itself, and with it
the target's ``.git`` (a remote's token in ``.git/config``, the whole history), which the
seed tree keeps from every optimizer and replay. A check runs the published candidate's code
(``pytest {candidate}`` runs its ``conftest.py``): that code read the token. The target's
version-control metadata is covered in the check's view now."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolane.sandbox._confine import confinement_problem
from tests.campaign_helpers import run_optimize, shared_folder, toy_flags, write_toy

TOKEN = "ghp_SECRETTOKEN"


@pytest.mark.skipif(confinement_problem() is not None, reason=f"{confinement_problem()}")
@pytest.mark.parametrize("layout", ["folder", "link"])
def test_a_confined_check_sees_the_published_target_but_not_its_git(
    tmp_path: Path, layout: str
) -> None:
    """``link``: ``target -> releases/v1``, checked in its new version folder (built after
    the check's spec was)."""
    paths = write_toy(tmp_path, {"default": "fix:8"}, val=8, test=8, passing=2)
    tree = paths["target"]
    if layout == "link":
        tree = tmp_path / "releases" / "v1"
        tree.parent.mkdir()
        paths["target"].rename(tree)
        paths["target"].symlink_to("releases/v1")
    git = tree / ".git"
    git.mkdir()
    (git / "config").write_text(f'[remote "origin"]\n\turl = https://x:{TOKEN}@example.com/r\n')
    spy = shared_folder(tmp_path / "spy")
    check = (
        f"sh -c 'cat {{candidate}}/REQUIRED > {spy}/required; "
        f"cat {{candidate}}/.git/config > {spy}/git 2>/dev/null; true'"
    )
    flags = toy_flags(paths, paths["store"])
    flags += ["--apply", "auto_verified", "--check", check, "--expose-rw", str(spy)]
    flags += ["--iterations", "1", "--population", "1"]
    done = run_optimize(flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "apply (auto_verified): applied" in done.stdout, done.stdout
    assert (spy / "required").read_text() == "keep me\n"  # it saw the target
    assert TOKEN not in ((spy / "git").read_text() if (spy / "git").exists() else "")
    assert TOKEN in (git / "config").read_text()  # the target's own is untouched
