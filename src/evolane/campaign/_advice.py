"""What a refused continuation says instead: a command that will work (never a dead end)."""

from __future__ import annotations

from pathlib import Path

from evolane.campaign._lock import holder_pid

NEW_CAMPAIGN = "start a new campaign with the same flags instead"
"""The advice when a campaign cannot continue because its target, dataset, replay or judge
changed."""


def after_failure(campaign_id: str) -> str:
    """Why a failed run cannot resume, and what to run once what failed is fixed."""
    return (
        "the run failed (its report says why); fix that, then start a new campaign with the "
        "same flags "
        f"(or --resume-campaign {campaign_id} if the target, dataset, replay and judge stay "
        "the same)"
    )


def still_running(target: str, run_id: str) -> str:
    """A run another process is running: its pid when known, and how to follow it."""
    pid = holder_pid(Path(target), run_id)
    held = f" (pid {pid})" if pid else ""
    return f"the run is going on in another process{held}; follow it with `evolane watch {run_id}`"
