"""The child's environment: an allowlist, named pass-through, explicit entries; no secrets."""

from __future__ import annotations

import os
from collections.abc import Mapping

from evolane.sandbox._lifeline import LEASE_VARIABLE
from evolane.sandbox._spec import SandboxSpec

ALLOWED = ("PATH", "LANG", "TZ")
ALLOWED_PREFIXES = ("LC_",)


def child_lease(inherited: str | None, host_lease: str, unit: str) -> str:
    """The unit's lease marker, nested under any lease this process itself runs under."""
    own = f"{host_lease}/{unit}"
    return f"{inherited}/{own}" if inherited else own


def build_environment(
    spec: SandboxSpec,
    *,
    home: str,
    tmp: str,
    workspace: str,
    lease: str,
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Only what the spec asks for reaches the child; the parent's other variables never do."""
    source = os.environ if parent is None else parent
    env = {
        name: value
        for name, value in source.items()
        if name in ALLOWED or name.startswith(ALLOWED_PREFIXES)
    }
    env.setdefault("PATH", os.defpath)
    for name in spec.pass_env:
        if name in source:
            env[name] = source[name]
    env.update(spec.env)
    env.update(
        {
            "HOME": home,
            "TMPDIR": tmp,
            "EVOLANE_WORKSPACE": workspace,
            LEASE_VARIABLE: lease,
        }
    )
    return env
