"""Messages of the campaign actor: run the cycle, and how it ended."""

from __future__ import annotations

from typing import Literal

from evolane.messages._base import ArtifactRef, Message, Text

CycleStop = Literal["finished", "budget_limited", "exhausted", "interrupted", "failed"]
"""How a campaign cycle ended."""


class RunCampaign(Message):
    """Run the campaign's cycle to its end (or its deadline); answers `CampaignDone`."""

    kind: Literal["campaign.run"] = "campaign.run"
    deadline: float | None = None  # trio clock: the wall-clock budget's end


class CampaignDone(Message):
    """How the cycle ended; everything it produced (decisions, measurements, funnel, best
    tree, scores) is one stored record, too large for a message: ``outcome`` points to it."""

    kind: Literal["campaign.done"] = "campaign.done"
    stop: CycleStop
    message: Text = ""
    outcome: ArtifactRef
