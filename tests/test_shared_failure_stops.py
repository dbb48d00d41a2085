"""A measurement stopped by the host's failure ends the run ``failed``, never ``finished``.

Found by review: a replay program that vanished mid-run (an agent CLI uninstalled, a venv
rebuilt) or a lost Dask scheduler stopped the measurement as a shared failure with only a
warning; the campaign went on deciding on the pairs it had (or none), ran its finalization
on a cut-short test split and ended ``finished``, the campaign ``complete``, exit 0: the
host's breakage read as a finished search, and ``--resume-campaign`` refused a complete
campaign. Now the run ends ``failed`` (exit 1) naming the measurement and the failure, no
decision is taken on it, and ``--resume-campaign`` continues, reusing what was journaled.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.campaign_helpers import run_optimize, shared_folder, toy_flags, write_toy

_AGENT = """#!/bin/sh
umask 0
echo x >> {folder}/calls
[ "$(wc -l < {folder}/calls)" -ge {last} ] && rm -f "$0"
cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"
"""


def _report(store: Path, run_id: str) -> dict:
    return json.loads((store / "runs" / run_id / "report.json").read_text())


def _run_id(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if "(run r-" in line]
    return line.split("(run ")[1].split(",")[0]


def test_a_replay_program_gone_mid_run_fails_the_run_and_the_campaign_continues(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"})
    folder = shared_folder(tmp_path / "agent")  # the replays run as uids of their own
    agent = folder / "agent.sh"
    # 12 baseline replays, then the candidate's: the program is gone after the 18th.
    agent.write_text(_AGENT.format(folder=folder, last=18))
    agent.chmod(0o755)
    flags = toy_flags(paths, paths["store"])
    flags[flags.index("--replay") + 1] = f"{agent} {{candidate}} {{output_dir}}"
    flags += ["--isolation", "process", "--expose-rw", str(folder)]

    done = run_optimize(flags)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    first = _report(paths["store"], _run_id(done.stdout))
    assert (first["status"], first["campaign_status"]) == ("failed", "paused")
    assert "measurement c0.i0.s0 stopped: candidate replay could not start" in first["message"]
    assert "the host's failure" in done.stdout
    assert first["selected"] is None  # nothing accepted on pairs the host cut short
    assert all(d["decision"] != "accept" for d in first["decisions"]), first["decisions"]
    assert [m["status"] for m in first["measurements"]] == ["complete", "shared_failure"]
    assert "--resume-campaign" in done.stdout

    agent.write_text('#!/bin/sh\ncat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n')
    agent.chmod(0o755)
    again = run_optimize([*flags, "--resume-campaign", first["campaign_id"]])
    assert again.returncode == 0, again.stdout + again.stderr
    second = _report(paths["store"], _run_id(again.stdout))
    assert second["status"] == "finished"
    assert second["selected"] is not None  # the fix is found once the host works
    base = next(m for m in second["measurements"] if m["measurement_id"] == "c0.i0.base")
    assert (base["units_run"], base["units_reused"]) == (0, 12)  # nothing paid twice
