"""evolane's pytest plugin (loaded automatically once evolane is installed): fixtures for
concurrency tests of your own actors and backends.

- ``runtime``: an `evolane.open_runtime` with its store in the test's tmp dir (trio tests).
- ``chaos``: a seeded `Chaos` injector, installed for the test (set rates on it);
  the seed comes from ``--evolane-chaos-seed`` (default 0).
- ``no_leaks``: fails the test if it left a process of its sandboxed trees alive.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the fixtures import what they use: this module loads in every session
    from evolane.testing._chaos import Chaos


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--evolane-chaos-seed",
        type=int,
        default=0,
        help="seed of the evolane `chaos` fixture's fault schedule",
    )


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Any]:
    """An embedded evolane runtime whose store lives in the test's tmp dir."""
    from evolane import embed

    async with embed.open_runtime(store=tmp_path / ".evolane") as embedded:
        yield embedded


@pytest.fixture
def chaos(request: pytest.FixtureRequest) -> Iterator[Chaos]:
    """A seeded fault injector installed in the runtime for this test (rates start at 0)."""
    from evolane.testing._chaos import Chaos

    injector = Chaos(seed=request.config.getoption("--evolane-chaos-seed"))
    with injector.installed():
        yield injector


@pytest.fixture
def no_leaks(request: pytest.FixtureRequest) -> Iterator[str]:
    """Fail the test if a process it spawned (through the sandbox) outlives it; yields the
    test's lease (what `evolane.testing.lease_holders` takes), nested under any inherited."""
    from evolane.testing._leaks import (
        LEASE_VARIABLE,
        descendants,
        kill_processes,
        leaked_processes,
    )

    # A lease of the test's own, nested under any this process runs under (pytest run as an
    # evolane replay): found by review, the fixture took the inherited lease as its own and
    # SIGKILLed every other holder of it, the replay's own shell among them.
    inherited = os.environ.get(LEASE_VARIABLE)
    lease = f"pytest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.environ[LEASE_VARIABLE] = f"{inherited}/{lease}" if inherited else lease
    before = descendants()
    try:
        yield lease
    finally:
        if inherited is None:
            os.environ.pop(LEASE_VARIABLE, None)
        else:
            os.environ[LEASE_VARIABLE] = inherited
    leaked = leaked_processes(before, lease)
    if leaked:
        kill_processes(leaked)
        pytest.fail(f"{request.node.nodeid} leaked processes:\n" + "\n".join(leaked))
