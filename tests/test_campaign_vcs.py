"""Found by review: a candidate that edited ``.git/config`` (``core.fsmonitor``) in a target
that is a git work tree was accepted and published, and the user's next ``git status`` ran
its command outside every sandbox, unseen by ``git diff``; a candidate adding a ``.git``
folder of its own, or a bare repository's layout, did the same in its proposal folder for
a shell prompt that runs git there. Version-control metadata is protected whatever
``--protected`` says (`evolane.campaign._vcs`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evolane.campaign._vcs import repository_folders, vcs_paths
from tests.campaign_helpers import toy_flags, with_flag, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]

# Fixes every failing case of the toy (so the candidate is accepted and confirmed), then
# writes what it was told to into the workdir: {path: text}.
OPTIMIZER = textwrap.dedent(
    """
    import json, pathlib, sys
    workdir, writes = pathlib.Path(sys.argv[1]), json.loads(pathlib.Path(sys.argv[2]).read_text())
    for case in workdir.iterdir():
        if case.is_file() and case.read_text().strip() == '"no"':
            case.write_text('"yes"')
    for relative, text in writes.items():
        path = workdir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(path.read_text() + text if path.exists() else text)
    print("fixed every case")
    """
)
PAYLOAD = '\\tfsmonitor = "touch /tmp/evolane-pwned; false"\\n'
REPOSITORY = {"HEAD": "ref: refs/heads/main\n", "objects/info/k": "", "refs/heads/k": ""}


def _writes(kind: str) -> dict[str, str]:
    config = "[core]\n" + PAYLOAD.replace("\\t", "\t").replace("\\n", "\n")
    if kind == "work-tree-config":
        return {".git/config": PAYLOAD.replace("\\t", "\t").replace("\\n", "\n")}
    if kind == "nested-repository":
        return {**{f".git/{k}": v for k, v in REPOSITORY.items()}, ".git/config": config}
    return {**{f"tools/{k}": v for k, v in REPOSITORY.items()}, "tools/config": config}


def _publish_one(tmp_path: Path, paths: dict[str, Path], optimizer: str) -> None:
    """One candidate of ``optimizer`` (a script and its arguments, run by this Python)
    through the real CLI with ``--apply auto_verified``; the run must finish (exit 0)."""
    flags = toy_flags(paths, paths["store"])
    flags = with_flag(flags, "--optimizer", f"{sys.executable} -I {optimizer}")
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    done = subprocess.run(
        [*EVOLANE, "optimize", *flags, "--apply", "auto_verified"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("kind", ["work-tree-config", "nested-repository", "bare-layout"])
def test_a_candidate_touching_repository_metadata_is_never_published(
    tmp_path: Path, kind: str
) -> None:
    paths = write_toy(tmp_path, {}, val=12, test=6, passing=2)
    target = paths["target"]
    if kind == "work-tree-config":
        subprocess.run(["git", "init", "-q", str(target)], check=True)
    before = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    script, writes = tmp_path / "tamper.py", tmp_path / "writes.json"
    script.write_text(OPTIMIZER)
    writes.write_text(json.dumps(_writes(kind)))
    _publish_one(tmp_path, paths, f"{script} {{workdir}} {writes}")
    after = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert after == before  # nothing published, the repository's config untouched
    (report,) = paths["store"].glob("runs/*/report.json")
    funnel = json.loads(report.read_text())["funnel"]
    gates = [gate for slot in funnel for gate in slot["gates"]]
    assert any(
        gate["gate"] == "protected_paths" and gate["outcome"] == "indecisive" for gate in gates
    ), funnel
    assert not list(paths["store"].glob("runs/*/proposals/best"))


PEEK = """
import pathlib, sys
workdir = pathlib.Path(sys.argv[1])
for case in workdir.iterdir():
    if case.is_file() and case.read_text().strip() == '"no"':
        case.write_text('"yes"')
