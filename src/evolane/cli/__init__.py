"""The `evolane` command line."""

import time

STARTED = time.time()
"""When the command line was loaded: a run's wall-clock budget counts from here."""

from evolane.cli._app import app, main  # noqa: E402

__all__ = ["STARTED", "app", "main"]
