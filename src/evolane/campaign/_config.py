"""The frozen request of a run: every input and setting of a campaign (mirrors the CLI flags)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from evolane.messages import GateConfig, Name, Record, ShortText, Text

ApplyPolicyName = Literal["proposal", "verified_only", "auto_verified"]
Focus = Literal["all", "cyclic", "hardest-first"]
IsolationChoice = Literal["auto", "process", "namespace"]
_DAY = 86_400.0


class CampaignConfig(Record):
    """Everything a run needs; stored as ``runs/<id>/run.json`` so a resume runs the same."""

    target: Text
    dataset: Text
    store: Text = ".evolane"
    replay: Text
    judge: Text | None = None
    optimizer: Text
    validator: Text | None = None  # malformed gate: exit 0 = well formed
    check: Text | None = None  # post-apply check for auto_verified
    apply: ApplyPolicyName = "proposal"
    iterations: int = Field(default=8, ge=1, le=10_000)
    population: int = Field(default=2, ge=1, le=64)
    max_improvement_cycles: int = Field(default=1, ge=1, le=10_000)
    stall: int = Field(default=4, ge=1, le=10_000)
    replay_concurrency: int = Field(default=4, ge=1, le=256)
    judge_concurrency: int = Field(default=2, ge=1, le=256)
    optimizer_concurrency: int = Field(default=2, ge=1, le=64)
    replay_timeout: float = Field(default=600.0, gt=0, le=_DAY)
    judge_timeout: float = Field(default=120.0, gt=0, le=_DAY)
    optimizer_timeout: float = Field(default=600.0, gt=0, le=_DAY)
    optimizer_idle: float = Field(default=120.0, gt=0, le=_DAY)
    kill_grace: float = Field(default=2.0, ge=0, le=600)
    wall_clock_budget: float | None = Field(default=None, gt=0, le=365 * _DAY)
    max_tokens: int | None = Field(default=None, ge=0)
    max_cost_usd: float | None = Field(default=None, ge=0)
    baseline_replay_repetitions: int | None = Field(default=None, ge=1, le=100)
    candidate_replay_repetitions: int | None = Field(default=None, ge=1, le=100)
    judge_failure_retries: int = Field(default=2, ge=0, le=20)
    gate: GateConfig = GateConfig()
    focus: Focus = "all"
    protected: tuple[ShortText, ...] = Field(default=(), max_length=64)
    required_files: tuple[ShortText, ...] = Field(default=(), max_length=64)
    max_growth_bytes: int = Field(default=64 << 10, ge=0)
    screening: bool = False
    isolation: IsolationChoice = "auto"
    cluster: ShortText = "local"  # where replay lanes run: local | local:N | dask://HOST:PORT
    pass_env: tuple[Name, ...] = Field(default=(), max_length=64)  # variables a command may see
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    campaign_id: Name | None = None
    example: Name | None = None

    @field_validator("cluster")
    @classmethod
    def _known_cluster(cls, value: str) -> str:
        """``local``, ``local:N`` or ``dask://HOST:PORT`` (whether Dask is installed is
        checked when a run starts, so a stored run stays readable without it)."""
        from evolane.distributed import parse_cluster

        parse_cluster(value)  # a ClusterError is a ValueError: pydantic reports it
        return value

    def identity(self) -> dict[str, object]:
        """What a campaign may not change between cycles: target, dataset, replay, judge."""
        return {
            "target": self.target,
            "dataset": self.dataset,
            "replay": self.replay,
            "judge": self.judge,
        }
