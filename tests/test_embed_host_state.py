"""An embedded runtime leaves the agent's process as it found it: the process-wide flags a
sandbox host needs (non-dumpable, child subreaper) are held while a host is open and put
back when the last one closes; an orphan of a program the agent runs afterwards is not
re-parented to it (and left a zombie)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.evolve_helpers import agent_report

AGENT = textwrap.dedent(
    """
    import ctypes, json, subprocess, sys, time
    import psutil, trio
    from evolane.sandbox import SandboxSpec, open_sandbox

    libc = ctypes.CDLL(None)

    def flags():
        subreaper = ctypes.c_int(0)
        libc.prctl(37, ctypes.byref(subreaper), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
        return [libc.prctl(3, 0, 0, 0, 0), subreaper.value]  # PR_GET_DUMPABLE

    def zombies():
        return [c.name() for c in psutil.Process().children() if c.status() == "zombie"]

    async def main(root):
        seen = {"before": flags()}
        async with open_sandbox(root + "/a", use_spawner=False) as first:
            async with open_sandbox(root + "/b", use_spawner=False):
                seen["two open"] = flags()
            seen["one open"] = flags()
            outcome = await first.run(SandboxSpec(argv=("true",)), timeout=60)
            seen["ran"] = outcome.status
        seen["closed"] = flags()
        subprocess.run(["sh", "-c", "sleep 0.2 & exit 0"], check=True)  # orphans a sleep
        time.sleep(1.0)  # the orphan has exited by now: whose zombie is it?
        seen["zombies"] = zombies()
        print(json.dumps(seen))

    trio.run(main, sys.argv[1])
    """
)


def test_the_host_flags_are_put_back_when_the_last_sandbox_host_closes(tmp_path: Path) -> None:
    seen = agent_report(AGENT, str(tmp_path))
    assert seen["before"] == [1, 0]
    assert seen["two open"] == seen["one open"] == [0, 1]  # held while any host is open
    assert seen["ran"] == "exited"
    assert seen["closed"] == [1, 0]
    assert seen["zombies"] == []
