"""The `evolane` command line."""

import os
import time

# OpenBLAS (numpy's) starts a thread per core but one at load: 63 more threads in every
# evolane process of a 64-core host, each a pid under a container's pids.max, and under a
# full one its refused thread raised SIGINT, read as a Ctrl-C (found by review). evolane's
# statistics are vector work that gains nothing from them; a user's own setting wins, and
# commands never see it (their environment is an allowlist).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

STARTED = time.time()
"""When the command line was loaded: a run's wall-clock budget counts from here."""
LAUNCHED: float | None = None
"""Set by `main` to `STARTED` (the process is a console-script invocation); the next run
takes it as its start and clears it."""

from evolane.cli._loading import holding_signals  # noqa: E402

with holding_signals():  # a Ctrl-C inside a C extension's import can crash: `main` answers it
    from evolane.cli._app import app, main

__all__ = ["STARTED", "app", "main"]
