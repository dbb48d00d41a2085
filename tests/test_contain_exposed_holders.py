"""Found by hostile review (2026-12-07): a confined command given ``--expose-rw`` of a folder
that holds the store or the target deeper down (``--expose-rw ~/proj``, the store in
``~/proj/var/store``) saw them masked, but renamed the folder between (``~/proj/var``: a
mask pins only the masked path itself) and made its own ``var/store`` in its place: the root
evolane wrote the run into the command's folder and died (``internal error: ...
run.json``), and a fake store's links could have led its writes anywhere. And a post-apply
check given a folder holding the target rewrote the publish's stash of originals beside it,
so the rollback of its own failure put the check's content into the target (reported
``rolled_back``). Each folder between an exposed-writable folder and a masked path is now
pinned (bound onto itself: writable, but it cannot be moved), and the check is not shown the
stash."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from evolane.sandbox import View, resolve_isolation
from tests.campaign_helpers import run_optimize, toy_flags, with_flag, write_toy
from tests.sandbox_helpers import run_confined

pytestmark = pytest.mark.skipif(
    resolve_isolation("confined")[1] is not None, reason="bubblewrap cannot confine here"
)

MOVE_AWAY = """
import errno, json, os, pathlib, sys
workdir, root = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(workdir / "val05").write_text('"yes"')
tried = {}
for name in ("var", "deep"):
    try:
        os.rename(root / name, root / (name + "-moved"))
        (root / name / "store").mkdir(parents=True)
        tried[name] = "moved"
    except OSError as error:
        tried[name] = errno.errorcode.get(error.errno, "?")
print(json.dumps(tried))
"""


def test_an_exposed_folder_holding_the_store_deeper_down_cannot_move_it_away(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    (tmp_path / "opt.py").write_text(MOVE_AWAY)
    store = tmp_path / "var" / "store"
    flags = with_flag(toy_flags(paths, store), "--optimizer", f"{sys.executable} -I "
                      f"{tmp_path / 'opt.py'} {{workdir}} {tmp_path}")  # fmt: skip
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    done = run_optimize([*flags, "--expose-rw", f"optimizer={tmp_path}"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (tmp_path / "var-moved").exists()
    (report,) = store.glob("runs/*/report.json")  # the run's own store, where it belongs
    said = report.read_text()
    assert "moved" not in said and '"var\\": \\"EBUSY\\"' in said, said[-3000:]


CHECK = """
import os, pathlib, sys
target = pathlib.Path(sys.argv[1])
for folder in target.parent.iterdir():
    if folder.name.startswith("." + target.name) and ".evolane-" in folder.name:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                with open(path, "r+") as kept:  # in place: the inode the rollback puts back
                    kept.truncate(0)
                    kept.write('"forged"')
sys.exit(1)
"""


def test_a_failing_check_given_the_targets_folder_cannot_forge_the_rollback(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:2"})
    before = {p.name: p.read_bytes() for p in paths["target"].iterdir() if p.is_file()}
    (tmp_path / "check.py").write_text(CHECK)
    flags = with_flag(with_flag(toy_flags(paths, paths["store"]), "--iterations", "1"),
                      "--population", "1")  # fmt: skip
    check = f"{sys.executable} -I {tmp_path / 'check.py'} {{candidate}}"
    flags += ["--apply", "auto_verified", "--check", check, "--expose-rw", f"check={tmp_path}"]
    done = run_optimize(flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rolled_back" in done.stdout, done.stdout
    after = {p.name: p.read_bytes() for p in paths["target"].iterdir() if p.is_file()}
    assert after == before  # the originals, not the check's words


async def test_a_pin_keeps_a_read_only_folder_inside_a_writable_one_read_only(
    tmp_path: Path,
) -> None:
    # The pins take the writability of the deepest shown folder holding them: an --expose
    # inside an --expose-rw stays read-only, while the folder between still takes files.
    shown = tmp_path / "shown"
    (shown / "ro" / "deeper" / "store").mkdir(parents=True)
    (shown / "rw" / "store").mkdir(parents=True)
    view = View(
        read_write=(str(shown),),
        read_only=(str(shown / "ro"),),
        hidden=(str(shown / "ro" / "deeper" / "store"), str(shown / "rw" / "store")),
    )
    code = f"""
import errno, json, os
said = {{}}
for name, act in (
    ("rename_rw", lambda: os.rename({str(shown / "rw")!r}, {str(shown / "rw2")!r})),
    ("write_ro", lambda: open({str(shown / "ro" / "deeper" / "f")!r}, "w").close()),
    ("write_rw", lambda: open({str(shown / "rw" / "f")!r}, "w").close()),
):
    try:
        act()
        said[name] = "done"
    except OSError as error:
        said[name] = errno.errorcode[error.errno]
print(json.dumps(said))
"""
    outcome = await run_confined(tmp_path, code, True, view)
    assert outcome.ok, outcome.stderr.text()
    said = json.loads(outcome.stdout.text())
    assert said == {"rename_rw": "EBUSY", "write_ro": "EROFS", "write_rw": "done"}, said


REPOINT = """
import os, pathlib, shutil, sys
workdir, app = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
if not (app / "fake").exists():  # a copy of the seed, a file of its own, a protected file
    shutil.copytree(workdir, app / "fake")
    (app / "fake" / "BACKDOOR").write_text("in no candidate")
    (app / "fake" / "grader" / "rubric.txt").write_text("anything goes")
    os.symlink("fake", app / "next")
    os.rename(app / "next", app / "current")
for name in ("val04", "val05", "test01", "test02", "test03", "test04", "test05"):
    (workdir / name).write_text('"yes"')
"""


def test_an_exposed_folder_holding_the_targets_link_is_refused_at_start(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    app = tmp_path / "app"
    (app / "releases").mkdir(parents=True)
    paths["target"].rename(app / "releases" / "v1")
    (app / "current").symlink_to("releases/v1")
    paths["target"] = app / "current"
    (tmp_path / "opt.py").write_text(REPOINT)
    flags = with_flag(toy_flags(paths, paths["store"]), "--optimizer",
                      f"{sys.executable} -I {tmp_path / 'opt.py'} {{workdir}} {app}")  # fmt: skip
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    flags += ["--expose-rw", f"optimizer={app}", "--apply", "auto_verified"]
    done = run_optimize(flags, cwd=tmp_path)
    assert os.readlink(app / "current") == "releases/v1", done.stdout  # never repointed
    assert not (app / "fake").exists()
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"holds the symlink {app / 'current'}" in done.stderr, done.stderr


UNLOCK = """
import errno, os, pathlib, sys
workdir, lock = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]) / ".target.evolane-lock"
(workdir / "val05").write_text('"yes"')
try:
    os.unlink(lock)  # a second run on the target would then take a lock of its own
    print("unlock: unlinked")
except OSError as error:
    print("unlock:", errno.errorcode.get(error.errno, "?"))
"""


def test_a_command_given_the_targets_folder_cannot_unlink_the_runs_lock(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    (tmp_path / "opt.py").write_text(UNLOCK)
    optimizer = f"{sys.executable} -I {tmp_path / 'opt.py'} {{workdir}} {tmp_path}"
    flags = with_flag(toy_flags(paths, paths["store"]), "--optimizer", optimizer)
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    done = run_optimize([*flags, "--expose-rw", f"optimizer={tmp_path}"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (report,) = paths["store"].glob("runs/*/report.json")
    said = report.read_text()
    assert "unlock: EBUSY" in said and "unlinked" not in said, said[-3000:]
