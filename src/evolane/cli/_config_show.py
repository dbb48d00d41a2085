"""``evolane config show``: the settings ``optimize``'s flags and the config file resolve
to, and where each value came from (`evolane.cli._config`)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from evolane.cli._config import NOT_IN_FILE, resolved_settings, shown_path
from evolane.cli._exits import fail_usage
from evolane.cli._optimize import _o, optimize

config_app = typer.Typer(
    name="config",
    help="The configuration file (evolane.toml) and the settings it resolves to.",
    no_args_is_help=True,
    add_completion=False,
)


def show(**flags: Any) -> None:
    """The resolved configuration for `optimize`'s flags (and the config file) and where
    each value came from: a flag, the config file (path:line), an example, or the default."""
    from evolane.cli._session import UsageError, build_config
    from evolane.inputs import InputError

    try:
        config = build_config(flags)
    except (UsageError, InputError) as error:
        fail_usage(str(error))
    settings = resolved_settings(config, flags)
    if flags.get("as_json"):
        print(json.dumps({"settings": settings}, indent=2))
        return
    width = max(len(name) for name in settings) + 1
    for name, setting in settings.items():
        key, value, source = name.replace("_", "-"), setting["value"], setting["source"]
        shown = "(not set)" if value is None else json.dumps(value)
        print(f"{key:<{width}} = {shown}  # {_shown_source(source)}")


def _shown_source(source: str) -> str:
    """A file source relative to the current folder when it is inside it."""
    path, _, line = source.rpartition(":")
    if line.isdigit() and path.startswith("/"):
        return f"{shown_path(Path(path))}:{line}"
    return source


def _show_signature() -> inspect.Signature:
    """``optimize``'s flags that make a configuration, plus ``--json``."""
    left_out = NOT_IN_FILE - {"config", "debug"}  # what asks for one run has nothing to show
    signature = inspect.signature(optimize, eval_str=True)
    params = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in signature.parameters.values()
        if p.name not in left_out
    ]
    as_json = inspect.Parameter(
        "as_json",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[bool, _o("Print the settings as JSON.", "--json")],
    )
    return inspect.Signature([*params, as_json])


show.__signature__ = _show_signature()  # type: ignore[attr-defined]
config_app.command(name="show")(show)
