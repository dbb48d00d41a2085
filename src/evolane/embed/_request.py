"""`OptimizeRequest`: everything ``evolane optimize`` can be asked, as one pydantic model."""

from __future__ import annotations

import time

from pydantic import model_validator

from evolane.campaign._config import CampaignConfig
from evolane.campaign._run import RunRequest
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
    dry_run: bool = False

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
        config from the stored run."""
        from pathlib import Path

        from evolane.campaign._runs import StoreLayout, load_run
        from evolane.inputs import InputError

        config = self.config
        if self.resume is not None or self.from_run is not None:
            run_id = self.resume or self.from_run
            assert run_id is not None
            layout = StoreLayout(Path(store).absolute())
            try:
                stored = load_run(layout, run_id).config
            except FileNotFoundError:
                flag = "--resume" if self.resume else "--from-run"
                raise InputError(f"{flag} {run_id}: no such run in {layout.root}") from None
            update: dict[str, object] = {"store": str(layout.root)}
            if self.from_run is not None and self.judge is not None:
                update["judge"] = self.judge
            config = stored.model_copy(update=update)
        assert config is not None
        config = config.model_copy(update={"store": str(Path(store).absolute())})
        return RunRequest(
            config=config,
            resume_run=self.resume,
            resume_campaign=self.resume_campaign,
            rerun_from=self.from_run,
            dry_run=self.dry_run,
            started=started if started is not None else time.time(),
        )
