"""Found by review: the kernel counts some objects per user, host-wide (inotify instances:
128 by default; inotify watches, fanotify groups, POSIX message queue bytes, key bytes),
and a confined replay of a root evolane took all of root's: while it ran, no other program
of root could make an inotify instance (EMFILE), a fanotify group or a message queue, nor
add a 1 KB key. A confined command now runs in a user namespace of its own whose limits
are a share of evolane's (`evolane.sandbox._ucounts`), message queue bytes and queued
signals are rlimits at a share of evolane's, and the keyring calls are refused.

The hostile command here is real (through ``evolane optimize`` and through each way a
command starts); it takes what it can and says how many it got.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from evolane.sandbox import View
from evolane.sandbox._confine import confinement_problem
from evolane.sandbox._ucounts import RLIMIT_SHARE, share, user_count_caps
from tests.campaign_helpers import shared_folder, toy_flags, wait_for, write_toy
from tests.nonroot_helpers import as_user, free_uid, needs_root_and_setpriv, owned_folder
from tests.sandbox_helpers import run_confined

pytestmark = pytest.mark.skipif(
    confinement_problem() is not None, reason=f"no confinement here: {confinement_problem()}"
)

TAKE = textwrap.dedent(
    """
    import ctypes, errno, json, os
    libc = ctypes.CDLL(None, use_errno=True)

    def error():
        return errno.errorcode.get(ctypes.get_errno(), "?")

    def take():
        got, instances = {}, []
        while len(instances) < 1000:  # inotify instances
            fd = libc.inotify_init1(0o2000000)
            if fd < 0:
                got["inotify_error"] = error()
                break
            instances.append(fd)
        got["inotify"] = len(instances)
        watches, files = set(), (os.path.join(r, f) for r, _, fs in os.walk("/usr") for f in fs)
        if instances:  # inotify watches: one instance, every file of /usr it may take
            os.close(instances.pop())
            watcher = libc.inotify_init1(0o2000000)
            for name in files:
                watch = libc.inotify_add_watch(watcher, name.encode(), 0x2)  # one a file
                if watch < 0 and ctypes.get_errno() == errno.ENOSPC or len(watches) > WATCHES:
                    break
                watches.add(watch)  # a second link to a file gets its first watch again
            watches.discard(-1)
        got["watches"] = len(watches)
        rt, queues = ctypes.CDLL("librt.so.1", use_errno=True), 0
        while queues < 20:  # message queues of the default size (80 KiB of messages)
            if rt.mq_open(f"/evolane-test-q{queues}".encode(), 0o102, 0o600, None) < 0:
                break
            queues += 1
        got["queues"] = queues
        for number in range(queues):
            rt.mq_unlink(f"/evolane-test-q{number}".encode())
        key = libc.syscall(ADD_KEY, b"user", b"evolane-test", b"x" * 1024, 1024, -2)
        got["key"] = key >= 0 or error()
        return got, instances
    """
)


QUEUE_BYTES = 10 * 8192
"""The messages of a POSIX message queue of the default size (10 of 8 KiB)."""


def _script(watches: int) -> str:
    add_key = {"x86_64": 248, "aarch64": 217}.get(os.uname().machine, -1)
    return f"WATCHES = {watches}\nADD_KEY = {add_key}\n{TAKE}"


def _watch_cap() -> int:
    caps = dict(user_count_caps())
    return caps["/proc/sys/user/max_inotify_watches"]


def _an_instance_here() -> bool:
    """Whether this process (evolane's uid) can still make an inotify instance."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    if fd < 0:
        assert ctypes.get_errno() == errno.EMFILE, os.strerror(ctypes.get_errno())
        return False
    os.close(fd)
    return True


def test_a_hostile_replay_takes_at_most_its_share_of_the_users_counts(tmp_path: Path) -> None:
    """Through ``evolane optimize``: one replay takes what it can of 1,000 inotify instances
    and holds them; meanwhile this process, of the same uid, still makes one."""
    paths = write_toy(tmp_path / "toy", {"default": "fix:8"}, val=8, test=8, passing=2)
    spy = shared_folder(tmp_path / "spy")
    tools = tmp_path / "tools"
    tools.mkdir()
    script = tools / "hoard.py"
    script.write_text(
        f"import os, sys, time\nSPY = {str(spy)!r}\n{_script(_watch_cap())}\n"
        + textwrap.dedent(
            """
            candidate, out = sys.argv[1:]
            answer = open(os.path.join(candidate, os.environ["EVOLANE_CASE_ID"])).read()
            open(os.path.join(out, "output.json"), "w").write(answer)
            try:
                os.mkdir(os.path.join(SPY, "first"))  # one replay hoards
            except FileExistsError:
                sys.exit(0)
            got, held = take()
            with open(os.path.join(SPY, "got.json.part"), "w") as handle:
                json.dump(got, handle)
            os.rename(os.path.join(SPY, "got.json.part"), os.path.join(SPY, "got.json"))
            while os.path.exists(os.path.join(SPY, "hold")):  # the test looks meanwhile
                time.sleep(0.02)
            """
        )
    )
    flags = toy_flags(paths, paths["store"])
    flags[flags.index("--replay") + 1] = (
        f"{sys.executable} -I {script} {{candidate}} {{output_dir}}"
    )
    flags += ["--iterations", "1", "--population", "1", "--isolation", "confined"]
    flags += ["--expose-rw", str(spy)]
    (spy / "hold").write_text("")
    command = [sys.executable, "-m", "evolane", "optimize", *flags]
    run = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(spy / "got.json", run, "the hoarding replay took its share")
        got = json.loads((spy / "got.json").read_text())
        here = _an_instance_here()  # while the replay holds its instances
    finally:
        (spy / "hold").unlink()
        _, err = run.communicate(timeout=600)
    assert run.returncode == 0, err.decode()
    caps = dict(user_count_caps())
    assert 0 < got["inotify"] <= caps["/proc/sys/user/max_inotify_instances"], got
    assert got["inotify_error"] == "EMFILE", got
    assert 0 < got["watches"] <= _watch_cap(), got
    assert here, got


@pytest.mark.parametrize("spawner", [True, False], ids=["spawn server", "launcher chain"])
async def test_each_way_a_confined_command_starts_caps_its_counts(
    tmp_path: Path, spawner: bool
) -> None:
    code = _script(_watch_cap()) + "\nprint(json.dumps(take()[0]))\n"
    outcome = await run_confined(tmp_path, code, spawner, View())
    assert outcome.ok, outcome.stderr.text()
    got = json.loads(outcome.stdout.text())
    caps = dict(user_count_caps())
    assert 0 < got["inotify"] <= caps["/proc/sys/user/max_inotify_instances"], got
    assert 0 < got["watches"] <= caps["/proc/sys/user/max_inotify_watches"], got
    queue_bytes = resource.getrlimit(resource.RLIMIT_MSGQUEUE)[0]
    assert got["queues"] * QUEUE_BYTES <= share(queue_bytes, RLIMIT_SHARE), got
    assert got["key"] == "ENOSYS", got
    assert "user_counts" in outcome.enforcement, outcome.enforcement


_NON_ROOT = """
import json, sys, trio
from evolane.sandbox import SandboxSpec, open_sandbox
async def main(root):
    async with open_sandbox(root) as host:
        spec = SandboxSpec(argv=("true",), isolation="confined")
        outcome = await host.run(spec, timeout=60)
        served = host.spawner is not None and not host.spawner.broken
    said = {"served": served, "status": outcome.status, "error": outcome.error}
    print(json.dumps({**said, "mechanisms": outcome.enforcement}))
trio.run(main, sys.argv[1])
"""


def test_a_non_root_evolanes_confined_command_starts_beside_its_spawn_server() -> None:
    # Found by review: the spawn server's clone is a copy of a non-dumpable process, whose
    # /proc/self is root's, so a non-root clone could not map the user namespace it made
    # for the command's counts: every confined command failed to start ("[Errno 13] cannot
    # write /proc/self/setgroups"), and a non-root evolane's run stopped at its first
    # replay. Such a command starts through the launcher chain's unshare step instead.
    needs_root_and_setpriv()
    uid = free_uid()
    with owned_folder(uid) as home:
        done = as_user(uid, [sys.executable, "-c", _NON_ROOT, str(home / "sandbox")], home)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)
    assert said["served"], said  # the server runs (and takes the other commands)
    assert said["status"] == "exited" and not said["error"], said
    assert "user_counts" in said["mechanisms"], said  # its own namespace, made by unshare


