"""Found by review: a confined command's ``/dev`` (bwrap's own tmpfs) and its ``/dev/shm``
had no size: a replay wrote 600 MiB into each beside a ``/tmp`` full at its 256 MiB, so
with ``--max-memory none`` (or no memory cgroup) every command could fill half the host's
memory. ``/dev/shm`` now has the private ``/tmp``'s cap and ``/dev`` is read-only; its
devices, a pseudo-terminal and POSIX shared memory still work."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from evolane.sandbox import View
from evolane.sandbox._confine import confinement_problem
from tests.sandbox_helpers import run_confined

pytestmark = pytest.mark.skipif(
    confinement_problem() is not None, reason=f"no confinement here: {confinement_problem()}"
)

CAP = 2 << 20

FILL = textwrap.dedent(
    """
    import json, mmap, os

    def fill(path):
        written = 0
        try:
            with open(path, "wb") as handle:
                for _ in range(8):
                    handle.write(b"x" * (1 << 20))
                    handle.flush()
                    written += 1 << 20
        except OSError as error:
            return [written, error.strerror]
        return [written, None]

    found = {place: fill(place) for place in ("/tmp/fill", "/dev/shm/fill", "/dev/fill")}
    with open("/dev/null", "wb") as sink:
        sink.write(b"still a device")
    for place in ("/dev/shm/fill", "/tmp/fill"):
        os.unlink(place)
    shared = os.open("/dev/shm/psm_test", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)  # shm_open
    os.ftruncate(shared, 4096)
    with mmap.mmap(shared, 4096) as memory:
        memory[0] = 7
    os.unlink("/dev/shm/psm_test")
    for end in os.openpty():
        os.close(end)
    print(json.dumps(found))
    """
)


@pytest.mark.parametrize("spawner", [True, False], ids=["spawn server", "launcher chain"])
async def test_dev_and_dev_shm_take_no_more_than_the_private_tmp(
    tmp_path: Path, spawner: bool
) -> None:
    outcome = await run_confined(tmp_path, FILL, spawner, View(tmp_bytes=CAP))
    assert outcome.ok, outcome.stderr.text()
    found = json.loads(outcome.stdout.text())
    assert found["/tmp/fill"][1] == "No space left on device", found
    assert found["/dev/shm/fill"][0] <= CAP and found["/dev/shm/fill"][1], found
    assert found["/dev/fill"] == [0, "Read-only file system"], found
