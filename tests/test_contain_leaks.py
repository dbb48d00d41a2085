"""Found by review, two ways a command read evolane's secrets: its session keyring (Kerberos
caches and credential helpers keep them there; a process possesses its session keyring
whatever its uid: the spawn server's clone joins a new, empty one before its exec), and,
confined, any folder of evolane's import path (a PYTHONPATH folder, the script's or working
folder are not shown now: only the interpreter's prefixes, installed packages and evolane)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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


def test_a_confined_command_sees_no_folder_of_evolanes_import_path(tmp_path: Path) -> None:
    """Found by review: every ``sys.path`` entry (``PYTHONPATH``, a project added by an
    editable install) was shown to every confined command, with whatever it held."""
    if confinement_problem() is not None:
        pytest.skip(f"no confinement here: {confinement_problem()}")
    projects = tmp_path / "projects"
    projects.mkdir()
    (projects / ".env").write_text("OPENAI_API_KEY=sk-DOTENV-SECRET\n")
    probe = textwrap.dedent(
        f"""
        import pathlib, sys, tempfile, trio
        from evolane.sandbox import SandboxSpec, open_sandbox

        async def main() -> None:
            with tempfile.TemporaryDirectory() as tmp:
                async with open_sandbox(pathlib.Path(tmp)) as host:
                    argv = ("cat", "{projects / ".env"}")
                    outcome = await host.run(SandboxSpec(argv=argv, isolation="confined"))
                    print(outcome.status, outcome.exit_code, outcome.stdout.text().strip())

        trio.run(main)
        """
    )
    env = {**os.environ, "PYTHONPATH": f"{projects}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sk-DOTENV-SECRET" not in done.stdout and done.stdout.split()[:2] == ["exited", "1"]
