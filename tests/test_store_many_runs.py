"""A store that holds many runs: what a start and a listing read of them stays bounded (found
by soak review: a start read every report in the store, 15 s in a store of 3,000 runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evolane.campaign import _prepare
from evolane.campaign._prepare import HISTORY_RUNS, prepare_run
from tests.campaign_helpers import toy_config, write_toy


def _earlier_runs(store: Path, count: int, replay: str) -> None:
    """``count`` finished runs of an agent with the ``replay`` command (a report each)."""
    for index in range(count):
        folder = store / "runs" / f"r-20260101-{index:06d}-aaaaaa"
        folder.mkdir(parents=True)
        (folder / "run.json").write_text("{}")
        report = {
            "config": {"replay": replay, "replay_concurrency": 1},
            "measurements": [{"units_run": 10}],
            "wall_seconds": 5.0,
            "budget": {"spent": {}},
        }
        (folder / "report.json").write_text(json.dumps(report))


def _reports_read(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The report.json files a start reads from here on (read for real)."""
    seen: list[Path] = []
    real = _prepare.read_json

    def spy(path: Path, *args: Any, **kwargs: Any) -> Any:
        if Path(path).name == "report.json":
            seen.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_prepare, "read_json", spy)
    return seen


def test_a_start_reads_a_bounded_number_of_earlier_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    config = toy_config(paths, iterations=1, population=1)
    _earlier_runs(paths["store"], HISTORY_RUNS * 3, replay="another agent's replay")
    seen = _reports_read(monkeypatch)
    prepared = prepare_run(config)
    assert prepared.estimate.basis and "earlier runs" not in prepared.estimate.basis
    assert 0 < len(seen) <= HISTORY_RUNS


def test_a_start_still_takes_the_newest_comparable_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    config = toy_config(paths, iterations=1, population=1)
    _earlier_runs(paths["store"], HISTORY_RUNS // 2, replay=config.measure.replay)
    seen = _reports_read(monkeypatch)
    prepared = prepare_run(config)
    assert "typical unit 0.50 s from earlier runs" in prepared.estimate.basis
    assert len(seen) == 1
