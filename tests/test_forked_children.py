"""A child forked from an evolane process (a `multiprocessing` worker) keeps none of the
locks the process holds for its life: once the process dies, even by SIGKILL, a run's
target, its journal and the evolve queue can be taken again while the child lives on (the lifeline's
case is tests/test_sandbox_kill.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from evolane.campaign._lock import lock_target
from evolane.embed._pending import RecordQueue, StoreDirs
from evolane.store import Journal

HOLDER = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from evolane.campaign._lock import lock_target
    from evolane.embed._pending import RecordQueue, StoreDirs
    from evolane.store import Journal

    target, store = Path(sys.argv[1]), Path(sys.argv[2])
    held = (
        lock_target(target, "r-held"),
        RecordQueue.open(StoreDirs(store), 10),
        Journal(store / "journal.jsonl"),
    )
    child = os.fork()  # a worker, as multiprocessing forks one: it outlives its parent
    if child == 0:  # said by the child once it runs (a loaded host had not run it yet)
        print(os.getpid(), flush=True)
        time.sleep(120)
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_dead_process_s_locks_are_free_while_its_forked_child_lives(tmp_path: Path) -> None:
    # Found by review: the child held copies of the flocks, so a resume was refused ("the
    # run is going on in another process") and a new evolve service too, until it exited.
    target, store = tmp_path / "target", tmp_path / "store"
    target.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(target), str(store)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    line = holder.stdout.readline()  # not to EOF: the child holds the pipe too
    holder.stdout.close()
    assert holder.wait(timeout=60) == -signal.SIGKILL
    child = int(line)
    try:
        os.kill(child, 0)  # the child lives
        lock_target(target, "r-held").release()  # no TargetLocked
        RecordQueue.open(StoreDirs(store), 10).close()  # no "open in another service"
        Journal(store / "journal.jsonl").close()  # no "already open for appending"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
