"""The launcher step that gives a networked confined command a network namespace of its own.

Run by path as ``python -I -S _netstep.py SLIRP4NETNS IP -- ARGV...`` (no evolane import):
it forks slirp4netns, which stays in the host's network namespace, unshares a new network
namespace for itself, waits until slirp4netns has wired ``tap0`` into it (outbound NAT, the
host's loopback not mapped: ``--disable-host-loopback``), closes `CLOSED_NETS` (the cloud
VMs' metadata endpoints) with ``prohibit`` routes, and execs ARGV in it (same pid). The
host's loopback services and abstract unix sockets belong to the host's namespace: the
command reaches neither. slirp4netns ends when the last holder of the command's end of a
pipe (the command and what it left running) is gone (``--exit-fd``).
"""

import ctypes
import os
import sys

CLONE_NEWNET = 0x40000000
CLOSED_NETS = ("169.254.0.0/16", "100.100.100.200/32", "168.63.129.16/32")
"""Link-local (AWS, GCP, Azure, Oracle metadata at 169.254.169.254), Alibaba Cloud's
metadata endpoint and Azure's WireServer: found by review, the last two were reachable."""


NONCE = os.environ.pop("EVOLANE_NET_NONCE", "")
"""The unit's nonce (`evolane.sandbox._launch.step_failed_marker`): out of the environment
before anything is forked or exec'd, so the command never sees it."""


def _fail(why: str) -> None:
    """Say why the command cannot have its network, in the line the sandbox reads as a
    spawn failure (infrastructure, never the command's), and exit 125."""
    sys.stderr.write(f"evolane-net-{NONCE}: {why}\n")
    sys.stderr.flush()
    os._exit(125)


def _slirp(slirp: str, target: int, go: int, ready: int, life: int) -> None:
    """The child: once ``target`` is in its own namespace (a byte on ``go``), exec
    slirp4netns for it, quiet."""
    if os.read(go, 1) != b"1":
        os._exit(0)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    os.set_inheritable(ready, True)
    os.set_inheritable(life, True)
    flags = ["--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox"]
    flags += ["--enable-seccomp", f"--ready-fd={ready}", f"--exit-fd={life}"]
    os.execv(slirp, [slirp, *flags, str(target), "tap0"])


def main(argv: list[str]) -> None:
    """Run ``argv`` (after ``SLIRP IP --``) in a network namespace slirp4netns wires."""
    slirp, ip, rest = argv[0], argv[1], argv[3:]
    target = os.getpid()
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    life_r, life_w = os.pipe()
    if os.fork() == 0:
        for fd in (go_w, ready_r, life_w):
            os.close(fd)
        _slirp(slirp, target, go_r, ready_w, life_r)
    for fd in (go_r, ready_w, life_r):
        os.close(fd)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        _fail(f"cannot unshare the network namespace: {os.strerror(ctypes.get_errno())}")
    os.write(go_w, b"1")
    os.close(go_w)
    if os.read(ready_r, 1) != b"1":
        _fail("slirp4netns did not wire the network namespace")
    os.close(ready_r)
    for net in CLOSED_NETS:
        route = os.fork()
        if route == 0:
            os.execv(ip, [ip, "route", "add", "prohibit", net])
        if os.waitpid(route, 0)[1] != 0:
            _fail(f"cannot close {net} in the network namespace")
    os.set_inheritable(life_w, True)
    try:
        os.execve(rest[0], rest, os.environ)
    except OSError as error:
        _fail(f"{rest[0]}: {error.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
