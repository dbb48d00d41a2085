"""What earlier runs of the store say a replay unit costs: the estimate's history."""

from __future__ import annotations

from evolane.campaign._config import CampaignConfig
from evolane.campaign._estimate import UnitHistory, per_unit_by_role
from evolane.campaign._runs import StoreLayout
from evolane.store import read_json

HISTORY_RUNS = 16
"""The newest runs a start reads for a comparable report (all of them: 15 s in 3,000 runs)."""


def unit_history(layout: StoreLayout, config: CampaignConfig) -> UnitHistory | None:
    """Typical seconds (and usage) per replay unit from the newest comparable report among
    the newest `HISTORY_RUNS` runs: its last session's wall over the units it ran, the run's
    spend over the units of every session (a resumed run's journal restored the others)."""
    for run_id in reversed(layout.run_ids()[-HISTORY_RUNS:]):
        path = layout.run_dir(run_id) / "report.json"
        try:
            report = read_json(path)
        except (OSError, ValueError):
            continue
        if report.get("config", {}).get("replay") != config.measure.replay:
            continue
        units = sum(m.get("units_run", 0) for m in report.get("measurements", []))
        if not units or report.get("budget", {}).get("cached"):
            continue  # a run answered from the response cache spent less than a real one
        spent = report.get("budget", {}).get("spent", {})
        tokens, cost = spent.get("tokens"), spent.get("cost_usd")
        paid = units + sum(m.get("units_restored", 0) for m in report.get("measurements", []))
        return UnitHistory(
            seconds=report["wall_seconds"] * report["config"].get("replay_concurrency", 1) / units,
            tokens=tokens / paid if tokens else None,
            cost_usd=cost / paid if cost else None,
            by_role=per_unit_by_role(report, paid, config),
        )
    return None
