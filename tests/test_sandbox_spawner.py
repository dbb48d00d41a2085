"""The spawn server (issue 22): commands born in their cgroup as evolane's children, the same
outcomes as through the launcher chain, and a fallback to that chain when the server breaks."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import socket
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import psutil
import pytest
import trio

from evolane.sandbox import (
    Limits,
    SandboxHost,
    SandboxSpec,
    _spawnd,
    _spawner,
    _start,
    lease_holders,
    open_sandbox,
)
from tests.sandbox_helpers import altered_server, in_a_thread, run_sh, zombies

ROOT = os.geteuid() == 0


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[SandboxHost]:
    async with open_sandbox(tmp_path / "sandbox") as opened:
        yield opened


@pytest.fixture
async def launcher_host(tmp_path: Path) -> AsyncIterator[SandboxHost]:
    async with open_sandbox(tmp_path / "launched", use_spawner=False) as opened:
        yield opened


def _spawns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which way each command of this test started: "server" or "launcher"."""
    ways: list[str] = []
    real_server, real_launcher = _spawner.Spawner.spawn, _start.launch
    real_from_trio = _spawner.Spawner.spawn_from_trio

    def server(*args: object, **kwargs: object) -> int:
        pid = real_server(*args, **kwargs)  # type: ignore[arg-type]
        ways.append("server")
        return pid

    async def server_from_trio(*args: object, **kwargs: object) -> int | None:
        pid = await real_from_trio(*args, **kwargs)  # type: ignore[arg-type]
        if pid is not None:
            ways.append("server")
        return pid

    def launcher(*args: object, **kwargs: object) -> int:
        ways.append("launcher")
        return real_launcher(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_spawner.Spawner, "spawn", server)
    monkeypatch.setattr(_spawner.Spawner, "spawn_from_trio", server_from_trio)
    monkeypatch.setattr(_start, "launch", launcher)
    return ways


