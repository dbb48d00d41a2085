"""Issue 17, item 2: evolane's own environment is out of its commands' reach.

A replay run by ``evolane optimize --isolation process`` walks up its ancestors and reads each
one's ``/proc/<pid>/environ``, ``maps`` and the top of its stack through ``mem``; evolane holds
``EVOLANE_TEST_SECRET`` (not passed with ``--pass-env``). The secret must be nowhere: not in
the replay's output, stdout or stderr, not anywhere in the store (blobs, journal, events,
report), not in what evolane printed. Evolane is non-dumpable; as root (CI) its commands
also lose CAP_SYS_PTRACE and friends, without which root could read it anyway.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.campaign_helpers import toy_flags, write_toy

SECRET = "evolane-test-secret-3f9c1d7a2b"

ATTACK = textwrap.dedent(
    """
    import os, re, sys

    def read(path, limit=1 << 20):
        try:
            with open(path, "rb") as handle:
                return handle.read(limit)
        except OSError as error:
            return f"<{type(error).__name__}>".encode()

    def stack_of(pid):
        maps = read(f"/proc/{pid}/maps").decode("latin-1")
        match = re.search(r"^([0-9a-f]+)-([0-9a-f]+) .*\\[stack\\]$", maps, re.M)
        if not match:
            return b"<no stack>"
        start, end = (int(part, 16) for part in match.groups())
        try:
            with open(f"/proc/{pid}/mem", "rb") as mem:
                mem.seek(max(start, end - (256 << 10)))
                return mem.read(end - max(start, end - (256 << 10)))
        except OSError as error:
            return f"<{type(error).__name__}>".encode()

    loot, pid = [], int(sys.argv[2]) if len(sys.argv) > 2 else os.getppid()
    while pid > 1:
        status = read(f"/proc/{pid}/status").decode("latin-1")
        name = re.search(r"^Name:\\s*(.*)$", status, re.M)
        loot.append(f"== pid {pid} {name.group(1) if name else '?'}".encode())
        loot += [read(f"/proc/{pid}/environ"), stack_of(pid)]
        parent = re.search(r"^PPid:\\s*(\\d+)$", status, re.M)
        pid = int(parent.group(1)) if parent else 0
    data = b"\\n".join(loot)
    out = sys.argv[1]
    if out != "-":
        open(os.path.join(out, "loot.bin"), "wb").write(data)
    keys = re.findall(rb"[A-Z_]*(?:SECRET|KEY|TOKEN)[A-Z_]*=[^\\0\\n]*", data)
    sys.stdout.buffer.write(b"\\n".join([f"{len(loot)} reads".encode(), *sorted(set(keys))]))
    """
)


def _attack_script(root: Path) -> Path:
    script = root / "attack.py"
    script.write_text(ATTACK)
    return script


def test_the_attack_reads_the_environment_of_a_process_that_does_not_hide_it(
    tmp_path: Path,
) -> None:
    """The control: the same attack finds the secret in an ordinary (dumpable) process of
    the same uid, so the test below fails if evolane stops hiding."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "EVOLANE_TEST_SECRET": SECRET},
    )
    try:
        script = _attack_script(tmp_path)
        done = subprocess.run(
            [sys.executable, "-I", str(script), "-", str(holder.pid)],
            capture_output=True,
            timeout=60,
            check=True,
        )
    finally:
        holder.kill()
        holder.wait()
    assert SECRET.encode() in done.stdout


@pytest.mark.parametrize("isolation", ["process", "auto"])
def test_a_replay_cannot_read_evolanes_environment(tmp_path: Path, isolation: str) -> None:
    paths = write_toy(tmp_path, {"default": "fix:2"})
    store = tmp_path / "store"
    script = _attack_script(tmp_path)
    replay = tmp_path / "replay.sh"
    replay.write_text(
        f'{sys.executable} -I {script} "$2" > /dev/null 2>&1\n'
        f"{sys.executable} -I {script} - >&2\n"
        'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'
    )
    flags = toy_flags(paths, store)
    flags[flags.index("--replay") + 1] = f"sh {replay} {{candidate}} {{output_dir}}"
    flags[flags.index("--iterations") + 1] = "1"
    flags += ["--isolation", isolation]
    assert "EVOLANE_TEST_SECRET" not in os.environ  # only evolane's environment holds it
    done = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *flags],
        capture_output=True,
        timeout=300,
        env={**os.environ, "EVOLANE_TEST_SECRET": SECRET},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert SECRET.encode() not in done.stdout + done.stderr
    loot = [p for p in (store / "objects").rglob("*") if p.is_file()]
    # The attack ran and its loot was stored (so its absence below means something).
    assert any(b"== pid" in p.read_bytes() for p in loot)
    for path in store.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


PROBE_ORPHANS = textwrap.dedent(
    """
    import psutil, shutil, time
    from pathlib import Path
    from evolane.sandbox._confine import View, bwrap_argv
    from evolane.sandbox._secrets import probe_succeeds
    from evolane.sandbox._tree import become_subreaper

    assert become_subreaper()
    probes = [["sh", "-c", "sleep 0.2 & exit 0"], ["sh", "-c", "sleep 0.2 & exit 3"]]
    probes.append(["sh", "-c", "sleep 600 & exit 0"])  # outlives the polls: killed, reaped
    if shutil.which("bwrap"):  # bubblewrap's inner process is orphaned to a subreaper
        probes.append([*bwrap_argv(View(), own=(), workspace=Path("/")), "/bin/true"])
    print([probe_succeeds(argv) for argv in probes])
    time.sleep(0.5)  # any orphan would have exited by now and be a zombie of ours
    print(sorted((c.name(), c.status()) for c in psutil.Process().children()))
    """
)


def test_a_probe_leaves_no_zombie_in_a_subreaper() -> None:
    """A long-lived embedding process probes once per process; each probe's orphans (a
    background child, bubblewrap's inner process) must be reaped, not left as zombies."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE_ORPHANS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    verdicts, children = done.stdout.splitlines()
    assert verdicts.startswith("[True, False, True")  # the exit code still decides
    assert children == "[]", children
