"""Found by review: a confined replay on a Dask worker saw the scratch space of every worker
of the run (the other units' folders, live: their cases, candidates and outputs) and the
scheduler's folder in /tmp. Each Dask server puts its local directory on ``sys.path``, a
worker process inherits its parent's, and a confined command is shown the folders on
``sys.path``; the driver's own optimizer and judges were shown them too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

pytest.importorskip("distributed")

from evolane.inputs import ModelPrice, PriceTable
from evolane.lanes import LaneSettings
from evolane.sandbox import View
from evolane.sandbox._confine import confinement_problem, interpreter_folders
from evolane.store import snapshot_tree
from tests.test_distributed import cluster_for, lane, output_of, replay_job, run

LOOK = """
import json, os, sys
scratch, out = sys.argv[1], sys.argv[2]
seen = {"workers": sorted(os.listdir(scratch)), "tmp": os.listdir("/tmp")}
json.dump(seen, open(os.path.join(out, "output.json"), "w"))
"""


def confined(command: str, shown: Path) -> LaneSettings:
    settings = lane(command)
    view = View(read_only=(str(shown),))
    return LaneSettings(template=settings.template, kill_grace=0.3, isolation="confined", view=view)


@pytest.mark.skipif(confinement_problem() is not None, reason="needs bubblewrap")
async def test_a_confined_replay_on_a_worker_sees_no_other_workers_units(tmp_path: Path) -> None:
    async with cluster_for(tmp_path, "local:2") as (_host, store, cluster):
        assert cluster.directory is not None
        scratch = cluster.directory / "dask-scratch-space"
        assert (
            len([p for p in scratch.iterdir() if p.is_dir() and p.name.startswith("worker-")]) == 2
        )
        shown = interpreter_folders()  # what the driver's confined commands are shown
        folder = tmp_path / "bin"
        folder.mkdir()
        (folder / "look.py").write_text(LOOK)
        command = f"{sys.executable} {folder / 'look.py'} {scratch} {{output_dir}}"
        seen = await output_of(cluster, store, tmp_path, confined(command, folder))
    workers = [name for name in seen["workers"] if name.startswith("worker-") and "." not in name]
    assert len(workers) == 1, seen  # its own worker's folder (its unit's mount point)
    assert "dask-scratch-space" not in seen["tmp"], seen  # the scheduler's folder
    assert not any("dask-scratch-space" in folder for folder in shown), shown


async def test_a_remote_replays_usage_is_priced_by_the_runs_table(tmp_path: Path) -> None:
    # Found by review: the worker stored a replay's result without the run's price table, so
    # a usage document's tokens cost $0 on Dask ($56 on local lanes for the same replays),
    # and --max-cost-usd never stopped such a run.
    script = tmp_path / "usage.sh"
    script.write_text(
        """echo '{"model": "m1", "input_tokens": 100000, "output_tokens": 100000}' """
        '> "$1/usage.json"\n'
        'echo 1 > "$1/output.json"\n'
    )
    settings = lane(f"sh {script} {{output_dir}}")
    prices = PriceTable(models={"m1": ModelPrice(input=10, output=30)})
    settings = LaneSettings(template=settings.template, kill_grace=0.3, prices=prices)
    async with cluster_for(tmp_path, "local:1") as (_host, store, cluster):
        with trio.fail_after(90):
            result = await run(cluster, replay_job(store, tmp_path, timeout=80), settings)
    assert result.status == "succeeded", result
    assert result.usage.tokens == 200_000
    assert result.usage.cost_usd == pytest.approx(4.0)  # 0.1M x $10 + 0.1M x $30


@pytest.mark.parametrize("isolation", ["process", "auto"])
async def test_a_candidate_that_breaks_its_program_fails_on_a_worker_as_on_a_local_lane(
    tmp_path: Path, isolation: str
) -> None:
    # Found by review: a worker stored a replay whose candidate dropped the executable bit
    # of its own run.sh as spawn_failed, an infrastructure failure: the measurement stopped
    # indecisive where a local lane rejects the candidate (program_unrunnable, its cases 0).
    store_root = tmp_path / "run"
    store_root.mkdir()
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "run.sh").write_text('#!/bin/sh\necho 1 > "$1/output.json"\n')
    (tree / "run.sh").chmod(0o644)
    template = lane("{candidate}/run.sh {output_dir}").template
    mode = "confined" if isolation == "auto" and confinement_problem() is None else "process"
    settings = LaneSettings(template=template, kill_grace=0.3, isolation=mode)
    async with cluster_for(store_root, "local:1") as (_host, store, cluster):
        job = replay_job(store, store_root, timeout=80)
        job = job.model_copy(update={"tree_ref": snapshot_tree(store, tree)})
        with trio.fail_after(90):
            result = await run(cluster, job, settings)
    assert result.status == "failed", result
    assert result.failure is not None
    assert (result.failure.owner, result.failure.code) == ("candidate", "program_unrunnable")
