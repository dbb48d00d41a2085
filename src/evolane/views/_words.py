"""The isolation in words rather than mechanism names, and token counts as whole numbers,
for the live view, ``watch``, the summary and report.md alike (report.json keeps the names
and the numbers: it is data)."""

from __future__ import annotations

import math

_LEVEL_WORDS = {
    "confined": "confined (bubblewrap{})",
    "namespace": "in own namespaces{}",
    "process": "plain processes, not confined",
}
_REAPING = frozenset({"lease_sweep", "subreaper", "lifeline"})


def isolation_words(isolation: str, safeguards: tuple[str, ...] = ()) -> list[str]:
    """``confined (bubblewrap)``, ``processes reaped on exit``: the isolation in words rather
    than mechanism names, as segments."""
    level, _, rest = isolation.partition(" ")
    template = _LEVEL_WORDS.get(level)
    network, _, host = rest.strip("()").partition(" [host's network: ")
    said = ""
    if network == "no network":
        said = "no network"
    elif network.startswith("network: "):  # --network-for ROLE
        said = f"network for {network.removeprefix('network: ')} only"
    if host:  # --host-network-for ROLE
        said = ", ".join(filter(None, [said, f"the host's network for {host.rstrip(']')}"]))
    if template is None:
        words = isolation
    elif level == "confined":
        words = template.format(f", {said}" if said else "")
    else:
        words = template.format(f" ({said})" if said else "")
    if _REAPING & set(safeguards):
        return [words + ",", "processes reaped on exit"]
    return [words]


def isolation_text(isolation: str) -> str:
    """A report's ``confined (no network); lease_sweep, subreaper`` as
    ``confined (bubblewrap, no network), processes reaped on exit``."""
    level, _, mechanisms = isolation.partition("; ")
    safeguards = tuple(name.strip() for name in mechanisms.split(",") if name.strip())
    return " ".join(isolation_words(level, safeguards))


def token_count(tokens: float | None) -> str:
    """``1,234,567``: a token count in whole tokens (rounded up: the estimate for a unit cut
    short may be fractional), where ``:g`` printed ``16511.5`` and, past a million,
    ``1.23457e+06`` (found by audit)."""
    return f"{math.ceil(tokens or 0):,}"
