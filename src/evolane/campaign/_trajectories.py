"""A campaign from trajectory files: the derived cases, fixed for the run.

A new run with ``from_trajectory`` ingests the files (`evolane.inputs.ingest_trajectories`)
and stores the chosen group's cases content-addressed as
``STORE/trajectories/<hex of the dataset digest>/cases.jsonl`` (with ``summary.json``
beside it); the run's ``dataset`` names that file. A ``--resume`` reads ``run.json``, so it
replays exactly those cases even when the trajectory files have changed or are gone.
"""

from __future__ import annotations

from pathlib import Path

from evolane.campaign._config import CampaignConfig
from evolane.campaign._containment import check_inputs_outside_target
from evolane.campaign._leaks import check_target_copies_no_trajectory
from evolane.inputs import InputError, TrajectorySummary, ingest_trajectories, trajectory_files
from evolane.store import read_json, write_bytes_atomic, write_json_atomic

CASES_FILE = "cases.jsonl"
SUMMARY_FILE = "summary.json"


def with_trajectory_cases(config: CampaignConfig) -> CampaignConfig:
    """``config`` with ``dataset`` set to the stored cases derived from its trajectories
    (as given when it has none); `InputError` for both or a bad trajectory."""
    if not config.from_trajectory:
        return config
    if config.dataset:
        raise InputError("--dataset and --from-trajectory: give one of them, not both")
    walked = trajectory_files(config.from_trajectory)  # before anything of them is stored
    check_inputs_outside_target(config, walked)
    check_target_copies_no_trajectory(Path(config.target), walked)
    derived = ingest_trajectories(config.from_trajectory, group=config.group, seed=config.seed)
    folder = Path(config.store) / "trajectories" / derived.dataset.digest.removeprefix("sha256:")
    folder.mkdir(parents=True, exist_ok=True)
    cases = folder / CASES_FILE
    if not cases.is_file():  # content-addressed: an existing file holds the same bytes
        write_bytes_atomic(cases, derived.dataset.canonical_jsonl())
    write_json_atomic(folder / SUMMARY_FILE, derived.summary)
    return config.model_copy(update={"dataset": str(cases.absolute())})


def trajectory_summary(config: CampaignConfig) -> TrajectorySummary | None:
    """The ingestion summary stored beside a run's derived cases (None: not a run from
    trajectories, or the summary is unreadable)."""
    if not config.from_trajectory or not config.dataset:
        return None
    try:
        data = read_json(Path(config.dataset).with_name(SUMMARY_FILE))
        return TrajectorySummary.model_validate(data)
    except (OSError, ValueError):
        return None


def trajectory_note(config: CampaignConfig) -> str | None:
    """One line for the estimate: the group the cases come from, why, and how many turns
    were excluded (None when the run is not from trajectories)."""
    summary = trajectory_summary(config)
    if summary is None:
        return None
    excluded = sum(1 for item in summary.excluded if item.group == summary.chosen)
    left_out = f"; {excluded} turns left out (context_incomplete)" if excluded else ""
    repeats = len(summary.repeats) + summary.omitted.get("repeats", 0)
    if repeats:
        left_out += f"; {repeats} left out (the same input as an earlier case)"
    shared = len(summary.shared) + summary.omitted.get("shared", 0)
    if shared:
        left_out += f"; {shared} left out (a stock opening of many conversations)"
    return f"trajectories: group {summary.chosen}: {summary.choice}{left_out}"
