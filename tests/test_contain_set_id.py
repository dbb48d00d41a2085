"""Found by review: a root evolane's bwrap maps a confined command's uid onto root, so the
command's files are root's on the host, and ``chmod 4755`` on a copy of an interpreter gave
every local user a set-uid-root program (in an ``--expose-rw`` folder, for good). A seccomp
filter now refuses every way to set S_ISUID or S_ISGID: checked here by running the program
through a classic-BPF interpreter (every call, both architectures, other ABIs), and by
confined commands through the spawn server and through the launcher chain. And the host's
secret files under /etc (shadow, sudoers, private keys), which such a command read, are
covered."""

from __future__ import annotations

import errno
import os
import stat
import struct
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from evolane.sandbox import SandboxSpec, View, _start, open_sandbox
from evolane.sandbox._confine import confinement_problem
from evolane.sandbox._seccomp import _AARCH64, _ARCHES, _X86_64, build_filter, no_set_id_filter
from evolane.store import BlobStore

ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x50000 | errno.EPERM, 0x50000 | errno.ENOSYS


def run_filter(program: bytes, arch: int, number: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel would do: classic BPF over ``struct seccomp_data``."""
    padded = (*args, 0, 0, 0, 0, 0, 0)[:6]
    data = struct.pack("=iIQ6Q", number, arch, 0, *padded)
    code = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, true, false, k = code[pc]
        if op == 0x20:  # load a word
            acc = struct.unpack_from("=I", data, k)[0]
        elif op == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += true if taken else false
        pc += 1


@pytest.mark.parametrize("name", ["x86_64", "aarch64"])
def test_the_filter_refuses_exactly_the_set_id_bits(name: str) -> None:
    arch, calls = _ARCHES[name]
    program = build_filter(arch, calls)
    creates = 0o100
    for call, (number, mode, flags) in calls.items():
        args = [0] * 6
        if flags is not None:
            args[flags] = os.O_WRONLY | creates
        for bits, expected in ((0o755, ALLOW), (0o4755, EPERM), (0o2755, EPERM), (0o1777, ALLOW)):
            args[mode] = bits | (0xDEAD << 32)  # the high half is not the mode
            assert run_filter(program, arch, number, tuple(args)) == expected, (call, oct(bits))
        if flags is not None:  # a mode with no O_CREAT is garbage, not a request
            args[flags], args[mode] = os.O_RDONLY, 0o4755
            assert run_filter(program, arch, number, tuple(args)) == ALLOW, call
            args[flags] = 0o20200000  # O_TMPFILE
            assert run_filter(program, arch, number, tuple(args)) == EPERM, call
    for refused in (437, 425):  # openat2, io_uring_setup
        assert run_filter(program, arch, refused) == ENOSYS
    assert run_filter(program, arch, 0) == ALLOW  # read, io_setup: anything else
    assert run_filter(program, arch, 39) == ALLOW
    assert run_filter(program, 0x40000003, 15, (0, 0o4755)) == ENOSYS  # i386's chmod
    if name == "x86_64":
        assert run_filter(program, arch, 0x40000000 | 90, (0, 0o4755)) == ENOSYS  # x32


def test_each_architecture_lists_every_call_that_sets_a_mode() -> None:
    assert set(_X86_64) == {
        "chmod", "fchmod", "fchmodat", "fchmodat2", "creat", "mknod", "mknodat", "open",
        "openat",
    }  # fmt: skip
    assert set(_AARCH64) == {"fchmod", "fchmodat", "fchmodat2", "mknodat", "openat"}


ATTEMPTS = textwrap.dedent(
    """
    import os, shutil, sys
    out = sys.argv[1]
    tries = {
        "chmod 4755": lambda: (shutil.copy(sys.executable, "py"), os.chmod("py", 0o4755)),
        "chmod 2755": lambda: os.chmod("py", 0o2755),
        "into the shown folder": lambda: (
            shutil.copy(sys.executable, out + "/py"), os.chmod(out + "/py", 0o4755)),
        "open 4755": lambda: os.close(os.open("made", os.O_CREAT | os.O_WRONLY, 0o4755)),
        "mkdir 2755": lambda: os.mkdir("shared", 0o2755),
        "plain chmod": lambda: os.chmod("py", 0o700),
    }
    for name, attempt in tries.items():
        try:
            attempt()
            print(name, "allowed")
        except OSError as error:
            print(name, "refused", error.errno)
    print("set-id bits of the folder", oct(os.stat("shared").st_mode & 0o6000))
    """
)


@pytest.mark.parametrize(
    ("spawner", "setuid_bwrap"),
    [(True, False), (False, False), (True, True)],
    ids=["spawn server", "launcher chain", "set-uid bwrap: the chain"],
)
async def test_a_confined_command_makes_no_set_id_file(
    tmp_path: Path, spawner: bool, setuid_bwrap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (A non-root evolane's set-uid bwrap: the clone may not take the filter, whose
    # no_new_privs would strip bwrap's privileges; the launcher chain hands it to bwrap.)
    monkeypatch.setattr(_start, "bwrap_wants_privileges", lambda: setuid_bwrap)
    if confinement_problem() is not None:
        pytest.skip(f"no confinement here: {confinement_problem()}")
    if no_set_id_filter() is None:
        pytest.skip("no seccomp filter for this architecture")
    shown = tmp_path / "shown"  # an --expose-rw folder: what lands there outlives the run
    shown.mkdir()
    store = BlobStore(tmp_path / "store")
    async with open_sandbox(tmp_path / "sandbox", store=store, use_spawner=spawner) as host:
        spec = SandboxSpec(
            argv=(sys.executable, "-I", "-c", ATTEMPTS, str(shown)),
            isolation="confined",
            view=View(read_write=(str(shown),)),
            keep_failed=False,
        )
        with trio.fail_after(60):
            outcome = await host.run(spec, timeout=50)
        lines = outcome.stdout.text().splitlines()
        assert outcome.ok and "no_set_id" in outcome.enforcement, (outcome, lines)
        made = list(shown.iterdir())
    assert lines == [
        "chmod 4755 refused 1",
        "chmod 2755 refused 1",
        "into the shown folder refused 1",
        "open 4755 refused 1",
        "mkdir 2755 allowed",  # mkdir drops both bits: let be
        "plain chmod allowed",
        "set-id bits of the folder 0o0",
    ], lines
    for path in made:  # the copy is there, and no set-id bit on it
        assert not os.lstat(path).st_mode & (stat.S_ISUID | stat.S_ISGID), path


async def test_a_confined_command_reads_none_of_the_hosts_secrets_under_etc(
    tmp_path: Path,
) -> None:
    # Found by the same review: with /etc shown, a root evolane's confined command read
    # /etc/shadow (its uid is root's on the host). The secret files are covered now; the
    # rest of /etc still reads.
    if confinement_problem() is not None:
        pytest.skip(f"no confinement here: {confinement_problem()}")
    from evolane.sandbox._confine import host_secrets

    secrets = host_secrets()
    if "/etc/shadow" not in secrets:
        pytest.skip("this host has no /etc/shadow")
    probe = (
        "import sys\nfor p in sys.argv[1:]:\n    try:\n        print(p, len(open(p, 'rb').read()))"
        "\n    except OSError as error:\n        print(p, 'refused', error.errno)"
    )
    async with open_sandbox(tmp_path / "sandbox", store=BlobStore(tmp_path / "store")) as host:
        argv = (sys.executable, "-I", "-c", probe, "/etc/shadow", "/etc/passwd")
        outcome = await host.run(SandboxSpec(argv=argv, isolation="confined"), timeout=50)
    assert outcome.ok, outcome.stderr.text()
    read = dict(line.split(" ", 1) for line in outcome.stdout.text().splitlines())
    assert read["/etc/shadow"] in ("0", "refused 13") and int(read["/etc/passwd"]) > 0, read
    assert os.path.getsize("/etc/shadow") > 0  # it was there to read


def test_every_file_under_etc_others_may_not_read_is_covered() -> None:
    # Found by review: /etc/default/cacerts (0600, root) stayed readable after the list.
    import stat as stats

    from evolane.sandbox._confine import HOST_SECRETS, host_secrets

    covered = set(host_secrets())
    for root, _folders, files in os.walk("/etc"):
        if any(root == c or root.startswith(c + "/") for c in covered):
            continue
        for name in files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if stats.S_ISREG(info.st_mode) and not info.st_mode & 0o004:
                assert path in covered, path
    assert {p for p in HOST_SECRETS if os.path.lexists(p)} <= covered
