"""`OptimizeRequest`: everything ``evolane optimize`` can be asked, as one pydantic model."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import Field, ValidationError, model_validator

from evolane.campaign import CampaignConfig, ResolvedSetting, RunRequest, store_root
from evolane.inputs import InputError, first_problem
from evolane.measure import ModelSettings
from evolane.messages import Name, Record, Text


class OptimizeRequest(Record):
    """A fresh run (``config``), the next cycle of a campaign (``config`` + ``resume_campaign``),
    a resume (``resume``), or a re-evaluation (``from_run`` + ``rerun_evaluator``)."""

    config: CampaignConfig | None = None
    resume: Name | None = None
    resume_campaign: Name | None = None
    from_run: Name | None = None
    rerun_evaluator: bool = False
    judge: Text | None = None  # with from_run: the new evaluator (default: the run's own)
    models: ModelSettings | None = None
    """With from_run: the new judge's model settings (rubric, endpoint, prices); the fields
    set here replace the run's own, the others are kept."""
    max_tokens: int | None = Field(default=None, ge=0)
    """With from_run: the re-judge's token ceiling (default: the run's own)."""
    max_cost_usd: float | None = Field(default=None, ge=0)
    """With from_run: the re-judge's cost ceiling (default: the run's own)."""
    dry_run: bool = False
    settings: dict[Name, ResolvedSetting] | None = None
    """With config: the settings as resolved (value and source of each), kept in run.json."""

    @model_validator(mode="after")
    def _one_kind_of_run(self) -> OptimizeRequest:
        if self.resume is None and self.from_run is None and self.config is None:
            raise ValueError("a request needs a config (or resume= / from_run= a run id)")
        if self.from_run is not None and not self.rerun_evaluator:
            raise ValueError("from_run needs rerun_evaluator=True (re-judging is all it does)")
        if self.rerun_evaluator and self.from_run is None:
            raise ValueError("rerun_evaluator needs from_run")
        return self

    def run_request(self, store: str, started: float | None = None) -> RunRequest:
        """The campaign layer's request in ``store``; a resume or re-evaluation reads its
        config from the stored run. Raises `InputError` for a store that is not a
        directory and for a missing, unreadable or invalid ``run.json``."""
        root = store_root(Path(store))
        config = self.config
        if self.resume is not None or self.from_run is not None:
            config = self._stored_config(root)
            if self.from_run is not None and self.judge is not None:
                config = config.model_copy(update={"judge": self.judge})
            if self.from_run is not None:
                config = self._rejudge_config(config)
        assert config is not None
        config = config.model_copy(update={"store": str(root)})
        return RunRequest(
            config=config,
            resume_run=self.resume,
            resume_campaign=self.resume_campaign,
            rerun_from=self.from_run,
            dry_run=self.dry_run,
            settings=self.settings,
            started=started if started is not None else time.time(),
        )

    def _rejudge_config(self, config: CampaignConfig) -> CampaignConfig:
        """The stored ``config`` with what a re-judge set: model settings merged field by
        field, and its own ceilings."""
        update: dict[str, object] = {}
        if self.models is not None:
            given = self.models.model_dump(exclude_unset=True)
            update["models"] = ModelSettings(**{**config.models.model_dump(), **given})
        for key in ("max_tokens", "max_cost_usd"):
            if getattr(self, key) is not None:
                update[key] = getattr(self, key)
        return config.model_copy(update=update) if update else config

    def _stored_config(self, root: Path) -> CampaignConfig:
        """The config in the stored ``run.json`` of the run to resume or re-evaluate."""
        from evolane.campaign import StoreLayout, load_run

        run_id = self.resume or self.from_run
        assert run_id is not None
        flag = "--resume" if self.resume else "--from-run"
        layout = StoreLayout(root)
        path = layout.run_dir(run_id) / "run.json"
        try:
            return load_run(layout, run_id).config
        except FileNotFoundError:
            raise InputError(f"{flag} {run_id}: no such run in {layout.root}") from None
        except ValidationError as error:
            problem = first_problem(error)
            raise InputError(f"{path}: not a valid run record ({problem})") from None
        except (OSError, ValueError) as error:  # unreadable, or not JSON
            raise InputError(f"{path}: cannot read the run record ({error})") from None