_NAMESPACES_RUN_OUT = """
import json, os, sys, trio
from evolane.sandbox import SandboxSpec, open_sandbox
async def main(home):
    said = {}
    async with open_sandbox(os.path.join(home, "sandbox")) as host:
        for name, argv in (("fine", ("true",)), ("own", ("sh", "-c", "exit 1"))):
            done = await host.run(SandboxSpec(argv=argv, isolation="confined"), timeout=60)
            said[name] = [done.status, done.exit_code]
        with open(os.path.join(home, ".ready"), "w") as ready:
            ready.write(str(os.getpid()))
        os.rename(os.path.join(home, ".ready"), os.path.join(home, "ready"))
        while not os.path.exists(os.path.join(home, "go")):  # its namespaces set to none
            await trio.sleep(0.05)
        done = await host.run(SandboxSpec(argv=("true",), isolation="confined"), timeout=60)
        said["refused"] = [done.status, done.exit_code, done.error]
    print(json.dumps(said))
trio.run(main, sys.argv[1])
"""
_NO_MORE_NAMESPACES = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
own = os.open(f"/proc/{sys.argv[1]}/ns/user", os.O_RDONLY)
if libc.setns(own, 0x10000000) != 0:  # CLONE_NEWUSER: root's, with every capability there
    raise OSError(ctypes.get_errno(), "setns")
