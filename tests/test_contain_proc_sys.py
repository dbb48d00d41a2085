"""Found by review: a root evolane's confined command ran as ``nobody`` mapped onto root,
and the kernel lets a task whose uid is root on the host write a global sysctl with no
capability at all; bwrap covers ``/proc/sys`` only when it can write that folder, which
the sysctl root never allows. So a confined replay wrote ``vm.swappiness`` and could open
``kernel.core_pattern`` (whose ``|program`` the kernel runs as root on the host at the next
core dump: the whole host), and with ``--network`` the host's ``net.*``. The fresh /proc's
sysctls are covered read-only now; they still read. Nothing here writes a sysctl: a file
that opens for writing is writable."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from evolane.sandbox import View
from evolane.sandbox._confine import confinement_problem
from tests.sandbox_helpers import run_confined

pytestmark = pytest.mark.skipif(
    confinement_problem() is not None, reason=f"no confinement here: {confinement_problem()}"
)

WRITABLE = textwrap.dedent(
    """
    import os
    writable, read = [], 0
    for root, folders, files in os.walk("/proc/sys"):
        for name in files:
            path = os.path.join(root, name)
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # opened, never written
                writable.append(path)
            except OSError:
                pass
    for path in ("/proc/sys/kernel/ostype", "/proc/sys/vm/swappiness", "/proc/sys/fs/file-max"):
        read += bool(open(path).read().strip())
    print(len(writable), read, *writable[:5])
    """
)


@pytest.mark.parametrize("network", [False, True], ids=["own network", "--network"])
@pytest.mark.parametrize("spawner", [True, False], ids=["spawn server", "launcher chain"])
async def test_a_confined_command_writes_no_sysctl(
    tmp_path: Path, network: bool, spawner: bool
) -> None:
    outcome = await run_confined(tmp_path, WRITABLE, spawner, View(network=network))
    assert outcome.ok, outcome.stderr.text()
    count, read, *some = outcome.stdout.text().split()
    assert (count, read) == ("0", "3"), (count, read, some)
