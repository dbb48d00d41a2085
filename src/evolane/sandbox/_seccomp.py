"""A seccomp filter for confined commands: no set-user-ID or set-group-ID file, ever.

bwrap maps a confined command's uid (65534 inside) onto the uid that started it: a root
evolane's commands make root's files on the host. A command may chmod its own files, so
``chmod 4755`` on a copy of an interpreter in its unit folder (or in an ``--expose-rw``
folder, where it outlives the run) gave every local user a set-uid-root program (found by
review). The filter refuses, with EPERM, each system call that would set S_ISUID or S_ISGID
on a file (chmod, fchmod, fchmodat, fchmodat2; and open, openat, creat, mknod, mknodat
when they create with those bits; mkdir is let be: it drops both bits, a folder inherits
S_ISGID from its parent alone), and with ENOSYS those whose arguments it
cannot read (openat2, a struct) or that would do such work out of its sight (io_uring), and
every call of another ABI (32-bit or x32 calls on a 64-bit kernel, numbered otherwise).

It also refuses the kernel keyring calls (``add_key``, ``request_key``, ``keyctl``) with
ENOSYS, as Docker's default profile does: keys are counted per host uid, in no namespace,
against a quota (root's: 25 MB; another user's: 20,000 bytes), and a confined replay of a
root evolane filled root's, so no other program of root could add a key of 1 KB while it
ran (found by review).

The program is classic BPF as ``PR_SET_SECCOMP`` and bwrap's ``--seccomp FD`` take it: an
array of ``struct sock_filter`` (u16 code, u8 jt, u8 jf, u32 k). Known architectures:
x86_64 and aarch64; elsewhere None (the README says what that leaves).
"""

from __future__ import annotations

import errno
import os
import struct
from functools import cache

SET_ID_BITS = 0o6000
"""S_ISUID | S_ISGID: the mode bits no confined command may set."""
_CREATES = 0o100 | 0o20000000  # O_CREAT, __O_TMPFILE (the same on both architectures)

_LOAD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_NR, _ARCH = 0, 4
_X32_BIT = 0x40000000

# name: (number, argument holding the mode, argument holding open's flags or None)
_X86_64 = {
    "chmod": (90, 1, None), "fchmod": (91, 1, None), "fchmodat": (268, 2, None),
    "fchmodat2": (452, 2, None), "creat": (85, 1, None), "mknod": (133, 1, None),
    "mknodat": (259, 2, None), "open": (2, 2, 1), "openat": (257, 3, 2),
}  # fmt: skip
_AARCH64 = {
    "fchmod": (52, 1, None), "fchmodat": (53, 2, None), "fchmodat2": (452, 2, None),
    "mknodat": (33, 2, None), "openat": (56, 3, 2),
}  # fmt: skip
_REFUSED = (437, 425)  # openat2, io_uring_setup: the same numbers on both
_KEYRINGS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}  # add_key, request_key, keyctl
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}


def _arg(index: int) -> int:
    """Offset of the low 32 bits of argument ``index`` in ``struct seccomp_data``."""
    return 16 + 8 * index + (4 if struct.pack("=I", 1)[0] == 0 else 0)


class _Program:
    """Instructions with jumps to labels, resolved when packed."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def add(self, code: int, k: int, true: object = 0, false: object = 0) -> None:
        self.code.append((code, true, false, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def packed(self) -> bytes:
        out = []
        for at, (code, true, false, k) in enumerate(self.code):
            jumps = [self.labels[j] - at - 1 if isinstance(j, str) else j for j in (true, false)]
            assert all(0 <= j < 256 for j in jumps), jumps  # type: ignore[operator]
            out.append(struct.pack("=HBBI", code, jumps[0], jumps[1], k))
        return b"".join(out)


def build_filter(
    arch: int, calls: dict[str, tuple[int, int, int | None]], refused: tuple[int, ...] = ()
) -> bytes:
    """The program for one architecture (its audit number, its calls and those it refuses
    with ENOSYS besides `_REFUSED`)."""
    program = _Program()
    program.add(_LOAD, _ARCH)
    program.add(_JEQ, arch, 0, "nosys")
    program.add(_LOAD, _NR)
    program.add(_JGE, _X32_BIT, "nosys", 0)
    for number in (*_REFUSED, *refused):
        program.add(_JEQ, number, "nosys", 0)
    for name, (number, _mode, _flags) in calls.items():
        program.add(_JEQ, number, name, 0)
    program.add(_RET, _ALLOW)
    for name, (_number, mode, flags) in calls.items():
        program.label(name)
        if flags is not None:  # opens set a mode only when they create
            program.add(_LOAD, _arg(flags))
            program.add(_JSET, _CREATES, 0, "allow")
        program.add(_LOAD, _arg(mode))
        program.add(_JSET, SET_ID_BITS, "eperm", "allow")
    program.label("allow")
    program.add(_RET, _ALLOW)
    program.label("eperm")
    program.add(_RET, _ERRNO | errno.EPERM)
    program.label("nosys")
    program.add(_RET, _ERRNO | errno.ENOSYS)
    return program.packed()


@cache
def no_set_id_filter() -> bytes | None:
    """The filter for this machine's architecture (64-bit interpreters only), or None."""
    machine = os.uname().machine
    known = _ARCHES.get(machine)
    if known is None or struct.calcsize("P") != 8:
        return None
    return build_filter(*known, _KEYRINGS[machine])
