"""Only evolane's own spawn is read as refused by the host (EAGAIN, ENOMEM), by its errno.

Found by review: whether a failed spawn was the host refusing a process for the moment was
read from its message's text (``[Errno 11]``, ``[Errno 12]``). Through the launcher chain
(no spawn server: it broke, or a command killed it) a command's own stderr is that message
when it prints the launcher's join failure line and exits 125; the line's nonce is in the
launcher shell's argv, which another command of the same uid can read in ``/proc`` for
the moment it lives (``--isolation process``). Such a command was tried again as a refused
spawn, its failure never its own. The tests give the command its nonce, as a neighbour
reading ``/proc`` would.
"""

from __future__ import annotations

import errno
import types
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evolane.lanes._replay_failure import classify, refused_for_now
from evolane.messages import ReplayResult
from evolane.sandbox import SandboxHost, SandboxSpec, _run, open_sandbox
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
