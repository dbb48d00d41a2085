"""Unit uids are claimed host-wide: two runtimes on one host never run live units as one uid
(found by review: each host counted from its own random place, so two could meet; one
unit's end then removed the other live unit's /dev/shm files, and the two could signal)."""

from __future__ import annotations

import itertools
import os
import sys
import uuid
from pathlib import Path

import pytest
import trio

from evolane.sandbox import SandboxSpec, open_sandbox
from evolane.sandbox._secrets import commands_run_unprivileged
from evolane.sandbox._uids import claim_uid, claims_folder, release_uid


def test_a_claimed_uid_is_not_handed_out_again_until_released(tmp_path: Path) -> None:
    folder = claims_folder(tmp_path / "claims")
    assert folder is not None
    draws: list[bool] = []

    def draw(jump: bool) -> int:  # always the same uid unless told to jump
        draws.append(jump)
        return 7 if not jump else 8

    first = claim_uid(folder, draw)
    second = claim_uid(folder, draw)
    assert (first.uid, second.uid) == (7, 8) and draws == [False, False, True]
    release_uid(first)
    assert not (folder / "7").exists()
    again = claim_uid(folder, draw)
    assert again.uid == 7
    for claim in (second, again):
        release_uid(claim)
    held = claim_uid(folder, lambda jump: 9)
    with pytest.raises(OSError, match="no free unit uid"):  # every try taken: a spawn error
        claim_uid(folder, lambda jump: 9)
    release_uid(held)


def test_a_claims_folder_others_may_write_is_not_used(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)
    assert claims_folder(folder) is None
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    assert claims_folder(link) is None
    no_uid = claim_uid(None, lambda jump: 5)  # no folder: the host's own count, as before
    assert (no_uid.uid, no_uid.fd) == (5, None)


LONG = """
import os, sys, time
path = sys.argv[1]
open(path, "w").write("x")
print(os.getuid(), flush=True)
time.sleep(float(sys.argv[2]))
print(os.path.exists(path), flush=True)
"""


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
async def test_two_hosts_drawing_the_same_uids_never_share_one(tmp_path: Path) -> None:
    """Both hosts count from the same place: the second's unit gets another uid, and its
    end leaves the first's live /dev/shm file alone (it removed it)."""
    shm = f"/dev/shm/evolane-test-uid-{uuid.uuid4().hex}"
    start = int.from_bytes(os.urandom(2), "big")
    outcomes: dict[str, str] = {}
    try:
        async with (
            open_sandbox(tmp_path / "a") as first,
            open_sandbox(tmp_path / "b") as second,
        ):
            first._uids = itertools.count(start)
            second._uids = itertools.count(start)

            async def run(name: str, host: object, argv: tuple[str, ...]) -> None:
                spec = SandboxSpec(argv=argv, isolation="process", drop_root=True)
                outcome = await host.run(spec, timeout=60)  # type: ignore[attr-defined]
                assert outcome.ok, outcome
                outcomes[name] = outcome.stdout.text()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "long", first, (sys.executable, "-I", "-c", LONG, shm, "3"))
                with trio.fail_after(60):
                    while not os.path.exists(shm):
                        await trio.sleep(0.02)
                await run("short", second, ("sh", "-c", "id -u"))
                await trio.to_thread.run_sync(second.settle)  # its litter removed
    finally:
        if os.path.exists(shm):
            os.unlink(shm)
    long_uid, survived = outcomes["long"].split()
    assert int(outcomes["short"]) != int(long_uid)
    assert survived == "True"
