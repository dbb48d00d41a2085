"""The `evolane` command line."""

import time

STARTED = time.time()
"""When the command line was loaded: a run's wall-clock budget counts from here."""
LAUNCHED: float | None = None
"""Set by `main` to `STARTED` (the process is a console-script invocation); the next run
takes it as its start and clears it."""

from evolane.cli._app import app, main  # noqa: E402

__all__ = ["STARTED", "app", "main"]
