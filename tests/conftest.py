"""Test-wide fixtures: trio mode (pyproject) and a leak check for processes left behind."""

from __future__ import annotations

import compileall
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import evolane
from evolane.sandbox import SandboxHost, open_sandbox
from evolane.store import BlobStore
from evolane.testing import (
    LEASE_VARIABLE,
    ChatStub,
    descendants,
    kill_processes,
    leaked_processes,
)

pytest_plugins = ["pytester"]

# Bytecode for every evolane module, written once per session (as an installed package has it):
# with PYTHONDONTWRITEBYTECODE set, each `python -m evolane` a test starts compiled from source
# every module no earlier process had cached (the whole CLI: ~0.05-0.1 s CPU per start).
compileall.compile_dir(Path(evolane.__file__).parent, quiet=2)

# Every process a test spawns inherits this marker, so escapees that leave our tree are found.
SESSION_LEASE = f"pytest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
os.environ[LEASE_VARIABLE] = SESSION_LEASE


@pytest.fixture(autouse=True)
def no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if a process it spawned is still alive after it (then kill that process)."""
    before = descendants()
    yield
    leaked = leaked_processes(before, SESSION_LEASE)
    if leaked:
        kill_processes(leaked)
        pytest.fail(f"{request.node.nodeid} leaked processes:\n" + "\n".join(leaked), pytrace=False)


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    """A blob store in the test's tmp dir."""
    return BlobStore(tmp_path / "store")


@pytest.fixture
async def host(tmp_path: Path, store: BlobStore) -> AsyncIterator[SandboxHost]:
    """A sandbox host in the test's tmp dir, writing captures to ``store``."""
    async with open_sandbox(tmp_path / "sandbox", store=store) as opened:
        yield opened


@pytest.fixture
def chat_stub() -> Iterator[ChatStub]:
    """A chat-completions server on 127.0.0.1 in a background thread; change ``.script``
    to script its answers, read ``.stats`` for what it saw."""
    with ChatStub() as stub:
        yield stub
