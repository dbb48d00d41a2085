"""The gate configuration and the gate result records (DESIGN §6); `evolane.stats` decides
with them, messages and reports carry them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evolane.messages._base import Name, Record, ShortText

GateName = Literal["paired", "bootstrap", "strict", "threshold"]
Decision = Literal["accept", "reject", "indecisive"]

MAX_CASES = 1_000_000_000
"""Upper bound of every case count in these records (they are bounded by schema, DESIGN §3)."""

MAX_VETOED_LISTED = 8
"""At most this many vetoed case ids are listed in a `GateResult` (the reason gives the count)."""


CONFIDENCE_MARGIN = 1e-6
"""``confidence`` lies in [1e-6, 1 - 1e-6]: the campaign's alpha = 1 - confidence is read as a
fraction with a denominator of at most 10^6 (`stats.as_fraction`), so a level closer to 0 or
1 rounded alpha to 1 or 0 and the online budget failed to open (found by review)."""


class GateConfig(Record):
    """How a candidate is judged against its baseline; every field has a safe default."""

    gate: GateName = "paired"
    k_se: float = Field(default=1.0, ge=0.0, le=100.0)
    min_effect: float = Field(default=0.0, gt=-1.0, lt=1.0)
    confidence: float = Field(default=0.95, ge=CONFIDENCE_MARGIN, le=1.0 - CONFIDENCE_MARGIN)
    bootstrap_samples: int = Field(default=10_000, ge=1, le=1_000_000)
    threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    no_regression: bool = False
    regression_alpha: float = Field(default=0.05, gt=0.0, le=1.0)
    pass_score: float = Field(default=1.0, ge=0.0, le=1.0)
    min_cases: int = Field(default=8, ge=1, le=MAX_CASES)
    min_coverage: float = Field(default=0.5, ge=0.0, le=1.0)
    sequential: bool = True
    sequential_alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)


class GateResult(Record):
    """The verdict on one candidate, with the evidence behind it (n, mean delta, SE, CI)."""

    gate: GateName
    n: int = Field(ge=0, le=MAX_CASES)
    n_planned: int = Field(ge=0, le=MAX_CASES)
    mean_delta: float = Field(ge=-1.0, le=1.0)
    se: float = Field(ge=0.0)
    ci_low: float = Field(ge=-1.0, le=1.0)
    ci_high: float = Field(ge=-1.0, le=1.0)
    decision: Decision
    reason: ShortText
    vetoed_cases: tuple[Name, ...] = Field(default=(), max_length=MAX_VETOED_LISTED)
