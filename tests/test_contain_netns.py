"""Found by review: a confined command given the network (``--network``, ``--network-for
ROLE``) shared the host's network namespace, so it reached the host's loopback services,
its abstract unix sockets and a cloud VM's metadata endpoint (169.254.169.254). It gets a
namespace of its own whose only way out is slirp4netns' outbound NAT, each way a confined
command starts (the spawn server's clone, the launcher chain). The end-to-end run is
``tests/test_contain_grants.py::test_a_replay_given_the_network_reaches_no_loopback_service_of_the_host``.
"""

from __future__ import annotations

import json
import shutil
import socket
import uuid
from pathlib import Path

import pytest

from evolane.sandbox import View, _netns
from evolane.sandbox._netns import own_network_problem
from tests.sandbox_helpers import run_confined

pytestmark = pytest.mark.skipif(
    own_network_problem() is not None, reason=f"{own_network_problem()}"
)

PROBE = """
import json, socket
def reach(family, address):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(address)
            return "connected"
        except OSError as error:
            return type(error).__name__
print(json.dumps({
    "loopback": reach(socket.AF_INET, ("127.0.0.1", LOOPBACK_PORT)),
    "gateway": reach(socket.AF_INET, ("10.0.2.2", LOOPBACK_PORT)),
    "abstract": reach(socket.AF_UNIX, "\\0" + ABSTRACT),
    "metadata": reach(socket.AF_INET, ("169.254.169.254", 80)),
    "alibaba": reach(socket.AF_INET, ("100.100.100.200", 80)),
    "wireserver": reach(socket.AF_INET, ("168.63.129.16", 80)),
}))
"""


@pytest.mark.parametrize("spawner", [True, False], ids=["spawn server", "launcher chain"])
async def test_a_command_given_the_network_reaches_nothing_of_the_hosts_own(
    tmp_path: Path, spawner: bool
) -> None:
    abstract = f"evolane-test-{uuid.uuid4().hex}"
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix,
    ):
        unix.bind("\0" + abstract)
        unix.listen()
        port = server.getsockname()[1]
        code = f"LOOPBACK_PORT = {port}\nABSTRACT = {abstract!r}\n{PROBE}"
        outcome = await run_confined(tmp_path, code, spawner, View(network=True))
    assert outcome.ok, outcome.stderr.text()
    got = json.loads(outcome.stdout.text())
    assert got["loopback"] == "ConnectionRefusedError", got
    assert got["gateway"] != "connected", got  # slirp4netns maps no host loopback there
    assert got["abstract"] == "ConnectionRefusedError", got
    assert got["metadata"] == "PermissionError", got  # the prohibit route: EACCES
    # Found by review: Alibaba Cloud's metadata endpoint and Azure's WireServer (keys of the
    # VM's extensions) are no link-local address, and the NAT reached them.
    assert got["alibaba"] == got["wireserver"] == "PermissionError", got
    assert "nat_network" in outcome.enforcement, outcome.enforcement


@pytest.mark.parametrize("spawner", [True, False], ids=["spawn server", "launcher chain"])
async def test_a_network_step_that_fails_is_a_spawn_failure_not_the_commands(
    tmp_path: Path, spawner: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by review: the step's own failure (slirp4netns that could not wire the
    # namespace after the probe passed) exited 125 as the command would, so a replay's case
    # was scored as the candidate's failure. It is the host's: a spawn failure.
    step = list(_netns.own_network_step() or ())
    step[4] = shutil.which("false") or "/bin/false"  # a slirp4netns that never wires
    monkeypatch.setattr(_netns, "own_network_step", lambda: tuple(step))
    outcome = await run_confined(tmp_path, "print('ran')", spawner, View(network=True))
    assert outcome.status == "spawn_failed", (outcome.status, outcome.stderr.text())
    assert "slirp4netns did not wire" in (outcome.error or ""), outcome.error
    assert "ran" not in outcome.stdout.text()


@pytest.mark.parametrize("spawner", [True, False], ids=["spawn server", "launcher chain"])
async def test_a_command_cannot_pass_its_failure_off_as_the_network_steps(
    tmp_path: Path, spawner: bool
) -> None:
    code = (
        "import os, sys\n"
        "print(os.environ.get('EVOLANE_NET_NONCE'))\n"
        "sys.stderr.write('evolane-net-0123456789abcdef: slirp4netns did not wire\\n')\n"
        "sys.exit(125)\n"
    )
    outcome = await run_confined(tmp_path, code, spawner, View(network=True))
    assert outcome.status == "exited" and outcome.exit_code == 125, outcome
    assert outcome.stdout.text().strip() == "None"  # the nonce never reaches the command