async def test_a_command_is_born_a_child_of_evolane_in_its_cgroup(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host.spawner is not None, "this Linux host must spawn through the server"
    ways = _spawns(monkeypatch)
    # The command's first act reads its parent and cgroup: nothing ran before it joined.
    outcome = await run_sh(host, "echo $PPID; cat /proc/self/cgroup")
    assert outcome.ok, outcome
    text = outcome.stdout.text()
    assert text.splitlines()[0] == str(os.getpid())  # CLONE_PARENT: ours to wait and reap
    if host.cgroups.unified is not None:
        unified = next(line for line in text.splitlines() if line.startswith("0::"))
        assert f"/{host.cgroups.unified.name}/" in unified, text
    assert ways == ["server"]


async def test_the_server_and_the_launcher_give_the_same_outcomes(
    host: SandboxHost, launcher_host: SandboxHost, tmp_path: Path
) -> None:
    garbage = tmp_path / "sandbox" / "not-a-program"
    garbage.write_bytes(b"\x7fELF\x00\x01garbage")
    garbage.chmod(0o755)
    cases: list[tuple[tuple[str, ...], dict[str, object]]] = [
        (("sh", "-c", "echo out; echo err >&2; exit 7"), {}),
        (("sh", "-c", "kill -TERM $$"), {}),
        (("sh", "-c", "ulimit -c; ulimit -n"), {"limits": Limits(open_files=64)}),
        # SIGXFSZ must be back at its default in the command (Python ignores it)
        (("sh", "-c", "head -c 100000 /dev/zero > big"), {"limits": Limits(file_size_bytes=4096)}),
        (("sh", "-c", "for i in 1 2 3 4 5 6; do sleep 1 & done; wait"),
         {"limits": Limits(processes=3)}),
        (("sh", "-c", "yes | head -c 3000000 | wc -c"), {}),
    ]  # fmt: skip
    for argv, fields in cases:
        served, launched = [
            await way.run(SandboxSpec(argv=argv, kill_grace=0.2, **fields), timeout=30)  # type: ignore[arg-type]
            for way in (host, launcher_host)
        ]
        for name in ("status", "exit_code", "signal", "limits_hit", "enforcement"):
            assert getattr(served, name) == getattr(launched, name), (argv, name, served, launched)
        assert served.stdout.text() == launched.stdout.text(), argv
    # A script without "#!" runs under sh both ways, as execvp runs it; so does a binary
    # the kernel cannot exec (and fails there).
    script = tmp_path / "sandbox" / "no-shebang"
    script.write_text("echo via-sh $1\n")
    script.chmod(0o755)
    served, launched = [
        await way.run(SandboxSpec(argv=(str(script), "arg")), timeout=30)
        for way in (host, launcher_host)
    ]
    assert served.ok and launched.ok, (served, launched)
    assert served.stdout.text() == launched.stdout.text() == "via-sh arg\n"
    served, launched = [
        await way.run(SandboxSpec(argv=(str(garbage),)), timeout=30)
        for way in (host, launcher_host)
    ]
    assert served.status == launched.status == "exited" and not served.ok and not launched.ok
    # An interpreter that is not there: a spawn failure through the server, as a bare
    # Popen's (the launcher's shell makes it its own exit code 127); the clone is reaped.
    missing = tmp_path / "sandbox" / "missing-interpreter"
    missing.write_text("#!/nonexistent/interpreter\n")
    missing.chmod(0o755)
    zombies_before = zombies()
    served, launched = [
        await way.run(SandboxSpec(argv=(str(missing),)), timeout=30)
        for way in (host, launcher_host)
    ]
    assert served.status == "spawn_failed" and "No such file" in (served.error or ""), served
    assert launched.exit_code == 127
    assert zombies() <= zombies_before
    assert lease_holders(host.lease) == set()


@pytest.mark.skipif(not ROOT, reason="capabilities are dropped for root's commands only")
async def test_a_root_command_loses_the_dangerous_capabilities(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host.spawner is not None and host.spawner.dropped
    ways = _spawns(monkeypatch)
    outcome = await run_sh(host, "grep CapBnd /proc/self/status")
    assert ways == ["server"]  # dropped by the clone, not by a setpriv step
    bounding = int(outcome.stdout.text().split()[-1], 16)
    for number in (2, 16, 17, 19, 21):  # dac_read_search, module, rawio, ptrace, admin
        assert not bounding & (1 << number), (number, hex(bounding))
    assert "root_caps_dropped" in outcome.enforcement


async def test_a_command_cannot_read_the_servers_memory_or_environment(
    host: SandboxHost,
) -> None:
    assert host.spawner is not None
    server = host.spawner.pid
    # As a user, the server's non-dumpable flag denies it; as root, the command's dropped
    # CAP_SYS_PTRACE does (its capabilities are no longer a superset of the server's), so
    # run as root this checks the capability drop, and only a user's run the flag.
    outcome = await run_sh(host, f"cat /proc/{server}/environ")
    assert outcome.exit_code != 0 and "denied" in outcome.stderr.text(), outcome


async def test_a_killed_server_leaves_the_launcher_chain(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host.spawner is not None
    ways = _spawns(monkeypatch)
    # A command that kills the server (root's commands may signal anything) ...
    killer = await run_sh(host, f"kill -KILL {host.spawner.pid}")
    assert killer.ok, killer
    # ... leaves every later command to the launcher chain, with the same guarantees.
    for _ in range(3):
        outcome = await run_sh(host, "echo $$")
        assert outcome.ok, outcome
    assert host.spawner.broken
    assert ways == ["server", "launcher", "launcher", "launcher"]
    assert lease_holders(host.lease) == set()


async def test_a_stopped_server_hands_its_spawn_to_the_launcher(tmp_path: Path) -> None:
    async with open_sandbox(tmp_path / "sandbox") as host:
        assert host.spawner is not None
        host.spawner.reply_timeout = 0.5
        os.kill(host.spawner.pid, signal.SIGSTOP)  # as a command of the same uid may
        with trio.fail_after(30):
            stalled = await run_sh(host, f"echo ran >> {tmp_path}/ran.txt")
        # The server never cloned it (killed while stopped; EOF came with no pid on the
        # error pipe), so the launcher ran it: once.
        assert stalled.ok, stalled
        assert (tmp_path / "ran.txt").read_text() == "ran\n"
        assert host.spawner.broken
        after = await run_sh(host, "echo fine")
        assert after.ok and after.stdout.text() == "fine\n"
        assert lease_holders(host.lease) == set()


async def test_a_request_too_large_for_the_server_goes_through_the_launcher(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host.spawner is not None
    ways = _spawns(monkeypatch)
    # Distinct arguments (marshal would share equal ones) past what the socket sends.
    count = host.spawner.largest_request // 60_000 + 1
    large = [str(n % 10) * 59_999 + str(n) for n in range(count)]
    outcome = await host.run(SandboxSpec(argv=("sh", "-c", "echo $#", "x", *large)), timeout=30)
    assert outcome.ok and outcome.stdout.text() == f"{count}\n", outcome
    small = await run_sh(host, "echo small")
    assert small.ok and small.stdout.text() == "small\n"
    assert ways == ["launcher", "server"]  # only the large one went round; the server stays
    assert not host.spawner.broken


async def test_the_server_leaves_with_its_host(tmp_path: Path) -> None:
    async with open_sandbox(tmp_path / "sandbox") as host:
        assert host.spawner is not None
        server = psutil.Process(host.spawner.pid)
        await run_sh(host, "true")
    assert not server.is_running()  # exited and reaped (psutil tells a reused pid apart)


async def test_a_command_holds_no_descriptor_but_its_three(host: SandboxHost) -> None:
    # An inherited error pipe would keep the spawn waiting until the command ends, and any
    # other descriptor of the server's would leak into the command.
    outcome = await run_sh(host, "ls /proc/$$/fd")
    assert sorted(outcome.stdout.text().split()) == ["0", "1", "2"], outcome.stdout.text()


async def test_a_command_flooding_both_streams_at_once_is_drained(host: SandboxHost) -> None:
    script = "head -c 4000000 /dev/zero & head -c 4000000 /dev/zero >&2; wait"
    with trio.fail_after(60):
        outcome = await run_sh(host, script)
    assert outcome.ok and outcome.stdout.total_bytes == 4_000_000


async def test_a_command_starts_with_no_signal_blocked_or_ignored(host: SandboxHost) -> None:
    # Python ignores SIGPIPE and SIGXFSZ, and an exec keeps ignored and blocked signals:
    # the server must hand its commands the defaults (a file-size limit kills by SIGXFSZ).
    outcome = await host.run(SandboxSpec(argv=("cat", "/proc/self/status")), timeout=30)
    fields = dict(line.split(":\t", 1) for line in outcome.stdout.text().splitlines())
    assert int(fields["SigBlk"], 16) == 0 and int(fields["SigIgn"], 16) == 0, fields


@pytest.mark.parametrize("number", [38, 7, 22])  # ENOSYS, E2BIG (5.3-5.4), EINVAL (5.5-5.6)
async def test_a_kernel_without_clone_into_cgroup_leaves_the_launcher_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, number: int
) -> None:
    after = "    flags = CLONE_PARENT | (CLONE_INTO_CGROUP if cgroup_fd is not None else 0)\n"
    refuse = f'    if cgroup_fd is not None:\n        raise CloneRefused({number}, "clone3: old")\n'
    monkeypatch.setattr(_spawnd, "__file__", altered_server(tmp_path, after, refuse))
    # Probed into a cgroup, as a host with a cgroup v2 does: the probe finds it out.
    async with open_sandbox(tmp_path / "sandbox") as host:
        if host.cgroups.unified is not None:
            assert host.spawner is None
        outcome = await run_sh(host, "echo ran")
        assert outcome.ok and outcome.stdout.text() == "ran\n"
    # Probed without one: the first spawn into a cgroup finds it out, and runs anyway.
    spawner = _spawner.Spawner.start()
    assert spawner is not None
    with pytest.raises(_spawner.SpawnerUnavailable):  # any directory opens; clone3 refuses
        spawner.spawn("/bin/true", ["true"], {}, "/", (1, 2), [], [], (), str(tmp_path))
    assert spawner.broken
    spawner.close()


async def test_a_clone_whose_reply_is_lost_is_killed_and_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    after = "        pid = _clone(libc, cgroup_fd)\n"
    stall = "        pid and __import__('time').sleep(3)\n"  # the server, not its clone
    monkeypatch.setattr(_spawnd, "__file__", altered_server(tmp_path, after, stall))
    spawner = _spawner.Spawner.start()  # its probe waits out the stall
    assert spawner is not None
    spawner.reply_timeout = 1.0
    reaped: list[tuple[int, int]] = []
    real_waitpid = os.waitpid

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        reaped.append(real_waitpid(pid, options))
        return reaped[-1]

    monkeypatch.setattr(os, "waitpid", waitpid)  # a spy: evolane's own reaps, recorded
    sleep = shutil.which("sleep")
    assert sleep is not None
    with pytest.raises(OSError, match="timed out"):
        spawner.spawn(sleep, ["sleep", "60"], {}, "/", (1, 2), [], [], (), None)
    assert spawner.broken
    # The clone exec'd meanwhile; evolane, its parent, learnt its pid from the error pipe,
    # killed it and reaped it.
    [(pid, status)] = [(pid, status) for pid, status in reaped if pid]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert pid not in {p.pid for p in psutil.Process().children()}
    spawner.close()


@pytest.mark.parametrize("way", ["thread", "loop"])
def test_a_failed_clone_that_is_stopped_before_its_exit_is_killed_and_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    # A failed clone may be stopped (SIGSTOP from a process of the same uid) before it exits:
    # the spawn must still end, not wait on it without end, in a worker thread (`spawn`) or
    # awaited on a trio loop (`spawn_from_trio`).
    after = '        os.write(failed, f"{number}:{text}".encode(errors="replace")[:2048])\n'
    stop = "        os.kill(os.getpid(), 19)\n"
    monkeypatch.setattr(_spawnd, "__file__", altered_server(tmp_path, after, stop))
    before = {p.pid for p in psutil.Process().children()}
    spawner = _spawner.Spawner.start()  # its probe's clone does not fail, so never stops
    assert spawner is not None
    spawner.reply_timeout = 1.0
    gone = str(tmp_path / "gone")  # no such cwd: the clone fails, then stops itself
    args = ("/bin/true", ["true"], {}, gone, (1, 2), [], [], (), None)

    def spawn() -> int | None:
        if way == "thread":
            return spawner.spawn(*args)  # type: ignore[arg-type]
        return trio.run(partial(spawner.spawn_from_trio, *args))  # type: ignore[arg-type]

    try:
        hanging, ended = in_a_thread(spawn, 15)  # the pipe's timeout and the reap's: 2 s
        broken = spawner.broken
    finally:
        for process in psutil.Process().children():  # a hanging spawn's stopped clone
            if process.pid not in before and process.pid != spawner.pid:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        spawner.close()
    assert not hanging, "the spawn waited on its stopped clone"
    assert len(ended) == 1 and isinstance(ended[0], FileNotFoundError), ended
    assert not broken
    assert {p.pid for p in psutil.Process().children()} <= before  # the clone was reaped


async def test_signals_ignored_by_evolane_are_not_passed_on(tmp_path: Path) -> None:
    # As under `nohup` or `trap '' TERM`: the kill ladder's SIGTERM must reach commands.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        async with open_sandbox(tmp_path / "sandbox") as host:
            spec = SandboxSpec(argv=("cat", "/proc/self/status"))
            outcome = await host.run(spec, timeout=30)
    finally:
        signal.signal(signal.SIGTERM, previous)
    fields = dict(line.split(":\t", 1) for line in outcome.stdout.text().splitlines())
    assert int(fields["SigIgn"], 16) == 0, fields["SigIgn"]


async def test_a_request_the_socket_refuses_goes_through_the_launcher(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host.spawner is not None
    ways = _spawns(monkeypatch)
    # What the send buffer refuses (EMSGSIZE) is this request's fault, not the server's.
    host.spawner.largest_request = 1 << 30
    host.spawner._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    text = "".join(str(n) for n in range(6000))
    outcome = await run_sh(host, f"echo {text} | wc -c")
    assert outcome.ok and int(outcome.stdout.text()) == len(text) + 1
    assert ways == ["launcher"] and not host.spawner.broken


def test_a_server_started_from_a_thread_with_signals_blocked_unblocks_them() -> None:
    # Popen hands the starting thread's signal mask to the server; an exec keeps it.
    def start() -> _spawner.Spawner | None:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGTERM])
        return _spawner.Spawner.start()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        spawner = pool.submit(start).result()
    assert spawner is not None
    read_fd, write_fd = os.pipe()
    cat = shutil.which("cat")
    assert cat is not None
    pid = spawner.spawn(cat, ["cat", "/proc/self/status"], {}, "/", (write_fd, write_fd),
                        [], [], (), None)  # fmt: skip
    os.close(write_fd)
    with os.fdopen(read_fd) as output:
        fields = dict(line.split(":\t", 1) for line in output.read().splitlines())
    os.waitpid(pid, 0)
    assert int(fields["SigBlk"], 16) == 0, fields["SigBlk"]
    spawner.close()


def test_closing_a_spawner_twice_closes_nothing_of_anyone_else() -> None:
    spawner = _spawner.Spawner.start()
    assert spawner is not None
    spawner.close()
    others = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]  # may reuse its numbers
    try:
        spawner.close()
        for fd in others:
            os.fstat(fd)  # still open
    finally:
        for fd in others:
            os.close(fd)
