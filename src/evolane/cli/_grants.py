"""The grant flags read into config values: ``--pass-env``, ``--expose`` and ``--expose-rw``,
each ``[ROLE=]VALUE`` (repeatable): with a role (`evolane.measure.COMMAND_ROLES`) the grant
reaches that role's commands only, without one every command, as before roles existed; and
``--network-for ROLE`` (repeatable), the network for one role's commands."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from evolane.inputs import InputError
from evolane.sandbox import ENV_NAME_PATTERN


def grant_values(flags: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """Config values for the grant flags given in ``flags``: names checked, paths made
    absolute (each must exist); `InputError`, one line naming the flag, on bad input."""
    values: dict[str, tuple[str, ...]] = {}
    if flags.get("pass_env"):
        values["pass_env"] = tuple(_variable(text) for text in flags["pass_env"])
    for key in ("expose", "expose_rw"):
        if flags.get(key):
            values[key] = tuple(_path("--" + key.replace("_", "-"), text) for text in flags[key])
    for key in ("network_for", "host_network_for"):
        if flags.get(key):
            flag = "--" + key.replace("_", "-")
            values[key] = tuple(dict.fromkeys(_role(flag, text) for text in flags[key]))
    return values


def _role(flag: str, text: str) -> str:
    """A ``--network-for`` (or ``--host-network-for``) value: a `COMMAND_ROLES` one."""
    from evolane.measure import COMMAND_ROLES

    if text not in COMMAND_ROLES:
        roles = ", ".join(COMMAND_ROLES)
        raise InputError(f"{flag} {text}: no command's role: choose from {roles}")
    return text


def _variable(text: str) -> str:
    """``[ROLE=]NAME`` as given; refused, without echoing what follows ``=`` (a key given in
    place of its variable's name must not reach a log), when it is not one."""
    from evolane.measure import split_grant

    head, sep, tail = text.partition("=")
    shown = f"{head}={'...' if tail else ''}" if sep else "..."
    try:
        role, name = split_grant(text)
    except ValueError as error:
        hint = "; give the NAME of the variable holding a key, never the key" if tail else ""
        raise InputError(f"--pass-env {shown}: {error}{hint}") from None
    if not re.fullmatch(ENV_NAME_PATTERN, name) or len(name) > 128:
        raise InputError(
            f"--pass-env {shown}: not a variable's name (give the NAME of the variable "
            "holding a key, never the key)"
        )
    return text if role is None else f"{role}={name}"


def _path(flag: str, text: str) -> str:
    """``[ROLE=]PATH`` with PATH absolute (shown at this name and its real one)."""
    from evolane.measure import split_grant

    try:
        role, path = split_grant(text)
    except ValueError as error:
        hint = " (a path with '=' in its name: write it ./NAME)" if text.partition("=")[2] else ""
        raise InputError(f"{flag} {text}: {error}{hint}") from None
    if not Path(path).exists():
        raise InputError(f"{flag} {text}: no such file or folder")
    absolute = os.path.abspath(path)
    return absolute if role is None else f"{role}={absolute}"