with open("/proc/sys/user/max_user_namespaces", "w") as limit:
    limit.write("0")
"""


def _close_namespaces(home: Path) -> None:
    """Once evolane in ``home`` is ready, let its user namespace make no more inside it."""
    ready, waited = home / "ready", 0
    while not ready.exists() and waited < 2400:  # a guard against a hang, not a timing figure
        time.sleep(0.05)
        waited += 1
    if ready.exists():
        pid = ready.read_text()
        subprocess.run([sys.executable, "-c", _NO_MORE_NAMESPACES, pid], check=True)
    (home / "go").touch()


def test_a_launcher_that_cannot_make_the_commands_user_namespace_is_a_spawn_failure() -> None:
    # Found by review: a non-root evolane's confined command starts through `unshare
    # --user`, which exits 1 when the kernel refuses the namespace (ENOSPC at
    # max_user_namespaces, ENOMEM), as a command may: a replay was scored as the
    # candidate's failure. Evolane runs here in a user namespace of the test's own, whose
    # max_user_namespaces the test sets to 0 once evolane has started two commands.
    needs_root_and_setpriv()
    uid = free_uid()
    with owned_folder(uid) as home:
        closer = threading.Thread(target=_close_namespaces, args=(home,), daemon=True)
        closer.start()
        argv = ["unshare", "--map-current-user", "--", sys.executable, "-c", _NAMESPACES_RUN_OUT]
        done = as_user(uid, [*argv, str(home)], home)
        closer.join()
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)
    assert said["fine"] == ["exited", 0] and said["own"] == ["exited", 1], said
    status, code, error = said["refused"]
    assert (status, code) == ("spawn_failed", None), said  # old code: exited, 1
    assert "No space left on device" in error, said
