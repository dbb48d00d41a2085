"""Only evolane's own spawn is read as failed, or refused by the host (EAGAIN, ENOMEM).

Found by review: whether a failed spawn was the host refusing a process for the moment was
read from its message's text (``[Errno 11]``, ``[Errno 12]``). Through the launcher chain
(no spawn server: it broke, or a command killed it) a command's own stderr is that message
when it prints the launcher's join failure line and exits 125; the line's nonce was the
launcher shell's $0, which another command read in ``/proc/PID/cmdline`` while the shell
lived (``--isolation process``). Such a command was tried again as a refused spawn, then
stopped the run as the host's failure. The first tests give the command its nonce, as such
a neighbour did.
"""

from __future__ import annotations

import errno
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from evolane.lanes._replay_failure import classify, refused_for_now
from evolane.messages import ReplayResult
from evolane.sandbox import ProcessOutcome, SandboxHost, SandboxSpec, _cgroups, _run, open_sandbox
from tests.sandbox_helpers import run_sh

NONCE = "0123456789abcdef"
FORGED = (
    f"echo 'evolane-launch-{NONCE}: cannot join cgroup: [Errno 11] Resource temporarily "
    "unavailable' >&2; exit 125"
)


@pytest.fixture
async def launcher_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[SandboxHost]:
    monkeypatch.setattr(_run, "secrets", types.SimpleNamespace(token_hex=lambda _: NONCE))
    async with open_sandbox(tmp_path / "launched", use_spawner=False) as opened:
        yield opened


def _result(failure: object) -> ReplayResult:
    return ReplayResult(
        unit_id="u", case_id="c", arm="candidate", repetition=0, status="failed", failure=failure
    )


async def test_a_command_printing_a_refused_join_is_not_a_refused_spawn(
    launcher_host: SandboxHost,
) -> None:
    outcome = await run_sh(launcher_host, FORGED)
    assert outcome.status == "spawn_failed" and "[Errno 11]" in outcome.error, outcome
    failure = classify(outcome, "candidate")
    assert failure is not None
    assert refused_for_now(_result(failure), 0) is None  # not tried again as the host's
    assert outcome.spawn_errno is None and failure.spawn_errno is None  # no call of ours failed


async def test_a_spawn_the_host_refuses_carries_its_errno(launcher_host: SandboxHost) -> None:
    spec = SandboxSpec(argv=("no-such-program-here",), kill_grace=0.2)
    outcome = await launcher_host.run(spec, timeout=30)
    assert outcome.status == "spawn_failed" and outcome.spawn_errno == errno.ENOENT, outcome
    failure = classify(outcome, "candidate")
    assert failure is not None and failure.spawn_errno == errno.ENOENT
    refused = failure.model_copy(update={"spawn_errno": errno.EAGAIN})
    assert refused_for_now(_result(refused), 0) is not None


_SNOOP = r"""
import os, re, sys, time
seen, end = set(), time.monotonic() + 3
while time.monotonic() < end:
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                words = handle.read().split(b"\0")
        except OSError:
            continue
        seen.update(w for w in words if w.startswith(b"evolane-launch"))
print(" ".join(sorted(w.decode() for w in seen)))
"""


async def test_no_neighbour_reads_a_launchers_nonce_in_proc(tmp_path: Path) -> None:
    # Found by review: the nonce was the launcher shell's $0, which every process reads in
    # /proc/PID/cmdline: a command watching there learned its neighbours' (20 of 30).
    async with open_sandbox(tmp_path / "launched", use_spawner=False) as host:
        watched: list[ProcessOutcome] = []

        async def watch() -> None:
            spec = SandboxSpec(argv=(sys.executable, "-I", "-c", _SNOOP), drop_root=True)
            watched.append(await host.run(spec, timeout=30))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.sleep(0.5)
            for _ in range(30):
                assert (await run_sh(host, "true")).ok
        (outcome,) = watched
    assert outcome.ok, outcome
    seen = outcome.stdout.text().split()
    assert not [word for word in seen if word != "evolane-launch"], seen


async def test_the_command_is_not_handed_the_nonce(launcher_host: SandboxHost) -> None:
    outcome = await run_sh(launcher_host, 'echo "[$EVOLANE_LAUNCH_NONCE]"; env')
    assert outcome.ok and outcome.stdout.text().startswith("[]\n"), outcome
    assert NONCE not in outcome.stdout.text()


async def test_a_cgroup_the_launcher_cannot_join_is_a_spawn_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by review: the shell's own "cannot create" line came before the launcher's, so
    # the line was never first and a real join failure read as the command's exit 125.
    real = _cgroups.UnitCgroups.procs_files

    def broken(self: _cgroups.UnitCgroups) -> list[str]:
        return [*real.fget(self), str(tmp_path / "gone" / "cgroup.procs")]  # type: ignore[attr-defined]

    monkeypatch.setattr(_cgroups.UnitCgroups, "procs_files", property(broken))
    async with open_sandbox(tmp_path / "launched", use_spawner=False) as host:
        outcome = await run_sh(host, "echo ran")
    assert outcome.status == "spawn_failed", outcome
    assert "cannot join cgroup" in outcome.error and outcome.stdout.text() == ""
