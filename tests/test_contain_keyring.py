"""Found by review: a command read secrets from evolane's session keyring (Kerberos caches and
credential helpers keep them there): a process possesses its session keyring whatever its
uid. The spawn server's clone joins a new, empty session keyring before its exec."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from evolane.sandbox._confine import confinement_problem

PROBE = textwrap.dedent(
    """
    import ctypes, pathlib, sys, tempfile, trio
    from evolane.sandbox import SandboxSpec, open_sandbox
    from evolane.sandbox._spawnd import _SYS_KEYCTL

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(_SYS_KEYCTL, 1, b"evolane-test") > 0  # a session keyring of its own
    add_key = {250: 248, 219: 217}[_SYS_KEYCTL]
    assert libc.syscall(add_key, b"user", b"evolane-key", b"sk-SECRET", 9, -3) > 0
    READ = (
        "import ctypes, sys; l = ctypes.CDLL(None, use_errno=True); n = int(sys.argv[1]);"
        "k = l.syscall(n, 10, -3, b'user', b'evolane-key', 0); b = ctypes.create_string_buffer(64);"
        "print(b.raw[:max(l.syscall(n, 11, k, b, 64), 0)] if k > 0 else b'none')"
    )

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with open_sandbox(pathlib.Path(tmp)) as host:
                assert host.spawner is not None, "no spawn server"
                argv = (sys.executable, "-I", "-c", READ, str(_SYS_KEYCTL))
                spec = SandboxSpec(argv=argv, isolation=sys.argv[1])
                outcome = await host.run(spec, timeout=30)
                print(outcome.status, outcome.stdout.text().strip())

    trio.run(main)
    """
)


@pytest.mark.parametrize("isolation", ["process", "confined"])
def test_a_command_cannot_read_evolanes_session_keyring(isolation: str) -> None:
    if isolation == "confined" and confinement_problem() is not None:
        pytest.skip(f"no confinement here: {confinement_problem()}")
    from evolane.sandbox._spawnd import _SYS_KEYCTL

    if _SYS_KEYCTL not in (250, 219):
        pytest.skip("add_key's number is known here for x86_64 and the generic table only")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, isolation], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["exited", "b'none'"], done.stdout  # an empty keyring