print("repository shown" if (workdir / ".git").exists() else "no repository")
"""


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_targets_repository_is_never_copied_and_survives_a_publish(tmp_path: Path) -> None:
    """Found by review: the target's ``.git`` went into the seed tree, so every optimizer
    and replay got a copy of the history and of a remote's token in ``.git/config``."""
    paths = write_toy(tmp_path, {}, val=12, test=6, passing=2)
    target = paths["target"]
    subprocess.run(["git", "init", "-q", str(target)], check=True)
    url = "https://user:s3cret-token@example.com/skill.git"
    subprocess.run(["git", "-C", str(target), "remote", "add", "origin", url], check=True)
    config = (target / ".git" / "config").read_bytes()
    script = tmp_path / "peek.py"
    script.write_text(PEEK)
    _publish_one(tmp_path, paths, f"{script} {{workdir}}")
    (report,) = (json.loads(p.read_text()) for p in paths["store"].glob("runs/*/report.json"))
    assert [slot["optimizer"] for slot in report["funnel"]] == ["no repository"], report["funnel"]
    assert report["apply"]["status"] == "applied", report["apply"]
    assert (target / "val11").read_text() == '"yes"'  # published beside the repository
    assert (target / ".git" / "config").read_bytes() == config
    assert not list(paths["store"].glob("runs/*/proposals/best/candidate/.git"))


def test_repository_folders_are_found_by_the_layout_git_reads() -> None:
    tree = {"a/HEAD": "", "a/objects/x": "", "a/refs/y": "", "b/HEAD": "", "b/commondir": ""}
    tree |= {"c/HEAD": "", "c/objects/x": "", "HEAD.md": "", "d/head": ""}
    assert repository_folders(tree) == {"a", "b"}  # c has no refs/: git passes it by
    assert repository_folders({"HEAD": "", "objects/1": "", "refs/2": ""}) == {""}


def test_metadata_paths_are_named_and_ordinary_ones_pass() -> None:
    parent = {"skill.md": "", "notes/git.md": ""}
    candidate = {**parent, "x/HEAD": "", "x/commondir": "", "x/hooks/post-checkout": ""}
    touched = ["skill.md", ".git", "sub/.git/hooks/pre-commit", ".hg/hgrc", "x/hooks/post-checkout"]
    touched += ["notes/git.md", ".gitignore", ".github/workflows/ci.yml"]
    assert vcs_paths(touched, parent, candidate) == [
        ".git",
        "sub/.git/hooks/pre-commit",
        ".hg/hgrc",
        "x/hooks/post-checkout",
    ]


def test_a_bare_layout_of_files_or_symlinks_is_a_repository_too() -> None:
    """Found by review: git asks only ``access(X_OK)`` of ``objects`` and ``refs``, so a
    ``HEAD`` beside two executable files (or symlinks to folders) is a repository whose
    ``config`` git reads (``core.worktree`` and ``core.fsmonitor``: ``git status`` there
    ran the command); the layout check looked for folders alone."""
    parent = {"skill.md": ""}
    candidate = {**parent, "evil/HEAD": "", "evil/objects": "", "evil/refs": ""}
    candidate |= {"evil/config": "", "linked/HEAD": "", "linked/objects": "", "linked/refs": ""}
    assert repository_folders(candidate) == {"evil", "linked"}
    touched = sorted(set(candidate) - set(parent))
    assert vcs_paths(touched, parent, candidate) == touched


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_itself_takes_the_file_layout_for_a_repository(tmp_path: Path) -> None:
    """The layout above, on disk: git names the folder as its repository."""
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "HEAD").write_text("ref: refs/heads/main\n")
    for name in ("objects", "refs"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    shown = subprocess.run(
        ["git", "rev-parse", "--absolute-git-dir"],
        cwd=folder,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "GIT_CEILING_DIRECTORIES": str(tmp_path)},
    )
    assert shown.stdout.strip() == str(folder), shown.stderr
    assert repository_folders(["evil/HEAD", "evil/objects", "evil/refs"]) == {"evil"}


def test_metadata_folders_are_named_in_any_case() -> None:
    """Found by review: ``.GIT/config`` passed, and a case-insensitive file system (vfat,
    SMB, an ext4 casefold folder) publishes it into ``.git/config``; git itself refuses
    ``.Git`` in a tree on every platform."""
    touched = [".GIT/config", "a/.Git/hooks/pre-commit", ".HG/hgrc", "gitnotes/.gitx"]
    assert vcs_paths(touched, {}, {}) == touched[:3]
