"""How amounts read in the live view, the estimate and the summary: durations, counts,
tokens and dollars, and spend by role."""

from __future__ import annotations

from evolane import messages


def duration(seconds: float) -> str:
    """``42.0s``, ``3m05s``, ``2h07m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def count(value: float) -> str:
    """``950``, ``12.3k``, ``4.0M``."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}"


def amount(dimension: str, value: float | None) -> str:
    """``value`` of a budget dimension as a person reads it (``?``: unknown)."""
    if value is None:
        return "?"
    if dimension == "cost_usd":
        return f"${value:.2f}" if value >= 1 or value == 0 else f"${value:.4f}"
    if dimension == "wall_seconds":
        return duration(value)
    return count(value)


def role_spend(by_role: dict[str, messages.Usage], dimension: str | None = None) -> str:
    """``optimizer 2.1k tokens $0.12 · replay ...`` (or only ``dimension`` of each role)."""
    shown = ("tokens", "cost_usd") if dimension is None else (dimension,)
    parts = []
    for role, usage in by_role.items():
        values = [(d, usage.get(d)) for d in shown if usage.get(d) is not None]
        text = " ".join(
            f"{count(v)} tokens" if d == "tokens" and dimension is None else amount(d, v)
            for d, v in values
        )
        parts.append(f"{role} {text or '?'}")
    return " · ".join(parts)
