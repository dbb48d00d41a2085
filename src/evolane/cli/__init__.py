"""The `evolane` command line."""

import time

STARTED = time.time()
"""When the command line was loaded: a run's wall-clock budget counts from here."""
LAUNCHED: float | None = None
"""Set by `main` to `STARTED` (the process is a console-script invocation); the next run
takes it as its start and clears it."""

from evolane.cli._loading import holding_signals  # noqa: E402

with holding_signals():  # a Ctrl-C inside a C extension's import can crash: `main` answers it
    from evolane.cli._app import app, main

__all__ = ["STARTED", "app", "main"]
