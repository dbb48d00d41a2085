"""The one reader of ``/proc/<pid>/status`` (`evolane.sandbox._procfs`)."""

from __future__ import annotations

import os
import threading

from evolane.sandbox._procfs import live_uid, proc_status


def test_a_live_process_is_read_with_its_uid_and_threads() -> None:
    before = proc_status(os.getpid())
    stop = threading.Event()
    extra = threading.Thread(target=stop.wait)
    extra.start()
    try:
        found = proc_status(os.getpid())
        assert before is not None and found is not None
        assert found.state in ("R", "S") and found.uid == os.getuid()
        assert found.threads == before.threads + 1  # every thread counted, the new one too
        assert live_uid(str(os.getpid())) == os.getuid()
    finally:
        stop.set()
        extra.join()


def test_a_zombie_is_read_but_has_no_live_uid() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        for _ in range(10_000):  # until the child has exited (a zombie until reaped below)
            found = proc_status(pid)
            if found is not None and found.state == "Z":
                break
            os.sched_yield()
        assert found is not None and found.state == "Z" and found.uid == os.getuid()
        assert live_uid(pid) is None
    finally:
        os.waitpid(pid, 0)
    assert proc_status(pid) is None and live_uid(pid) is None  # reaped: gone
