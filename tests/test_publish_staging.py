"""Where a publish stages the new versions: out of a reader's sight (in the stash beside the
target), unless a rename from there would cross a filesystem (found by review: a loader
globbing the target read the hidden temp files ``.tNNN.evolane-*`` during a publish)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from evolane.campaign._apply import ApplyJournal
from evolane.sandbox import SandboxHost
from evolane.store import BlobStore
from tests.test_publish_faithful import Sampler, Site, hidden, on_journal


def _names(root: Path) -> list[str]:
    """Every file name under ``root`` as one walk lists them (an agent's ``rglob("*")``)."""
    return [os.path.join(folder, name) for folder, _, files in os.walk(root) for name in files]


async def test_a_reader_of_the_target_never_sees_a_temp_name(
    tmp_path: Path, store: BlobStore, host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = Site(tmp_path, store, foreign=False)
    states: list[str] = []
    with Sampler(lambda: _names(site.target)) as walker:

        def between_steps(record: ApplyJournal) -> None:
            states.append(record.state)
            walker.await_samples(2)  # whole walks of the target at every step

        on_journal(monkeypatch, between_steps)
        with trio.fail_after(60):
            outcome = await site.apply(host)
    assert outcome.status == "applied", outcome.message
    assert "staged" in states and "swapping" in states
    seen = {os.path.relpath(name, site.target) for walk in walker.samples for name in walk}
    assert [name for name in seen if ".evolane-" in name] == []
    assert "new/deep/added.md" in seen and "old.txt" in seen  # it saw both trees
    assert hidden(site.target.parent) == [] and hidden(site.target) == []


MOUNTED = """
import json, os, subprocess, sys
from pathlib import Path
import trio
from evolane.campaign import _apply
from evolane.campaign._apply import apply_candidate, recover_apply
from evolane.sandbox import open_sandbox
from evolane.store import BlobStore, snapshot_tree
from tests.test_publish_faithful import Site, entries, hidden

root, mounted = Path(sys.argv[1]), Path(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "evolane-test", str(mounted)], check=True)
store = BlobStore(root / "store")
site = Site(root, store, foreign=False)  # its target is the mount point
before = entries(site.target)
real = _apply._write_journal

class Crash(BaseException):
    pass

def crash_when_staged(path, record):
    real(path, record)
    if record.state == "staged":
        raise Crash()

async def publish(crash):
    _apply._write_journal = crash_when_staged if crash else real
    async with open_sandbox(root / "sandbox", store=store) as host:
        try:
            return await site.apply(host)
        except Crash:
            return None

found = {"staging": None}
assert trio.run(publish, True) is None
plan = json.loads((site.run_dir / "apply.json").read_text())["plan"]
found["staging"] = plan["staging"]
found["recovered"] = recover_apply(store, site.run_dir).status
found["exact"] = entries(site.target) == before
found["hidden"] = hidden(site.target) + hidden(site.target.parent)
found["applied"] = trio.run(publish, False).status
found["prompt"] = (site.target / "prompt.md").read_text()
found["hidden_after"] = hidden(site.target) + hidden(site.target.parent)
print(json.dumps(found))
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounting needs root"
)
def test_a_target_that_is_a_mount_point_stages_beside_its_paths(tmp_path: Path) -> None:
    """The stash (beside the target) is on another filesystem than a target that is a mount
    point: its temps are staged in the target, and a crash is still undone exactly."""
    mounted = tmp_path / "site" / "skill"
    mounted.mkdir(parents=True)
    repo = Path(__file__).resolve().parents[1]
    argv = ["unshare", "-m", sys.executable, "-c", textwrap.dedent(MOUNTED)]
    done = subprocess.run(
        [*argv, str(tmp_path), str(mounted)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=repo,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo)])},
        check=False,
    )
    if done.returncode != 0 and "mount" in done.stderr and "permission" in done.stderr.lower():
        pytest.skip("mounting is not permitted here")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {
        "staging": "beside",
        "recovered": "recovered",
        "exact": True,
        "hidden": [],
        "applied": "applied",
        "prompt": "new prompt\n",
        "hidden_after": [],
    }
    assert list(mounted.iterdir()) == []  # the mount was the child's own namespace's
