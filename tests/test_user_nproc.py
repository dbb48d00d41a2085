"""A non-root evolane under ``ulimit -u`` (RLIMIT_NPROC) keeps room for itself.

Found by review: RLIMIT_NPROC counts every process and thread of evolane's user, evolane's
own among them, and with no writable pids cgroup nothing else bounds a command tree: a
candidate's fork bomb took the user's whole room, evolane could start no thread or process
more, and the run stopped as the host's failure. Each command's RLIMIT_NPROC is now
evolane's own less a reserve (`evolane.sandbox.user_process_cap`), set before any user
namespace is made. These tests run evolane as a uid of their own (`tests.nonroot_helpers`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from evolane.sandbox import resolve_isolation
from tests.campaign_helpers import toy_flags, with_flag, write_toy
from tests.nonroot_helpers import as_user, free_uid, needs_root_and_setpriv, owned_folder

NPROC = 150
"""The ``ulimit -u`` the tests' evolane runs under."""
PYTHON = "/usr/bin/python3"  # the uid may not read the venv's (a folder of root's)
_BOMB = """
import os, sys, time
flags, mode, name = sys.argv[1:4]
def bomb():
    n = 0
    while True:
        try:
            if mode == "threads":
                import threading
                threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
            elif os.fork() == 0:
                time.sleep(600)
                os._exit(0)
        except (OSError, RuntimeError):
            return n
        n += 1
refused = bomb()
with open(os.path.join(flags, "." + name), "w") as said:
    said.write(str(refused))
os.rename(os.path.join(flags, "." + name), os.path.join(flags, name))  # seen whole or not at all
time.sleep(600)
"""
_EVOLANE = """
import json, os, sys, threading, time, trio
from evolane import sandbox
from evolane.sandbox import SandboxSpec, View, open_sandbox
async def main(root, isolation, mode, way, bomb):
    flags = os.path.join(root, "flags")
    os.mkdir(flags)
    view = View(read_write=(flags,))
    cap = getattr(sandbox, "user_process_cap", None)  # none before the fix
    said = {"cap": cap().cap if cap else None}
    ended = set()  # a tree the other's bomb left no room to start (its launcher's forks)
    async def tree(name, spec):
        await host.run(spec, timeout=60)
        ended.add(name)
    held = lambda n: n in ended or os.path.exists(os.path.join(flags, n))
    async with open_sandbox(os.path.join(root, "sandbox"), use_spawner=way == "spawner") as host:
        async with trio.open_nursery() as nursery:
            for name in ("one", "two"):  # two trees at once: they share the room
                argv = ("/usr/bin/python3", "-I", "-c", bomb, flags, mode, name)
                spec = SandboxSpec(argv=argv, isolation=isolation, kill_grace=0.2, view=view)
                nursery.start_soon(tree, name, spec)
            with trio.fail_after(120):  # a guard against a hang, not a timing figure
                while not (held("one") and held("two")):
                    await trio.sleep(0.05)
            said["started"] = 0  # the bombs hold their room: evolane starts threads still
            try:
                for _ in range(8):
                    threading.Thread(target=time.sleep, args=(0.2,)).start()
                    said["started"] += 1
            except RuntimeError:
                pass
            nursery.cancel_scope.cancel()  # the kill ladder ends the bombs
    said["refused"] = [
        int(open(os.path.join(flags, n)).read())
        for n in ("one", "two") if os.path.exists(os.path.join(flags, n))
    ]
    print(json.dumps(said))
trio.run(main, *sys.argv[1:])
"""


@pytest.mark.parametrize(
    ("isolation", "mode", "way"),
    [
        ("process", "fork", "spawner"),
        ("process", "threads", "launcher"),
        ("confined", "fork", "spawner"),  # a user namespace of its own (user counts)
        ("confined", "threads", "launcher"),
    ],
)
def test_fork_bombs_leave_a_non_root_evolane_room_under_its_ulimit(
    isolation: str, mode: str, way: str
) -> None:
    needs_root_and_setpriv()
    if isolation == "confined" and resolve_isolation("confined")[1] is not None:
        pytest.skip("bubblewrap cannot run here")
    uid = free_uid()
    with owned_folder(uid) as home:
        argv = [sys.executable, "-c", _EVOLANE, str(home), isolation, mode, way, _BOMB]
        done = as_user(uid, argv, home, nproc=NPROC)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)
    assert said["started"] == 8, said  # 0 on the old code: the bombs took the user's room
    assert 0 < sum(said["refused"]) < said["cap"] < NPROC, said


def test_a_candidates_fork_bomb_under_a_non_root_ulimit_fails_the_candidate_not_the_run(
    tmp_path: Path,
) -> None:
    needs_root_and_setpriv()
    uid = free_uid()
    with owned_folder(uid) as home:
        paths = write_toy(home, {"0.0": "fork:8", "0.1": "fix:8"})
        (home / "replay.py").write_text(_REPLAY_BOMB)
        flags = [*toy_flags(paths, paths["store"]), "--iterations", "1", "--isolation", "process"]
        optimizer = f"{PYTHON} -I {paths['script']} {{workdir}} {{prompt_file}} {paths['plan']}"
        flags = with_flag(flags, "--optimizer", optimizer)
        flags = with_flag(
            flags, "--replay", f"{PYTHON} -I {home}/replay.py {{candidate}} {{output_dir}}"
        )
        for folder, names, files in os.walk(home):
            for name in (*names, *files):
                os.chown(os.path.join(folder, name), uid, uid)
        done = as_user(
            uid, [sys.executable, "-m", "evolane", "optimize", *flags], home, nproc=NPROC
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        (events,) = Path(paths["store"]).glob("runs/*/events.jsonl")
        records = [json.loads(line) for line in events.read_text().splitlines()]
        (report,) = Path(paths["store"]).glob("runs/*/report.json")
        decided = json.loads(report.read_text())["decisions"]
    preflight = [
        line for r in records if r.get("kind") == "event.estimate" for line in r["preflight"]
    ]
    (said,) = [line for line in preflight if line.startswith("commands fork only while")]
    assert f"(ulimit -u {NPROC}, " in said, said
    assert [(d["slot"], d["decision"]) for d in decided] == [(0, "reject"), (1, "accept")]


_REPLAY_BOMB = """
import os, sys, time
candidate, out = sys.argv[1:3]
if os.path.exists(os.path.join(candidate, "FORK")):
    while True:
        try:
            pid = os.fork()
        except OSError:
            time.sleep(2)  # holding the room a while
            sys.exit(1)
        if pid == 0:
            time.sleep(600)
            os._exit(0)
with open(os.path.join(candidate, os.environ["EVOLANE_CASE_ID"])) as answer:
    with open(os.path.join(out, "output.json"), "w") as output:
        output.write(answer.read())
"""
