"""The `evolane` command line."""

from evolane.cli._app import app, main

__all__ = ["app", "main"]
