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
from unittest import mock

import pytest

from evolane.campaign._containment import share_host_pids, user_process_line
from evolane.inputs import Case, Dataset
from evolane.sandbox import NAMESPACE_EXTRA_PROCESSES, resolve_isolation
from evolane.sandbox._ucounts import UserProcessCap
from tests.campaign_helpers import toy_config, toy_flags, with_flag, write_toy
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


@pytest.mark.parametrize("isolation", ["process", pytest.param("confined", marks=pytest.mark.slow)])
def test_a_candidates_fork_bomb_under_a_non_root_ulimit_fails_the_candidate_not_the_run(
    isolation: str,
) -> None:
    needs_root_and_setpriv()
    if isolation == "confined" and resolve_isolation("confined")[1] is not None:
        pytest.skip("bubblewrap cannot run here")
    uid = free_uid()
    with owned_folder(uid) as home:
        paths = write_toy(home, {"0.0": "fork:8", "0.1": "fix:8"})
        (home / "replay.py").write_text(_REPLAY_BOMB)
        flags = [*toy_flags(paths, paths["store"]), "--iterations", "1", "--isolation", isolation]
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
    start = "commands fork only while" if isolation == "process" else "each command tree may"
    (said,) = [line for line in preflight if line.startswith(start)]  # confined: a share each
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


_HONEST = """
import os, sys, time
children = []
for _ in range(10):  # an honest command's few children, started while a bomb runs beside it
    pid = os.fork()
    if pid == 0:
        time.sleep(0.2)
        os._exit(0)
    children.append(pid)
print(sum(os.waitpid(pid, 0)[1] == 0 for pid in children))
"""
_BESIDE = """
import functools, json, os, sys, trio
from evolane.sandbox import Limits, SandboxSpec, View, open_sandbox
async def main(root, bomb, honest):
    flags = os.path.join(root, "flags")
    os.mkdir(flags)
    limits = Limits(processes=40)  # as a campaign's share of the user's room would be
    view = View(read_write=(flags,))
    said = {}
    async with open_sandbox(os.path.join(root, "sandbox")) as host:
        async with trio.open_nursery() as nursery:
            argv = ("/usr/bin/python3", "-I", "-c", bomb, flags, "fork", "bomb")
            spec = SandboxSpec(argv=argv, isolation="confined", kill_grace=0.2, view=view,
                               limits=limits)
            nursery.start_soon(functools.partial(host.run, spec, timeout=60))
            with trio.fail_after(120):  # a guard against a hang, not a timing figure
                while not os.path.exists(os.path.join(flags, "bomb")):
                    await trio.sleep(0.05)
            spec = SandboxSpec(argv=("/usr/bin/python3", "-I", "-c", honest),
                               isolation="confined", limits=limits)
            done = await host.run(spec, timeout=60)  # while the bomb holds its room
            said["honest"] = [done.status, done.exit_code, done.stdout.text(), done.error]
            said["enforcement"] = list(done.enforcement)
            nursery.cancel_scope.cancel()
    said["refused"] = int(open(os.path.join(flags, "bomb")).read())
    print(json.dumps(said))
trio.run(main, *sys.argv[1:])
"""


def test_a_confined_fork_bomb_under_a_non_root_ulimit_leaves_an_honest_command_its_forks() -> None:
    """Found by review: every confined tree shared the one room left under evolane's
    ``ulimit -u``, so while a candidate's bomb held it an honest command's fork failed, as
    that command's own failure (its case scored 0). Each tree's RLIMIT_NPROC is now set
    inside its own user namespace: it counts that tree alone."""
    needs_root_and_setpriv()
    if resolve_isolation("confined")[1] is not None:
        pytest.skip("bubblewrap cannot run here")
    uid = free_uid()
    with owned_folder(uid) as home:
        argv = [sys.executable, "-c", _BESIDE, str(home), _BOMB, _HONEST]
        done = as_user(uid, argv, home, nproc=NPROC)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)
    assert said["honest"][:3] == ["exited", 0, "10\n"], said  # old code: its forks failed
    assert "tree_nproc_rlimit" in said["enforcement"], said
    assert 0 < said["refused"] <= 40, said  # the bomb refused in its own tree's room


def test_each_confined_tree_takes_a_share_of_a_non_root_users_room() -> None:
    # Under ulimit -u 300 with 20 tasks in use, evolane keeps 64 and its 6 trees (4 replay
    # lanes, a population of 2) share what is left, each below its --max-procs 512.
    paths = {name: Path(f"/nowhere/{name}") for name in ("target", "dataset", "store")}
    paths |= {"script": Path("/nowhere/o.py"), "plan": Path("/nowhere/plan.json")}
    config = toy_config(paths, max_procs=512, isolation="confined")
    user = UserProcessCap(cap=236, soft=300, used=20)
    cases = Dataset([Case(id="c1", input="x", expected_output="yes")])
    with (
        mock.patch("evolane.campaign._containment.process_headroom", return_value=None),
        mock.patch("evolane.campaign._containment.user_process_cap", return_value=user),
        mock.patch("evolane.campaign._containment.trees_own_process_limit", return_value=True),
        mock.patch(
            "evolane.campaign._containment.resolve_isolation", return_value=("confined", None)
        ),
    ):
        shared, said = share_host_pids(config, cases)
        line = user_process_line(shared, cases)
    share = (280 - 64) // 6 - NAMESPACE_EXTRA_PROCESSES
    assert (shared.commands.max_procs, shared.commands.max_procs_asked) == (share, 512)
    assert said is not None and said.startswith(f"--max-procs 512 lowered to {share} a command")
    assert "evolane's user may start 280 more processes and threads (ulimit -u 300)" in said
    own = share + NAMESPACE_EXTRA_PROCESSES
    assert line is not None and line.startswith(f"each command tree may hold {own} processes")
