"""A thread or memory the host refuses evolane's own process ends the run in one line.

Found by review: under ``ulimit -v`` a trio worker thread the host refused (its stack could
not be mapped) ended the run ``internal error: ... RuntimeError("can't start new thread")``,
and a ``MemoryError`` ``internal error: MemoryError``: neither named the limit to raise nor
left the run resumable. Both are now the host's refusal, as open files run out are
(``evolane.store.storage_failure``): one line naming the limit. (A tighter ``ulimit -v``
may instead meet a compiled extension's allocator, which aborts the process: exit -6, the
run left as a kill leaves it, for ``--resume``.)"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

_REFUSED = """
import json, threading, time
from evolane.store import describe_failure, refused_write, storage_failure

def refusals():
    try:
        bytearray(1 << 30)  # past the address space allowed
    except MemoryError as error:
        yield error
    stop, held = threading.Event(), []
    try:
        while len(held) < 10_000:  # each thread's stack is mapped until none more can be
            held.append(threading.Thread(target=stop.wait))
            held[-1].start()
    except RuntimeError as error:
        yield error
    finally:
        stop.set()

seen = []
for error in refusals():
    group = ExceptionGroup("a lane's nursery", [ValueError("other"), error])
    found = storage_failure(group)
    seen.append([type(error).__name__, found is error, refused_write(found),
                 describe_failure(found, "store")])
print(json.dumps(seen))
"""


def test_a_thread_or_memory_the_host_refused_is_the_hosts_one_line_and_resumable() -> None:
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    done = subprocess.run(
        [sys.executable, "-c", _REFUSED],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (500 << 20, hard)),
    )
    assert done.returncode == 0, done.stderr
    memory, thread = json.loads(done.stdout)
    limit = "address-space limit (`ulimit -v`) of 500 MiB is reached: raise it"
    assert memory[:3] == ["MemoryError", True, True], memory
    assert memory[3] == f"evolane ran out of memory (MemoryError): its {limit}"
    assert thread[:3] == ["RuntimeError", True, True], thread
    assert thread[3].startswith("the host refused evolane a thread (can't start new thread)")
    assert "pids.max" in thread[3] and limit in thread[3], thread


_THREADS = (
    "import os, evolane.cli, numpy; "
    "print(len(os.listdir('/proc/self/task')), os.environ['OPENBLAS_NUM_THREADS'])"
)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no thread on one core")
def test_the_command_line_starts_no_blas_thread_and_keeps_a_users_setting() -> None:
    # Found by review: numpy's OpenBLAS started a thread per core but one in every evolane
    # process (63 on a 64-core host), each a pid under a container's pids.max.
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", _THREADS], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"1", b"1"]  # the main thread alone
    env["OPENBLAS_NUM_THREADS"] = "2"
    done = subprocess.run([sys.executable, "-c", _THREADS], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"2", b"2"]  # the user's own setting wins
