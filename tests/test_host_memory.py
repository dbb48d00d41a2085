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
import resource
import subprocess
import sys

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
