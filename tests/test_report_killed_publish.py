"""`evolane report` on a run killed during or after its publish says what the target holds:
the run has no report then, so only its apply journal (``apply.json``) can tell."""

from __future__ import annotations

from pathlib import Path

import orjson
import trio
from typer.testing import CliRunner

from evolane.campaign._apply import JOURNAL_NAME
from evolane.campaign._run import RunRequest, run_campaign
from evolane.campaign._runs import StoreLayout, load_run, save_run
from evolane.campaign._target import target_tree
from evolane.cli import app
from tests.campaign_helpers import publishing_config, write_toy


async def _published_then_killed(tmp_path: Path) -> tuple[StoreLayout, str, str, Path]:
    """A real publishing run, left as a SIGKILL right after the publish committed leaves it:
    no report yet and run.json still ``running``."""
    paths = write_toy(tmp_path, {"default": "fix:8"})
    with trio.fail_after(120):
        outcome = await run_campaign(RunRequest(publishing_config(paths)))
    report = outcome.report
    assert report is not None and report.apply is not None and report.apply.status == "applied"
    layout = StoreLayout(paths["store"])
    assert target_tree(layout.blobs(), paths["target"]) == report.best
    run_dir = layout.run_dir(report.run_id)
    for name in ("report.json", "report.md", "report.html"):
        (run_dir / name).unlink(missing_ok=True)
    save_run(layout, load_run(layout, report.run_id).model_copy(update={"status": "running"}))
    return layout, report.run_id, report.best.digest, run_dir


def _report(layout: StoreLayout, run_id: str, fmt: str) -> str:
    args = ["report", run_id, "--store", str(layout.root), "--format", fmt]
    done = CliRunner(env={"COLUMNS": "300"}).invoke(app, args)  # no folded cells
    assert done.exit_code == 0, done.output
    return done.stdout


async def test_a_run_killed_after_its_publish_committed_says_the_target_holds_its_best(
    tmp_path: Path,
) -> None:
    layout, run_id, best, _ = await _published_then_killed(tmp_path)
    summary = orjson.loads(_report(layout, run_id, "json"))
    assert summary["report"] is None
    assert summary["publish"].startswith(f"published {best[:19]}: the target holds it")
    text = " ".join(_report(layout, run_id, "text").replace("│", " ").split())
    assert f"publish published {best[:19]}: the target holds it" in text
    assert f"published {best[:19]}" in _report(layout, run_id, "md")


async def test_a_run_killed_mid_publish_says_the_target_may_be_half_published(
    tmp_path: Path,
) -> None:
    layout, run_id, _, run_dir = await _published_then_killed(tmp_path)
    journal = orjson.loads((run_dir / JOURNAL_NAME).read_bytes())
    journal["state"] = "swapping"  # as a kill between two swapped paths leaves it
    (run_dir / JOURNAL_NAME).write_bytes(orjson.dumps(journal))
    summary = orjson.loads(_report(layout, run_id, "json"))
    assert "interrupted in state 'swapping'" in summary["publish"]
    assert "half published" in summary["publish"]
    (run_dir / JOURNAL_NAME).write_bytes(b"{not json")
    assert "not readable" in orjson.loads(_report(layout, run_id, "json"))["publish"]


async def test_a_run_killed_before_any_publish_says_nothing_of_one(tmp_path: Path) -> None:
    layout, run_id, _, run_dir = await _published_then_killed(tmp_path)
    (run_dir / JOURNAL_NAME).unlink()
    summary = orjson.loads(_report(layout, run_id, "json"))
    assert summary["publish"] is None
    assert "publish" not in _report(layout, run_id, "text")
