"""A network namespace of its own for each confined command given the network.

Without it (bwrap without ``--unshare-net``) such a command shared the host's network
namespace: the host's loopback services (databases, a local model server, evolane's own
Dask scheduler), its abstract unix sockets (D-Bus, X11) and, on a cloud VM, the metadata
endpoint at 169.254.169.254, as evolane's user. Now a launcher step (`evolane.sandbox.
_netstep`, before bwrap) gives it a namespace of its own whose only way out is slirp4netns'
outbound NAT, with the host's loopback and the cloud metadata endpoints closed. Where slirp4netns is
missing or cannot work, the command shares the host's network as before, with a warning at
run start and in doctor (`own_network_problem`).
"""

from __future__ import annotations

import os
import shutil
import sys
from functools import cache
from pathlib import Path

from evolane.sandbox._confine import bwrap_argv, confinement_problem, user_counts_step
from evolane.sandbox._launch import NET_STEP
from evolane.sandbox._secrets import probe_succeeds
from evolane.sandbox._spec import View

_TOOLS = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin"
SLIRP_RESOLV = str(Path(__file__).with_name("slirp_resolv.conf"))
"""Shown as ``/etc/resolv.conf`` to a command with a network namespace of its own: the
host's resolver may be a loopback address it cannot reach (systemd-resolved's 127.0.0.53),
slirp4netns' DNS forwarder at 10.0.2.3 asks it for the command."""


@cache
def own_network_step() -> tuple[str, ...] | None:
    """The launcher step (argv prefix, before bwrap) that gives a networked confined command
    a network namespace of its own, or None where it cannot work (probed once)."""
    if own_network_problem() is not None:
        return None
    return _step()


def _step() -> tuple[str, ...] | None:
    slirp, ip = shutil.which("slirp4netns", path=_TOOLS), shutil.which("ip", path=_TOOLS)
    if slirp is None or ip is None:
        return None
    return (sys.executable, "-I", "-S", NET_STEP, slirp, ip, "--")


def own_network_args(view: View) -> tuple[list[str], list[str]]:
    """What a command confined by ``view`` gets for the network: the launcher step before
    bwrap and bwrap's mounts for it (both empty without the network or a step)."""
    step = own_network_step() if view.network and not view.host_network else None
    if step is None:
        return [], []
    resolv = ["--ro-bind", SLIRP_RESOLV, "/etc/resolv.conf"]
    return list(step), resolv if os.path.exists("/etc/resolv.conf") else []


@cache
def own_network_problem() -> str | None:
    """Why a confined command given the network shares the host's network namespace here
    (one line), or None when it gets one of its own (probed once)."""
    step = _step()
    if step is None:
        return "slirp4netns or ip is not installed (apt-get install -y slirp4netns iproute2)"
    true = shutil.which("true", path="/usr/bin:/bin")
    if confinement_problem() is not None or true is None:
        return "bubblewrap cannot confine commands here"
    argv = [
        *(user_counts_step() or ()),
        *step,
        *bwrap_argv(View(network=True), own=(), workspace=Path("/")),
        true,
    ]
    if probe_succeeds(argv):
        return None
    return f"slirp4netns cannot give a command a network namespace of its own here ({step[4]})"
