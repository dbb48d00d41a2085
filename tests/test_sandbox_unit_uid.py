"""A root evolane's drop_root commands (issue 22): the spawn server's clone switches them to
their unit uid as the launcher chain's setpriv step does, and never runs one as root unasked."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evolane.sandbox import (
    Limits,
    SandboxHost,
    SandboxSpec,
    _secrets,
    _spawnd,
    _spawner,
    open_sandbox,
)
from evolane.sandbox._launch import launcher_argv
from evolane.sandbox._secrets import UNIT_UID_BASE
from evolane.sandbox._spec import ProcessOutcome
from tests.sandbox_helpers import altered_server, run_sh, zombies

root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="only a root evolane switches commands' uids"
)


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[SandboxHost]:
    async with open_sandbox(tmp_path / "sandbox") as opened:
        yield opened


_PRIVILEGE_FIELDS = ("Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")


def _privileges(outcome: ProcessOutcome) -> dict[str, str]:
    lines = outcome.stdout.text().splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return {name: value.strip() for name, value in fields.items()}


def _switches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], object]]:
    """(argv, uid switch) of each spawn through the server in this test."""
    seen: list[tuple[list[str], object]] = []
    real = _spawner.Spawner.spawn

    def spy(self: _spawner.Spawner, path: str, argv: list[str], *rest: object) -> int:
        seen.append((argv, rest[7] if len(rest) > 7 else None))
        return real(self, path, argv, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(_spawner.Spawner, "spawn", spy)
    return seen


@root_only
async def test_a_drop_root_command_becomes_its_unit_uid_in_the_clone_as_through_setpriv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = os.getgroups()
    os.setgroups([4242, 4343])  # evolane's supplementary groups: the command has none
    try:
        async with (
            open_sandbox(tmp_path / "sandbox") as host,
            open_sandbox(tmp_path / "launched", use_spawner=False) as launcher_host,
        ):
            await _compare_unit_uids(host, launcher_host, tmp_path, monkeypatch)
    finally:
        os.setgroups(groups)


async def _compare_unit_uids(
    host: SandboxHost, launcher_host: SandboxHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host.spawner is not None and host.spawner.switches_uid
    # The program sits in a folder only root may enter, and only root may execute it: as
    # under setpriv, the exec runs with root's capabilities and what it starts with the one
    # the unit keeps (CAP_DAC_READ_SEARCH, which lets sh read the script).
    private = tmp_path / "sandbox" / "private"
    private.mkdir(mode=0o700)
    script = private / "show"
    script.write_text(
        "#!/bin/sh\n"
        "grep -E '^(Uid|Gid|Groups|Cap...|NoNewPrivs):' /proc/self/status\n"
        "bits=$(\"$1\" -c 'import ctypes; print(ctypes.CDLL(None).prctl(27, 0, 0, 0, 0))')\n"
        'echo "Securebits: $bits"\n'
        "touch /etc/evolane-unit-wrote-here 2>/dev/null && echo 'Wrote: yes'\n"
        "cat /etc/shadow > /dev/null && echo 'Reads: root files'\n"
    )
    script.chmod(0o700)
    seen = _switches(monkeypatch)
    spec = SandboxSpec(argv=(str(script), sys.executable), drop_root=True, kill_grace=0.2)
    served, launched = [await way.run(spec, timeout=30) for way in (host, launcher_host)]
    assert served.ok and launched.ok, (served, launched)
    [(argv, switch)] = seen
    assert argv == list(spec.argv) and switch is not None  # no setpriv exec: the clone did it
    mine, theirs = _privileges(served), _privileges(launched)
    for name in (*_PRIVILEGE_FIELDS, "Securebits", "Reads"):
        assert mine.get(name) == theirs.get(name), (name, mine, theirs)
    uids = mine["Uid"].split()
    assert len(set(uids)) == 1 and int(uids[0]) >= UNIT_UID_BASE and mine["Gid"].split() == uids
    assert mine["CapBnd"] == mine["CapAmb"] == f"{1 << 2:016x}" and mine["NoNewPrivs"] == "1"
    assert mine["Groups"] == "" and mine["Securebits"] == "0" and "Wrote" not in mine
    assert served.enforcement == launched.enforcement and "unprivileged_uid" in served.enforcement


def _refuse_uid_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """Servers started meanwhile fail a uid switch halfway (after ``setresuid``) ``when``
    that expression, evaluated in the clone, holds."""
    after = "    os.setresuid(uid, uid, uid)\n"
    refuse = f"    if {when}:\n        raise PermissionError(1, 'refused')\n"
    monkeypatch.setattr(_spawnd, "__file__", altered_server(tmp_path, after, refuse))


@root_only
async def test_a_clone_that_cannot_switch_uids_leaves_the_switch_to_setpriv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_uid_switch(tmp_path, monkeypatch, "True")
    seen = _switches(monkeypatch)
    async with open_sandbox(tmp_path / "sandbox") as host:
        assert host.spawner is not None and not host.spawner.switches_uid  # found by its probe
        outcome = await run_sh(host, "id -u; grep CapBnd /proc/self/status", drop_root=True)
    assert outcome.ok, outcome
    assert int(outcome.stdout.text().split()[0]) >= UNIT_UID_BASE
    [(argv, switch)] = [entry for entry in seen if "id -u" in " ".join(entry[0])]
    assert switch is None and "setpriv" in argv[0]


@root_only
async def test_a_uid_switch_failing_in_the_clone_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Halfway: the uid is switched, the capabilities not yet. The command must not run.
    _refuse_uid_switch(tmp_path, monkeypatch, "os.getcwd() != '/'")  # a unit's, not the probe's
    writable = tmp_path / "open"
    writable.mkdir(mode=0o777)
    writable.chmod(0o777)  # the unit uid could make the marker, had the command run
    marker, zombies_before = writable / "ran", zombies()
    async with open_sandbox(tmp_path / "sandbox") as host:
        assert host.spawner is not None and host.spawner.switches_uid  # the probe's uid works
        outcome = await run_sh(host, f"touch {marker}", drop_root=True)
        assert outcome.status == "spawn_failed" and "refused" in (outcome.error or ""), outcome
        assert not host.spawner.broken
    assert not marker.exists() and zombies() <= zombies_before  # the clone was reaped


@root_only
async def test_a_drop_root_command_with_no_way_to_switch_uids_loses_roots_capabilities(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No setpriv: no unit uid (the launcher chain could not switch either way), so the
    # command is root, and must lose what a plain root command loses, not keep it all.
    monkeypatch.setattr(_secrets, "_setpriv", lambda: None)
    monkeypatch.setattr(_secrets, "_setpriv_flags", lambda: None)  # its answer is cached
    seen = _switches(monkeypatch)
    outcome = await run_sh(host, "id -u; grep CapBnd /proc/self/status", drop_root=True)
    assert outcome.ok, outcome
    [(argv, switch)] = seen
    assert argv[0] == "sh" and switch is None  # the server's clone dropped them
    uid, bounding = outcome.stdout.text().split()[0], outcome.stdout.text().split()[-1]
    assert uid == "0" and "unprivileged_uid" not in outcome.enforcement
    for number in _secrets.DROPPED_CAPABILITIES.values():
        assert not int(bounding, 16) & (1 << number), (number, bounding)
    assert "root_caps_dropped" in outcome.enforcement


def test_a_launcher_chain_asked_for_a_unit_uid_it_cannot_switch_to_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Never silently root: a caller that asks for a uid this host cannot switch to gets an
    # error (a spawn failure), not a command that runs as root.
    monkeypatch.setattr(_secrets, "_setpriv", lambda: None)
    with pytest.raises(OSError, match="unit uid"):
        launcher_argv(("true",), [], Limits(), False, None, UNIT_UID_BASE + 1)
